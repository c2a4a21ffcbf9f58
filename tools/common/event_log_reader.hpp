// Reading gpumem's CSV event log (docs/observability.md, "The log format"): the
// input of gpumem-replay and gpumem-report.
#pragma once

#include <cstdint>
#include <istream>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpumem::tools {

struct logged_event {
  std::uint64_t seq = 0;
  std::uint64_t time_ns = 0;
  std::uint32_t thread = 0;
  int device = 0;
  std::uint64_t stream = 0;
  std::string source;
  bool allocate = true;  // else deallocate
  std::uint64_t ptr = 0;
  std::uint64_t bytes = 0;
  std::uint64_t alignment = 256;
  std::string outcome;   // ok, oom, logic_error, cuda_error, error
  std::string site;
  std::size_t line = 0;  // in the file, for messages
  bool ok() const { return outcome == "ok"; }
};

// Thrown for a file that is missing or not a gpumem log: says the file, the line
// and what is wrong.
class log_format_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The log's events in seq order. Columns are found by the header's names, so
// columns added by later versions are ignored; seq, op, ptr and bytes are
// required, the others have defaults (time 0, thread 1, stream 0x0, source
// "app", alignment 256, outcome ok, no site).
std::vector<logged_event> read_event_log(const std::string& path);
// The same from a stream; `name` stands for the file in messages.
std::vector<logged_event> read_event_log(std::istream& in, const std::string& name);

// Splits one CSV line (RFC 4180 quoting).
std::vector<std::string> split_csv(const std::string& line);

// "1.50 MiB".
std::string human_bytes(double bytes);

}  // namespace gpumem::tools
