// Peer "cuMemAlloc": the driver's synchronous allocator (what cudaMalloc and
// cudaFree cost), called straight through gpumem's driver table. The stream is
// ignored: cuMemAlloc is not stream-ordered, and cuMemFree may synchronize the
// device, which is part of what this row measures.
#include <cstdint>

#include "driver/driver.hpp"
#include "peers/peers.hpp"

namespace gpumem::bench::peers {
namespace {

class raw_cumemalloc final : public memory_resource {
 public:
  explicit raw_cumemalloc(int device) : device_(device) { ensure_current_device(device); }

  resource_properties properties() const noexcept override {
    return {.device = device_,
            .device_accessible = true,
            .host_accessible = false,
            .thread_safe = true};
  }

 private:
  void* do_allocate(std::size_t bytes, stream_view, std::size_t alignment) override {
    require_driver_alignment(alignment, "cuMemAlloc peer");
    ensure_current_device(device_);
    CUdeviceptr p = 0;
    GPUMEM_CU(cuMemAlloc, &p, bytes);
    return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p));
  }

  void do_deallocate(void* ptr, std::size_t, stream_view, std::size_t) override {
    ensure_current_device(device_);
    GPUMEM_CU(cuMemFree, static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(ptr)));
  }

  int device_;
};

}  // namespace

std::shared_ptr<memory_resource> make_raw_cumemalloc(int device) {
  return std::make_unique<raw_cumemalloc>(device);
}

}  // namespace gpumem::bench::peers
