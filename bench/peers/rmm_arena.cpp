// Peers "RMM arena" and "RMM arena (free memory)": rmm::mr::arena_memory_resource
// over cuda_memory_resource, with its default global arena (half of the free
// device memory) and with one sized to the free memory. The arena takes its
// whole global arena from the upstream at construction; cudaMalloc of every
// free byte can fail by a sliver, so the sized row steps down (99%, 98%, 95%,
// 90%) until one fits.
#include <rmm/aligned.hpp>
#include <rmm/cuda_device.hpp>
#include <rmm/mr/arena_memory_resource.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>

#include <new>
#include <optional>

#include "peers/rmm_peer.hpp"

namespace gpumem::bench::rmm_peers {

plugin::allocator* make_arena(int device, bool sized_to_free_memory) {
  use_device(device);
  if (!sized_to_free_memory) {
    rmm::mr::arena_memory_resource arena{rmm::mr::cuda_memory_resource{}};
    return new rmm_allocator<rmm::mr::arena_memory_resource>(std::move(arena));
  }
  const std::size_t free_bytes = rmm::available_device_memory().first;
  constexpr std::size_t granule = std::size_t{2} << 20;
  for (int percent : {100, 99, 98, 95, 90}) {
    const std::size_t size = free_bytes / 100 * static_cast<std::size_t>(percent) / granule * granule;
    try {
      rmm::mr::arena_memory_resource arena{rmm::mr::cuda_memory_resource{}, size};
      return new rmm_allocator<rmm::mr::arena_memory_resource>(std::move(arena));
    } catch (const std::bad_alloc&) {
      if (percent == 90) throw;
    }
  }
  return nullptr;  // not reached
}

}  // namespace gpumem::bench::rmm_peers
