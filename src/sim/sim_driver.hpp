// The host simulator's driver table (see driver/entry_points.hpp for the contract).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "driver/driver.hpp"

namespace gpumem::detail {

// Builds the simulator on first call (reading GPUMEM_SIM_* from the environment)
// and returns its table, kind == backend_kind::sim. Throws gpumem::logic_error
// for a malformed GPUMEM_SIM_* setting.
const driver_api& sim_driver_table();

// How many times the simulator's table has been called through `entry_point`
// (spelled as in entry_points.hpp, e.g. "cuStreamWaitEvent"); nullopt for a
// name that is not an entry point.
std::optional<std::uint64_t> sim_driver_calls(std::string_view entry_point) noexcept;

}  // namespace gpumem::detail
