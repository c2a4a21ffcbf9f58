// Text helpers for messages and reports (text.hpp).
#include "text.hpp"

#include <cstdio>

namespace gpumem::detail {

std::string human_bytes(std::size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%zu B", bytes);
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

std::string hex_pointer(std::uintptr_t value) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(value));
  return buf;
}

std::string human_duration_ns(std::uint64_t ns) {
  char buf[32];
  const double v = static_cast<double>(ns);
  if (ns < 1000) std::snprintf(buf, sizeof buf, "%llu ns", static_cast<unsigned long long>(ns));
  else if (ns < 1000000) std::snprintf(buf, sizeof buf, "%.1f us", v / 1e3);
  else if (ns < 1000000000) std::snprintf(buf, sizeof buf, "%.1f ms", v / 1e6);
  else std::snprintf(buf, sizeof buf, "%.2f s", v / 1e9);
  return buf;
}

}  // namespace gpumem::detail
