// Peer "RMM cuda_async": rmm::mr::cuda_async_memory_resource at its defaults: a
// pool of its own (cudaMemPoolCreate) with the release threshold at the largest
// value, so it keeps what it was given (RMM's default), and cudaMallocAsync /
// cudaFreeAsync per call.
#include <rmm/mr/cuda_async_memory_resource.hpp>

#include "peers/rmm_peer.hpp"

namespace gpumem::bench::rmm_peers {

plugin::allocator* make_cuda_async(int device) {
  use_device(device);
  rmm::mr::cuda_async_memory_resource async{};
  return new rmm_allocator<rmm::mr::cuda_async_memory_resource>(std::move(async));
}

}  // namespace gpumem::bench::rmm_peers
