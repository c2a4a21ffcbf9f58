// managed_resource (include/gpumem/managed_resource.hpp): cuMemAllocManaged /
// cuMemFree with a record of live allocations.
#include "gpumem/managed_resource.hpp"
#include "diagnose.hpp"
#include "ipc/shareable.hpp"
#include "gpumem/ipc.hpp"

#include <cstdint>
#include <cstdio>
#include <string>

#include "driver/capture_interaction.hpp"
#include "driver/driver.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "live_allocations.hpp"
#include "stream_device.hpp"

namespace gpumem {
namespace {

// The driver's allocations are aligned to default_alignment (cuMemAlloc's
// documented 256 bytes, its pools' and managed memory's too); larger alignments
// are made by over-allocating.
constexpr std::size_t driver_alignment = default_alignment;

int device_attribute(CUdevice_attribute attribute, int device) {
  int value = 0;
  GPUMEM_CU(cuDeviceGetAttribute, &value, attribute, device);
  return value;
}

}  // namespace

struct managed_resource::state {
  int device = 0;
  managed_attach attach = managed_attach::global;
  bool device_accessible = true;
  std::size_t device_total_bytes = 0;
  detail::live_allocations live;
};

managed_resource::managed_resource(int device, managed_attach attach) : state_(std::make_unique<state>()) {
  state& s = *state_;
  s.device = device == -1 ? current_device() : device;
  detail::validate_device(s.device, "gpumem::managed_resource");
  if (device_attribute(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, s.device) == 0) {
    throw cuda_error(CUDA_ERROR_NOT_SUPPORTED, "gpumem::managed_resource",
                     "device " + std::to_string(s.device) + " does not support managed memory");
  }
  s.attach = attach;
  // Host-attached memory is usable by the device only where it may access
  // managed memory concurrently with the host.
  s.device_accessible = attach == managed_attach::global ||
                        device_attribute(CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, s.device) != 0;
  s.device_total_bytes = device_memory_info(s.device).total_bytes;
}

managed_resource::~managed_resource() {
  state& s = *state_;
  if (s.live.count() == 0) return;
  detail::diagnosef(diagnostic_level::warning,
               "gpumem: managed_resource on device %d destroyed with %zu live allocation(s), %zu bytes; freeing them\n",
               s.device, s.live.count(), s.live.bytes());
  try {
    detail::device_context_guard guard(s.device);
    for (const auto& e : s.live.drain()) (void)detail::driver().cuMemFree(reinterpret_cast<CUdeviceptr>(e.base));
  } catch (...) {
    // The driver is gone (process teardown); nothing left to free.
  }
}

int managed_resource::device() const noexcept { return state_->device; }
managed_attach managed_resource::attach() const noexcept { return state_->attach; }
std::size_t managed_resource::allocated_bytes() const noexcept { return state_->live.bytes(); }
std::size_t managed_resource::allocation_count() const noexcept { return state_->live.count(); }

resource_properties managed_resource::properties() const noexcept {
  return {.device = state_->device, .device_accessible = state_->device_accessible, .host_accessible = true,
          .thread_safe = true};
}

void* managed_resource::do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) {
  state& s = *state_;
  detail::device_context_guard guard(s.device);
  detail::check_stream_device(stream, s.device, "gpumem::managed_resource::allocate");
  const std::size_t padding = alignment > driver_alignment ? alignment - driver_alignment : 0;
  if (bytes > s.device_total_bytes || padding > s.device_total_bytes - bytes) {
    throw out_of_memory({.requested_bytes = bytes, .device = s.device, .resource = "managed_resource",
                         .resource_held_bytes = s.live.bytes(),
                         .device_free_bytes = device_memory_info(s.device).free_bytes,
                         .device_total_bytes = s.device_total_bytes,
                         .reason = "the request is larger than the device's total memory"});
  }
  CUdeviceptr base = 0;
  const unsigned flags = s.attach == managed_attach::global ? CU_MEM_ATTACH_GLOBAL : CU_MEM_ATTACH_HOST;
  CUresult r = CUDA_SUCCESS;
  {
    detail::relaxed_capture_interaction relaxed;  // Note [Calls a capture elsewhere forbids]
    r = detail::driver().cuMemAllocManaged(&base, bytes + padding, flags);
  }
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    const memory_info m = device_memory_info(s.device);
    throw out_of_memory({.requested_bytes = bytes, .device = s.device, .resource = "managed_resource",
                         .resource_held_bytes = s.live.bytes(), .device_free_bytes = m.free_bytes,
                         .device_total_bytes = m.total_bytes,
                         .reason = "cuMemAllocManaged found no room"});
  }
  detail::check(r, "cuMemAllocManaged", __FILE__, __LINE__);
  const std::uintptr_t aligned = (base + alignment - 1) & ~(std::uintptr_t{alignment} - 1);
  void* user = reinterpret_cast<void*>(aligned);
  s.live.insert(user, {reinterpret_cast<void*>(base), bytes});
  return user;
}

void managed_resource::do_deallocate(void* ptr, std::size_t bytes, stream_view stream, std::size_t /*alignment*/) {
  state& s = *state_;
  detail::device_context_guard guard(s.device);
  detail::check_stream_device(stream, s.device, "gpumem::managed_resource::deallocate");
  const detail::live_allocations::entry e = s.live.take(ptr, bytes, "gpumem::managed_resource::deallocate");
  // cuMemFree waits for all work on the device, so the work queued on `stream`
  // before this call is done with the memory when it goes: the contract holds.
  CUresult r = CUDA_SUCCESS;
  {
    detail::relaxed_capture_interaction relaxed;  // Note [Calls a capture elsewhere forbids]
    r = detail::driver().cuMemFree(reinterpret_cast<CUdeviceptr>(e.base));
  }
  if (r != CUDA_SUCCESS) {
    s.live.insert(ptr, e);
    detail::check(r, "cuMemFree", __FILE__, __LINE__);
  }
}


ipc_export_route managed_resource::ipc_route(const void*, std::size_t) const {
  ipc_export_route route;
  route.how = ipc_export_route::way::refused;
  route.refusal = std::string("managed memory (managed_resource) cannot be shared between processes; "
                              "allocate what you share from ") + detail::shareable_resources;
  return route;
}

}  // namespace gpumem
