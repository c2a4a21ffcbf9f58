// RMM's resources as gpumem-bench peers (the plugin libgpumem-bench-rmm.so,
// plugin_api.hpp), built only against RMM's headers and library: the librmm
// wheel from PyPI, unpacked (docs/benchmarks.md). One resource a file:
// rmm_pool.cpp, rmm_arena.cpp, rmm_binning.cpp, rmm_cuda_async.cpp; the entry
// point and the row table are in rmm_plugin.cpp.
//
// The configurations are docs/benchmarks-method.md's: pool with an initial size of half the
// free memory and no maximum; arena at its default size (half the free memory)
// and sized to the free memory; binning with bins 2^18..2^22 over such a pool;
// cuda_async at its defaults (release threshold: keep everything).
#pragma once

#include <cuda_runtime_api.h>

#include <cuda/stream_ref>

#include <cstddef>
#include <memory>
#include <utility>

#include "peers/plugin_api.hpp"

namespace gpumem::bench::rmm_peers {

// One RMM resource (a cuda::mr resource: allocate and deallocate take the
// stream first) behind the plugin interface. RMM's errors pass through:
// rmm::out_of_memory and rmm::bad_alloc are std::bad_alloc, which the bench
// counts as running out of memory; the rest are other std::exceptions.
template <class Resource>
class rmm_allocator final : public plugin::allocator {
 public:
  explicit rmm_allocator(Resource resource) : resource_(std::move(resource)) {}

  void* allocate(std::size_t bytes, void* stream, std::size_t alignment) override {
    return resource_.allocate(view(stream), bytes, alignment);
  }

  void deallocate(void* ptr, std::size_t bytes, void* stream, std::size_t alignment) override {
    resource_.deallocate(view(stream), ptr, bytes, alignment);
  }

  // RMM's pool, arena, binning and cuda_async resources lock what they share.
  bool thread_safe() const noexcept override { return true; }

 private:
  static cuda::stream_ref view(void* stream) noexcept {
    return cuda::stream_ref{static_cast<cudaStream_t>(stream)};
  }

  Resource resource_;
};

// Makes `device` current for the CUDA runtime (RMM sizes and places pools on
// the current device).
void use_device(int device);

plugin::allocator* make_pool(int device);
plugin::allocator* make_arena(int device, bool sized_to_free_memory);
plugin::allocator* make_binning(int device);
plugin::allocator* make_cuda_async(int device);

}  // namespace gpumem::bench::rmm_peers
