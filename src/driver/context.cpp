// Primary contexts and the guard that makes one current for a call.
#include <array>
#include <atomic>
#include <mutex>
#include <string>

#include "driver/driver.hpp"
#include "gpumem/error.hpp"

namespace gpumem::detail {
namespace {

constexpr int max_devices = 64;
std::array<std::atomic<CUcontext>, max_devices> primary_contexts{};
std::mutex retain_mutex;
std::atomic<int> primary_contexts_known{0};  // one past the highest device retained so far

int cached_device_count() {
  static const int count = [] {
    int n = 0;
    GPUMEM_CU(cuDeviceGetCount, &n);
    return n < max_devices ? n : max_devices;
  }();
  return count;
}

}  // namespace

void validate_device(int device, const char* where) {
  const int count = cached_device_count();
  if (device < 0 || device >= count) {
    throw logic_error(std::string(where) + ": device " + std::to_string(device) +
                      " does not exist (" + std::to_string(count) + " device(s))");
  }
}

CUcontext primary_context(int device) {
  if (CUcontext ctx = primary_contexts[device].load(std::memory_order_acquire)) [[likely]] {
    return ctx;
  }
  std::lock_guard lock(retain_mutex);
  if (CUcontext ctx = primary_contexts[device].load(std::memory_order_acquire)) {
    return ctx;
  }
  CUdevice dev{};
  GPUMEM_CU(cuDeviceGet, &dev, device);
  CUcontext ctx = nullptr;
  // Retained for the life of the process, as the CUDA runtime does.
  GPUMEM_CU(cuDevicePrimaryCtxRetain, &ctx, dev);
  primary_contexts[device].store(ctx, std::memory_order_release);
  if (primary_contexts_known.load(std::memory_order_relaxed) <= device) {
    primary_contexts_known.store(device + 1, std::memory_order_release);  // under retain_mutex
  }
  return ctx;
}

int device_of_primary_context(CUcontext ctx) noexcept {
  // Retained for the life of the process, a primary context's handle names its
  // device for good: no other live context can have it.
  const int count = primary_contexts_known.load(std::memory_order_acquire);
  for (int d = 0; d < count; ++d) {
    if (primary_contexts[d].load(std::memory_order_acquire) == ctx) return d;
  }
  return -1;
}

device_context_guard::device_context_guard(int device) {
  CUcontext wanted = primary_context(device);
  GPUMEM_CU(cuCtxGetCurrent, &previous_);
  if (previous_ != wanted) {
    GPUMEM_CU(cuCtxSetCurrent, wanted);
    switched_ = true;
  }
}

device_context_guard::~device_context_guard() {
  if (switched_) {
    // Restoring a context that was current a moment ago cannot fail short of
    // driver teardown; nothing useful to do then, and destructors never throw.
    (void)driver().cuCtxSetCurrent(previous_);
  }
}

}  // namespace gpumem::detail
