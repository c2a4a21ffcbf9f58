// Peers: other allocators, wrapped as thin memory_resources so that every row of
// a table runs the same workload code. A peer adds nothing of gpumem's: no
// bookkeeping, no locks, no checks beyond memory_resource's own, so its row
// measures the allocator it names.
#pragma once

#include <cstddef>
#include <memory>

#include "gpumem/memory_resource.hpp"

namespace gpumem::bench::peers {

// cuMemAlloc / cuMemFree: what cudaMalloc / cudaFree cost (raw_cumemalloc.cpp).
std::shared_ptr<memory_resource> make_raw_cumemalloc(int device);

// cuMemAllocAsync / cuMemFreeAsync on the device's default pool, release
// threshold UINT64_MAX (raw_cumemallocasync.cpp).
std::shared_ptr<memory_resource> make_raw_cumemallocasync(int device);

// std::malloc / std::free on the host, whatever `device` is: the reference row
// (malloc_reference.cpp), not a peer.
std::shared_ptr<memory_resource> make_malloc_reference(int device);

// Makes `device`'s primary context current on the calling thread unless this
// thread already did so, as the CUDA runtime does once per thread: the raw
// driver calls need a current context, and a per-call cuCtxGetCurrent would be
// a cost the runtime does not pay. The bench never switches contexts behind it.
void ensure_current_device(int device);

// The raw driver allocators promise 256-byte alignment and no more; a larger
// request is a misuse (gpumem::logic_error), not something to pad silently.
void require_driver_alignment(std::size_t alignment, const char* peer);

}  // namespace gpumem::bench::peers
