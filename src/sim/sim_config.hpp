// Simulator configuration: the GPUMEM_SIM_* environment variables, parsed and
// validated once, when the simulator is first used.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace gpumem::detail::simulator {

struct sim_config {
  int device_count = 2;                             // GPUMEM_SIM_DEVICES, 1..64
  std::size_t memory_per_device = std::size_t{8} << 30;  // GPUMEM_SIM_MEMORY
  std::uint64_t fail_nth_allocation = 0;            // GPUMEM_SIM_FAIL_ALLOC, 0 = off
  double fail_probability = 0.0;                    // GPUMEM_SIM_FAIL_RANDOM, 0..1
  std::uint64_t seed = 1;                           // GPUMEM_SIM_SEED
  bool peer_access = true;                          // GPUMEM_SIM_PEER_ACCESS, 0 or 1
};

inline constexpr int max_sim_devices = 64;

// Reads the GPUMEM_SIM_* variables; unset or empty ones keep their defaults.
// Throws gpumem::logic_error naming the variable and the value for a malformed one.
sim_config read_config_from_environment();

}  // namespace gpumem::detail::simulator
