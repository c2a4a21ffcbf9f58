// Peer "RMM binning": rmm::mr::binning_memory_resource with fixed-size bins of
// 2^18..2^22 bytes (256 KiB to 4 MiB) over a pool like the "RMM pool" row's
// (initial size half of the free memory, no maximum); requests outside the bins
// go to that pool.
#include <rmm/cuda_device.hpp>
#include <rmm/mr/binning_memory_resource.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>

#include <optional>

#include "peers/rmm_peer.hpp"

namespace gpumem::bench::rmm_peers {

plugin::allocator* make_binning(int device) {
  use_device(device);
  rmm::mr::pool_memory_resource pool{rmm::mr::cuda_memory_resource{},
                                     rmm::percent_of_free_device_memory(50), std::nullopt};
  // The binning resource holds a shared reference to the pool (resources are
  // shared handles in RMM 26): the pool lives as long as the bins.
  rmm::mr::binning_memory_resource binning{pool, 18, 22};
  return new rmm_allocator<rmm::mr::binning_memory_resource>(std::move(binning));
}

}  // namespace gpumem::bench::rmm_peers
