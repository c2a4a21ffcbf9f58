// Device memory across all simulated devices: allocation with fault injection,
// pointer lookup and the bounds rule for copies.
#pragma once

#include <cstddef>
#include <optional>

#include <cuda.h>

#include "sim/sim_address_space.hpp"

namespace gpumem::detail::simulator {

class sim_state;
struct sim_device;

// cuMemAlloc and cuMemAllocManaged share this: CUDA_ERROR_INVALID_VALUE for 0
// bytes or a null output, then fault injection, then the device's capacity.
CUresult allocate_device_memory(sim_state& state, sim_device& device, std::size_t bytes,
                                allocation_kind kind, CUdeviceptr* out, unsigned attach = 0);

// The live allocation containing `pointer`, on any device.
std::optional<allocation> find_allocation(sim_state& state, CUdeviceptr pointer);

// The bounds rule for memcpy/memset: a range that touches any device's reserved
// address range must lie entirely inside one live allocation whose free is not
// queued; other (host) ranges are accepted as they are, as with unified
// addressing. CUDA_ERROR_INVALID_VALUE otherwise, and for a range that wraps.
CUresult check_access(sim_state& state, CUdeviceptr pointer, std::size_t bytes);

}  // namespace gpumem::detail::simulator
