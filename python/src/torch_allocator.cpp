// libgpumem_torch.so: the C entry points torch.cuda.memory.CUDAPluggableAllocator
// loads (gpumem.torch.use_gpumem_for_torch installs them).
//
//   void* gpumem_torch_alloc(size_t size, int device, cudaStream_t stream);
//   void  gpumem_torch_free(void* ptr, size_t size, int device, cudaStream_t stream);
//
// Allocation comes from the current gpumem resource of `device`, on the stream
// PyTorch passes (its current stream); the free goes, on the stream PyTorch
// passes back, to the resource that made the allocation, even if the current
// resource has changed since. A size of 0 gives a null pointer and allocates
// nothing, as PyTorch's own allocator does; freeing null does nothing.
//
// Errors: an allocation that fails throws the gpumem C++ error (out_of_memory is
// a std::bad_alloc) through PyTorch, which raises it in Python as an exception
// carrying gpumem's message. A free must not throw (PyTorch calls it from
// destructors): a failure is reported on stderr and the memory stays with the
// resource.
#include <cstddef>
#include <cstdio>
#include <memory>
#include <mutex>
#include <unordered_map>

#include <cuda.h>

#include "gpumem/current_resource.hpp"
#include "gpumem/export.hpp"
#include "gpumem/memory_resource.hpp"

namespace {

struct live_allocations {
  std::mutex mutex;
  std::unordered_map<void*, std::shared_ptr<gpumem::memory_resource>> owner;
};

// Leaked on purpose: PyTorch frees tensors during interpreter teardown, after
// static destructors may have run.
live_allocations& live() {
  static auto* l = new live_allocations;
  return *l;
}

}  // namespace

extern "C" {

GPUMEM_EXPORT void* gpumem_torch_alloc(std::size_t size, int device, CUstream stream) {
  if (size == 0) return nullptr;
  std::shared_ptr<gpumem::memory_resource> r = gpumem::get_current_resource(device);
  void* p = r->allocate(size, stream);
  try {
    live_allocations& l = live();
    std::lock_guard lock(l.mutex);
    l.owner.emplace(p, r);
  } catch (...) {
    r->deallocate(p, size, stream);
    throw;
  }
  return p;
}

GPUMEM_EXPORT void gpumem_torch_free(void* ptr, std::size_t size, int device, CUstream stream) {
  if (ptr == nullptr) return;
  try {
    std::shared_ptr<gpumem::memory_resource> r;
    {
      live_allocations& l = live();
      std::lock_guard lock(l.mutex);
      auto it = l.owner.find(ptr);
      if (it != l.owner.end()) {
        r = std::move(it->second);
        l.owner.erase(it);
      }
    }
    if (!r) r = gpumem::get_current_resource(device);  // not ours: let the resource say so
    r->deallocate(ptr, size, stream);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpumem: PyTorch free of %zu bytes at %p on device %d failed: %s\n", size, ptr,
                 device, e.what());
  }
}

// Allocations made through gpumem_torch_alloc and not yet freed (for tests and tools).
GPUMEM_EXPORT std::size_t gpumem_torch_live_allocations() {
  live_allocations& l = live();
  std::lock_guard lock(l.mutex);
  return l.owner.size();
}

}  // extern "C"
