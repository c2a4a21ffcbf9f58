// The CSV event log's rows (docs/observability.md, "The log format"): the one
// place that writes them, for the logging adaptor and tracking snapshots.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

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

}  // namespace gpumem::detail
