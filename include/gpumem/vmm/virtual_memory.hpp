// gpumem's virtual-memory building blocks that programs may call directly
// (docs/vmm.md). growable_buffer, device_vector and vmm_pool_resource use them.
#pragma once

#include <cstddef>

#include "gpumem/export.hpp"

namespace gpumem::vmm {

// Whether `device` supports virtual memory management (cuMemCreate/cuMemMap...).
GPUMEM_EXPORT bool supported(int device);
// The device's allocation granularity: the unit of reserve, map and physical handles.
GPUMEM_EXPORT std::size_t granularity(int device);
// Runs the unmaps and releases that destroyed or shrunk buffers queued behind
// their streams' work: those whose work is complete, or, with wait, all of them
// after waiting for that work (never a device-wide synchronisation). Returns how many ran.
GPUMEM_EXPORT std::size_t reclaim(bool wait = false);

}  // namespace gpumem::vmm
