// libFuzzer target: the CSV event log reader of gpumem-replay and gpumem-report
// (tools/common/event_log_reader.hpp). Whatever the bytes, the reader gives events
// or log_format_error, and the events it gives keep the format's promises.
// Built by scripts/fuzz.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "common/event_log_reader.hpp"

namespace {

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "event log reader invariant broken: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  try {
    const auto events = gpumem::tools::read_event_log(in, "fuzz.csv");
    if (events.empty()) broken("no events and no error");
    for (std::size_t k = 0; k < events.size(); ++k) {
      const auto& e = events[k];
      if (e.seq == 0 || e.seq >= (std::uint64_t{1} << 63)) broken("seq outside [1, 2^63)");
      if (k > 0 && e.seq <= events[k - 1].seq) broken("seq not strictly increasing");
      if (e.alignment == 0 || (e.alignment & (e.alignment - 1)) != 0) broken("an alignment that is not a power of two");
      if (e.ok() && e.allocate && e.bytes == 0) broken("a successful allocation of 0 bytes");
      if (e.ok() && e.bytes >= (std::uint64_t{1} << 62)) broken("a successful request of 2^62 bytes or more");
    }
  } catch (const gpumem::tools::log_format_error&) {
  }
  return 0;
}
