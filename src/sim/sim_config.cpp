// Simulator configuration: parsing of the GPUMEM_SIM_* environment variables.
#include "sim/sim_config.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include "gpumem/error.hpp"
#include "text.hpp"

namespace gpumem::detail::simulator {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// The whole of `text` must be one unsigned decimal number.
template <class Unsigned>
std::optional<Unsigned> parse_unsigned(std::string_view text) {
  text = trim(text);
  Unsigned value{};
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::optional<double> parse_probability(std::string_view text) {
  text = trim(text);
  double value = 0.0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  if (!(value >= 0.0 && value <= 1.0)) return std::nullopt;  // also rejects NaN
  return value;
}

[[noreturn]] void throw_malformed(const char* variable, std::string_view value, const char* expected) {
  throw logic_error(std::string("gpumem simulator: ") + variable + "='" + std::string(value) +
                    "' is not valid: expected " + expected);
}

// The variable's value, or nullopt when it is unset or empty (keep the default).
std::optional<std::string_view> environment(const char* variable) {
  const char* value = std::getenv(variable);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string_view(value);
}

}  // namespace

sim_config read_config_from_environment() {
  sim_config config;
  if (auto value = environment("GPUMEM_SIM_DEVICES")) {
    auto n = parse_unsigned<unsigned>(*value);
    if (!n || *n < 1 || *n > static_cast<unsigned>(max_sim_devices)) {
      throw_malformed("GPUMEM_SIM_DEVICES", *value, "a device count from 1 to 64");
    }
    config.device_count = static_cast<int>(*n);
  }
  if (auto value = environment("GPUMEM_SIM_MEMORY")) {
    auto bytes = detail::parse_byte_size(*value);
    if (!bytes || *bytes == 0) {
      throw_malformed("GPUMEM_SIM_MEMORY", *value,
                      "a non-zero byte count such as 8589934592, 512M or 8GiB "
                      "(suffixes K/M/G/T or KiB/MiB/GiB/TiB, powers of 1024)");
    }
    config.memory_per_device = *bytes;
  }
  if (auto value = environment("GPUMEM_SIM_FAIL_ALLOC")) {
    auto n = parse_unsigned<std::uint64_t>(*value);
    if (!n) throw_malformed("GPUMEM_SIM_FAIL_ALLOC", *value, "an allocation count n >= 0 (0 = off)");
    config.fail_nth_allocation = *n;
  }
  if (auto value = environment("GPUMEM_SIM_FAIL_RANDOM")) {
    auto p = parse_probability(*value);
    if (!p) throw_malformed("GPUMEM_SIM_FAIL_RANDOM", *value, "a probability from 0 to 1");
    config.fail_probability = *p;
  }
  if (auto value = environment("GPUMEM_SIM_SEED")) {
    auto seed = parse_unsigned<std::uint64_t>(*value);
    if (!seed) throw_malformed("GPUMEM_SIM_SEED", *value, "an unsigned 64-bit integer");
    config.seed = *seed;
  }
  if (auto value = environment("GPUMEM_SIM_PEER_ACCESS")) {
    auto on = parse_unsigned<unsigned>(*value);
    if (!on || *on > 1) throw_malformed("GPUMEM_SIM_PEER_ACCESS", *value, "0 or 1");
    config.peer_access = *on == 1;
  }
  return config;
}

}  // namespace gpumem::detail::simulator
