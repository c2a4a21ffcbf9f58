// Peer "cuMemAllocAsync": the driver's stream-ordered allocator (what
// cudaMallocAsync / cudaFreeAsync cost) on the device's default pool, with the
// pool's release threshold at UINT64_MAX so that it keeps freed memory cached
// instead of returning it at every synchronization (docs/benchmarks-method.md: the peer as
// a tuned application would run it).
#include <cstdint>

#include "driver/driver.hpp"
#include "peers/peers.hpp"

namespace gpumem::bench::peers {
namespace {

class raw_cumemallocasync final : public memory_resource {
 public:
  explicit raw_cumemallocasync(int device) : device_(device) {
    ensure_current_device(device);
    CUdevice dev{};
    GPUMEM_CU(cuDeviceGet, &dev, device);
    GPUMEM_CU(cuDeviceGetDefaultMemPool, &pool_, dev);
    GPUMEM_CU(cuMemPoolGetAttribute, pool_, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &saved_threshold_);
    cuuint64_t keep_everything = UINT64_MAX;
    GPUMEM_CU(cuMemPoolSetAttribute, pool_, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_everything);
  }

  // The default pool is the device's, not this row's: hand back what the row
  // cached, so the next row (and the next cell of this row) starts from the same
  // free memory, and restore the threshold. Frees queued on streams other than
  // the harness's (W5 replays on streams of their own) are not complete yet and
  // a trim would keep their memory, which the next cell would then reuse
  // unseen (peak reserved / peak live below 1): the device is synchronised first.
  ~raw_cumemallocasync() override {
    const detail::driver_api& d = detail::driver();
    try {
      ensure_current_device(device_);
    } catch (...) {
    }
    (void)d.cuCtxSynchronize();
    (void)d.cuMemPoolTrimTo(pool_, 0);
    (void)d.cuMemPoolSetAttribute(pool_, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &saved_threshold_);
  }

  resource_properties properties() const noexcept override {
    return {.device = device_,
            .device_accessible = true,
            .host_accessible = false,
            .thread_safe = true};
  }

 private:
  void* do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) override {
    require_driver_alignment(alignment, "cuMemAllocAsync peer");
    ensure_current_device(device_);
    CUdeviceptr p = 0;
    GPUMEM_CU(cuMemAllocAsync, &p, bytes, stream.handle());
    return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p));
  }

  void do_deallocate(void* ptr, std::size_t, stream_view stream, std::size_t) override {
    ensure_current_device(device_);
    GPUMEM_CU(cuMemFreeAsync, static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(ptr)),
              stream.handle());
  }

  int device_;
  CUmemoryPool pool_ = nullptr;
  cuuint64_t saved_threshold_ = 0;
};

}  // namespace

std::shared_ptr<memory_resource> make_raw_cumemallocasync(int device) {
  return std::make_unique<raw_cumemallocasync>(device);
}

}  // namespace gpumem::bench::peers
