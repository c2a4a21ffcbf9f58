// Peer "RMM pool": rmm::mr::pool_memory_resource over cuda_memory_resource
// (cudaMalloc), initial size half of the free device memory, no maximum: the
// configuration RMM's documentation suggests and docs/benchmarks-method.md measures.
#include <rmm/cuda_device.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>

#include <optional>

#include "peers/rmm_peer.hpp"

namespace gpumem::bench::rmm_peers {

plugin::allocator* make_pool(int device) {
  use_device(device);
  rmm::mr::pool_memory_resource pool{rmm::mr::cuda_memory_resource{},
                                     rmm::percent_of_free_device_memory(50), std::nullopt};
  return new rmm_allocator<rmm::mr::pool_memory_resource>(std::move(pool));
}

}  // namespace gpumem::bench::rmm_peers
