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
  return ctx;
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
