// host_registration (include/gpumem/host_registration.hpp): cuMemHostRegister
// for the object's lifetime.
#include "gpumem/host_registration.hpp"
#include "diagnose.hpp"

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include "driver/driver.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "live_allocations.hpp"

namespace gpumem {
namespace {

std::string range_text(const void* p, std::size_t bytes) {
  return "[" + detail::live_allocations::hex(p) + ", +" + std::to_string(bytes) + " bytes)";
}

// Whether the range's first or last byte lies in a cuMemHostAlloc allocation
// (cuMemHostGetFlags answers only for those): the driver refuses to register
// such memory with CUDA_ERROR_INVALID_VALUE, not HOST_MEMORY_ALREADY_REGISTERED.
// Called after a refusal only, with the device's context current.
bool starts_or_ends_in_pinned_allocation(void* ptr, std::size_t bytes) {
  unsigned int flags = 0;
  auto* last = static_cast<unsigned char*>(ptr) + (bytes - 1);
  return detail::driver().cuMemHostGetFlags(&flags, ptr) == CUDA_SUCCESS ||
         detail::driver().cuMemHostGetFlags(&flags, last) == CUDA_SUCCESS;
}

}  // namespace

host_registration::host_registration(void* ptr, std::size_t bytes, registration_options options, int device) {
  if (ptr == nullptr) throw logic_error("gpumem::host_registration: null pointer");
  if (bytes == 0) throw logic_error("gpumem::host_registration: 0 bytes (register a non-empty range)");
  const int d = device == -1 ? current_device() : device;
  detail::validate_device(d, "gpumem::host_registration");
  const unsigned int flags = (options.mapped ? CU_MEMHOSTREGISTER_DEVICEMAP : 0u) |
                             (options.portable ? CU_MEMHOSTREGISTER_PORTABLE : 0u) |
                             (options.read_only ? CU_MEMHOSTREGISTER_READ_ONLY : 0u);
  detail::device_context_guard guard(d);
  const CUresult r = detail::driver().cuMemHostRegister(ptr, bytes, flags);
  if (r == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) {
    throw logic_error("gpumem::host_registration: " + range_text(ptr, bytes) +
                      " overlaps memory that is already registered or pinned "
                      "(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)");
  }
  if (r == CUDA_ERROR_INVALID_VALUE && starts_or_ends_in_pinned_allocation(ptr, bytes)) {
    throw logic_error("gpumem::host_registration: " + range_text(ptr, bytes) +
                      " overlaps memory that is already page-locked by cuMemHostAlloc "
                      "(the driver answers CUDA_ERROR_INVALID_VALUE)");
  }
  detail::check(r, "cuMemHostRegister", __FILE__, __LINE__);
  ptr_ = ptr;
  bytes_ = bytes;
  device_ = d;
  options_ = options;
}

host_registration::~host_registration() { unregister_noexcept(); }

host_registration::host_registration(host_registration&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      device_(std::exchange(other.device_, -1)),
      options_(other.options_) {}

host_registration& host_registration::operator=(host_registration&& other) noexcept {
  if (this != &other) {
    unregister_noexcept();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    device_ = std::exchange(other.device_, -1);
    options_ = other.options_;
  }
  return *this;
}

void* host_registration::device_pointer() const {
  if (ptr_ == nullptr) throw logic_error("gpumem::host_registration::device_pointer: nothing is registered");
  if (!options_.mapped) {
    throw logic_error("gpumem::host_registration::device_pointer: " + range_text(ptr_, bytes_) +
                      " was registered without `mapped`");
  }
  detail::device_context_guard guard(device_);
  CUdeviceptr d = 0;
  GPUMEM_CU(cuMemHostGetDevicePointer, &d, ptr_, 0);
  return reinterpret_cast<void*>(static_cast<std::uintptr_t>(d));
}

void host_registration::release() {
  if (ptr_ == nullptr) throw logic_error("gpumem::host_registration::release: nothing is registered");
  detail::device_context_guard guard(device_);
  const CUresult r = detail::driver().cuMemHostUnregister(ptr_);
  void* const p = std::exchange(ptr_, nullptr);
  const std::size_t n = std::exchange(bytes_, 0);
  if (r == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED) {
    throw logic_error("gpumem::host_registration::release: the driver no longer knows " + range_text(p, n) +
                      " (CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED): it was unregistered elsewhere");
  }
  detail::check(r, "cuMemHostUnregister", __FILE__, __LINE__);
}

void host_registration::unregister_noexcept() noexcept {
  if (ptr_ == nullptr) return;
  try {
    release();
  } catch (const std::exception& e) {
    detail::diagnosef(diagnostic_level::error, "gpumem: host_registration: %s\n", e.what());
  }
}

}  // namespace gpumem
