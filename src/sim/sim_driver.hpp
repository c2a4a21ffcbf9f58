// The host simulator's driver table (see driver/entry_points.hpp for the contract).
#pragma once

#include "driver/driver.hpp"

namespace gpumem::detail {

// Builds the simulator on first call (reading GPUMEM_SIM_* from the environment)
// and returns its table, kind == backend_kind::sim. Throws gpumem::logic_error
// for a malformed GPUMEM_SIM_* setting.
const driver_api& sim_driver_table();

}  // namespace gpumem::detail
