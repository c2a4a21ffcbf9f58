// pinned_host_resource (include/gpumem/pinned_host_resource.hpp): cuMemHostAlloc
// / cuMemFreeHost with a record of live allocations.
#include "gpumem/pinned_host_resource.hpp"
#include "diagnose.hpp"
#include "gpumem/ipc.hpp"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

#include "driver/capture_interaction.hpp"
#include "driver/driver.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "live_allocations.hpp"

namespace gpumem {
namespace {

// No host can pin more than its physical memory: larger requests are out of memory at once.
std::size_t host_physical_bytes() {
  static const std::size_t bytes = [] {
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return std::numeric_limits<std::size_t>::max() / 4;
    return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page);
  }();
  return bytes;
}

int device_attribute(CUdevice_attribute attribute, int device) {
  int value = 0;
  GPUMEM_CU(cuDeviceGetAttribute, &value, attribute, device);
  return value;
}

}  // namespace

struct pinned_host_resource::state {
  int device = 0;
  pinned_options options;
  unsigned int flags = 0;
  bool unified_addressing = false;
  detail::live_allocations live;
};

pinned_host_resource::pinned_host_resource(pinned_options options, int device) : state_(std::make_unique<state>()) {
  state& s = *state_;
  s.device = device == -1 ? current_device() : device;
  detail::validate_device(s.device, "gpumem::pinned_host_resource");
  s.options = options;
  s.flags = (options.portable ? CU_MEMHOSTALLOC_PORTABLE : 0u) |
            (options.device_mapped ? CU_MEMHOSTALLOC_DEVICEMAP : 0u) |
            (options.write_combined ? CU_MEMHOSTALLOC_WRITECOMBINED : 0u);
  if (options.device_mapped && device_attribute(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, s.device) == 0) {
    throw cuda_error(CUDA_ERROR_NOT_SUPPORTED, "gpumem::pinned_host_resource",
                     "device " + std::to_string(s.device) + " cannot map host memory (device_mapped)");
  }
  s.unified_addressing = device_attribute(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, s.device) != 0;
}

pinned_host_resource::~pinned_host_resource() {
  state& s = *state_;
  if (s.live.count() == 0) return;
  detail::diagnosef(diagnostic_level::warning,
               "gpumem: pinned_host_resource destroyed with %zu live allocation(s), %zu bytes; freeing them\n",
               s.live.count(), s.live.bytes());
  try {
    detail::device_context_guard guard(s.device);
    (void)detail::driver().cuCtxSynchronize();  // work may still use them
    for (const auto& e : s.live.drain()) (void)detail::driver().cuMemFreeHost(e.base);
  } catch (...) {
    // The driver is gone (process teardown); nothing left to free.
  }
}

int pinned_host_resource::device() const noexcept { return state_->device; }
const pinned_options& pinned_host_resource::options() const noexcept { return state_->options; }
unsigned int pinned_host_resource::driver_flags() const noexcept { return state_->flags; }
std::size_t pinned_host_resource::allocated_bytes() const noexcept { return state_->live.bytes(); }
std::size_t pinned_host_resource::allocation_count() const noexcept { return state_->live.count(); }

resource_properties pinned_host_resource::properties() const noexcept {
  const state& s = *state_;
  const bool reachable = s.options.device_mapped || (s.unified_addressing && !s.options.write_combined);
  return {.device = -1, .device_accessible = reachable, .host_accessible = true, .thread_safe = true};
}

void* pinned_host_resource::device_pointer(const void* host_pointer) const {
  const state& s = *state_;
  if (host_pointer == nullptr) throw logic_error("gpumem::pinned_host_resource::device_pointer: null pointer");
  if (!s.options.device_mapped) {
    // With unified addressing the driver maps all pinned memory at its host
    // address, except write-combined memory (cuMemHostAlloc's documentation).
    if (s.unified_addressing && !s.options.write_combined) return const_cast<void*>(host_pointer);
    throw logic_error("gpumem::pinned_host_resource::device_pointer: the resource's memory is not device-mapped");
  }
  detail::device_context_guard guard(s.device);
  CUdeviceptr d = 0;
  const CUresult r = detail::driver().cuMemHostGetDevicePointer(&d, const_cast<void*>(host_pointer), 0);
  if (r == CUDA_ERROR_INVALID_VALUE) {
    throw logic_error("gpumem::pinned_host_resource::device_pointer: " + detail::live_allocations::hex(host_pointer) +
                      " is not in pinned memory");
  }
  detail::check(r, "cuMemHostGetDevicePointer", __FILE__, __LINE__);
  return reinterpret_cast<void*>(static_cast<std::uintptr_t>(d));
}

void* pinned_host_resource::do_allocate(std::size_t bytes, stream_view /*stream*/, std::size_t alignment) {
  state& s = *state_;
  const std::size_t host_bytes = host_physical_bytes();
  if (bytes > host_bytes || alignment > host_bytes - bytes) {
    throw out_of_memory({.requested_bytes = bytes, .device = -1, .resource = "pinned_host_resource",
                         .resource_held_bytes = s.live.bytes(),
                         .reason = "the request is larger than the host's physical memory (" +
                                   std::to_string(host_bytes) + " bytes)"});
  }
  detail::device_context_guard guard(s.device);
  detail::relaxed_capture_interaction relaxed;  // Note [Calls a capture elsewhere forbids]
  auto allocate = [&](std::size_t n) {
    void* p = nullptr;
    const CUresult r = detail::driver().cuMemHostAlloc(&p, n, s.flags);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      throw out_of_memory({.requested_bytes = bytes, .device = -1, .resource = "pinned_host_resource",
                           .resource_held_bytes = s.live.bytes(),
                           .reason = "cuMemHostAlloc could not pin that much host memory"});
    }
    detail::check(r, "cuMemHostAlloc", __FILE__, __LINE__);
    return p;
  };
  // The driver hands out whole pages; pad only when that is not aligned enough.
  void* base = allocate(bytes);
  std::uintptr_t address = reinterpret_cast<std::uintptr_t>(base);
  if (address % alignment != 0) {
    (void)detail::driver().cuMemFreeHost(base);
    base = allocate(bytes + alignment - 1);
    address = (reinterpret_cast<std::uintptr_t>(base) + alignment - 1) & ~(std::uintptr_t{alignment} - 1);
  }
  void* user = reinterpret_cast<void*>(address);
  s.live.insert(user, {base, bytes});
  return user;
}

void pinned_host_resource::do_deallocate(void* ptr, std::size_t bytes, stream_view stream, std::size_t /*alignment*/) {
  state& s = *state_;
  detail::device_context_guard guard(s.device);
  const detail::live_allocations::entry e = s.live.take(ptr, bytes, "gpumem::pinned_host_resource::deallocate");
  detail::relaxed_capture_interaction relaxed;  // Note [Calls a capture elsewhere forbids]
  try {
    // The work queued on `stream` before this call may still use the memory.
    stream.synchronize();
  } catch (...) {
    s.live.insert(ptr, e);
    throw;
  }
  const CUresult r = detail::driver().cuMemFreeHost(e.base);
  if (r != CUDA_SUCCESS) {
    s.live.insert(ptr, e);
    detail::check(r, "cuMemFreeHost", __FILE__, __LINE__);
  }
}


ipc_export_route pinned_host_resource::ipc_route(const void*, std::size_t) const {
  ipc_export_route route;
  route.how = ipc_export_route::way::refused;
  route.refusal = "host memory (pinned_host_resource) cannot be shared through CUDA IPC; share host memory with "
                  "the operating system (a memfd or shm_open) and register it in each process";
  return route;
}

}  // namespace gpumem
