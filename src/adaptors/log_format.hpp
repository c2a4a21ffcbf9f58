// The CSV event log's rows (docs/observability.md, "The log format"): the one
// place that writes them, for the logging adaptor and tracking snapshots, and
// the one that splits them again (gpumem-replay, gpumem-report, the tests).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gpumem::detail {

enum class log_op : std::uint8_t { allocate, deallocate };
enum class log_outcome : std::uint8_t { ok, oom, logic_error, cuda_error, error };

// The header line, without the newline.
inline constexpr std::string_view log_header =
    "seq,time_ns,thread,device,stream,source,op,ptr,bytes,alignment,outcome,site";

struct log_row {
  std::uint64_t seq = 0;
  std::uint64_t time_ns = 0;
  std::uint32_t thread = 0;
  int device = 0;
  std::uintptr_t stream = 0;
  std::string_view source;
  log_op op = log_op::allocate;
  std::uintptr_t ptr = 0;
  std::uint64_t bytes = 0;
  std::uint64_t alignment = 0;
  log_outcome outcome = log_outcome::ok;
  std::string_view site;  // quoted as CSV needs
};

// Appends the row and a newline.
void append_log_row(std::string& out, const log_row& row);

const char* to_string(log_outcome o) noexcept;

// The fields of one CSV line as append_log_row writes them: commas separate,
// double quotes quote, "" inside quotes is a quote; a trailing CR is dropped.
inline std::vector<std::string> split_log_fields(std::string_view line) {
  std::vector<std::string> out;
  std::string field;
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        field.push_back('"');
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        field.push_back(c);
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.push_back(std::move(field));
      field.clear();
    } else if (c != '\r') {
      field.push_back(c);
    }
  }
  out.push_back(std::move(field));
  return out;
}

}  // namespace gpumem::detail
