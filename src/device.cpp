// Device queries (include/gpumem/device.hpp).
#include "gpumem/device.hpp"

#include <array>

#include "driver/driver.hpp"

namespace gpumem {

int device_count() {
  int n = 0;
  GPUMEM_CU(cuDeviceGetCount, &n);
  return n;
}

int current_device() {
  CUcontext ctx = nullptr;
  GPUMEM_CU(cuCtxGetCurrent, &ctx);
  if (ctx == nullptr) return 0;
  if (const int d = detail::device_of_primary_context(ctx); d >= 0) return d;  // the usual case, one call
  CUdevice dev{};
  GPUMEM_CU(cuCtxGetDevice, &dev);
  return static_cast<int>(dev);
}

void set_current_device(int device) {
  detail::validate_device(device, "gpumem::set_current_device");
  GPUMEM_CU(cuCtxSetCurrent, detail::primary_context(device));
}

std::optional<int> current_context_device() {
  CUcontext ctx = nullptr;
  GPUMEM_CU(cuCtxGetCurrent, &ctx);
  if (ctx == nullptr) return std::nullopt;
  if (const int d = detail::device_of_primary_context(ctx); d >= 0) return d;
  CUdevice dev{};
  GPUMEM_CU(cuCtxGetDevice, &dev);
  return static_cast<int>(dev);
}

bool adopt_primary_context(int device) {
  detail::validate_device(device, "gpumem::adopt_primary_context");
  CUcontext ctx = nullptr;
  GPUMEM_CU(cuCtxGetCurrent, &ctx);
  if (ctx != nullptr) return false;
  GPUMEM_CU(cuCtxSetCurrent, detail::primary_context(device));
  return true;
}

memory_info device_memory_info(int device) {
  detail::validate_device(device, "gpumem::device_memory_info");
  detail::device_context_guard guard(device);
  memory_info info;
  GPUMEM_CU(cuMemGetInfo, &info.free_bytes, &info.total_bytes);
  return info;
}

std::string device_name(int device) {
  detail::validate_device(device, "gpumem::device_name");
  CUdevice dev{};
  GPUMEM_CU(cuDeviceGet, &dev, device);
  std::array<char, 256> name{};
  GPUMEM_CU(cuDeviceGetName, name.data(), static_cast<int>(name.size()), dev);
  return std::string(name.data());
}

std::vector<int> peers_of(int device) {
  detail::validate_device(device, "gpumem::peers_of");
  std::vector<int> out;
  const int n = device_count();
  for (int other = 0; other < n; ++other) {
    if (other == device) continue;
    int can = 0;
    GPUMEM_CU(cuDeviceCanAccessPeer, &can, other, device);
    if (can != 0) out.push_back(other);
  }
  return out;
}

int driver_version() {
  int v = 0;
  GPUMEM_CU(cuDriverGetVersion, &v);
  return v;
}

}  // namespace gpumem
