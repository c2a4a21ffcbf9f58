// Text helpers for messages and reports (text.hpp).
#include "text.hpp"

#include <cctype>
#include <cstdio>
#include <limits>

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

std::optional<std::size_t> parse_byte_size(std::string_view text) {
  auto blank = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!text.empty() && blank(text.front())) text.remove_prefix(1);
  while (!text.empty() && blank(text.back())) text.remove_suffix(1);
  std::size_t digits = 0;
  std::uint64_t n = 0;
  for (; digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits])) != 0; ++digits) {
    const auto d = static_cast<std::uint64_t>(text[digits] - '0');
    if (n > (std::numeric_limits<std::uint64_t>::max() - d) / 10) return std::nullopt;
    n = n * 10 + d;
  }
  if (digits == 0) return std::nullopt;
  std::string unit;
  for (char c : text.substr(digits)) {
    if (!blank(c)) unit += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  int shift = -1;
  if (unit.empty() || unit == "b") shift = 0;
  else if (unit == "k" || unit == "kb" || unit == "kib") shift = 10;
  else if (unit == "m" || unit == "mb" || unit == "mib") shift = 20;
  else if (unit == "g" || unit == "gb" || unit == "gib") shift = 30;
  else if (unit == "t" || unit == "tb" || unit == "tib") shift = 40;
  if (shift < 0) return std::nullopt;
  if (n > (std::numeric_limits<std::size_t>::max() >> shift)) return std::nullopt;
  return static_cast<std::size_t>(n) << shift;
}

}  // namespace gpumem::detail
