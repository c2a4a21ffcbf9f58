// cuda_resource (include/gpumem/cuda_resource.hpp): cuMemAlloc / cuMemFree with
// a record of every live allocation.
#include "gpumem/cuda_resource.hpp"
#include "diagnose.hpp"

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <unordered_map>

#include "driver/capture_interaction.hpp"
#include "driver/driver.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "stream_device.hpp"
#include "text.hpp"

namespace gpumem {
namespace {

// The driver's allocations are aligned to default_alignment (cuMemAlloc's
// documented 256 bytes, its pools' and managed memory's too); larger alignments
// are made by over-allocating.
constexpr std::size_t driver_alignment = default_alignment;

}  // namespace

struct cuda_resource::state {
  struct allocation {
    CUdeviceptr base;
    std::size_t bytes;
  };
  int device = 0;
  std::size_t device_total_bytes = 0;
  mutable std::mutex mutex;  // guards live; held only around the map, never across the driver
  std::unordered_map<std::uintptr_t, allocation> live;
  std::atomic<std::size_t> allocated_bytes{0};
};

cuda_resource::cuda_resource(int device) : state_(std::make_unique<state>()) {
  state_->device = device == -1 ? current_device() : device;
  detail::validate_device(state_->device, "gpumem::cuda_resource");
  state_->device_total_bytes = device_memory_info(state_->device).total_bytes;
}

cuda_resource::~cuda_resource() {
  if (state_->live.empty()) return;
  // Leaked allocations: report them and give the memory back, so a process that
  // drops resources does not lose device memory for good.
  detail::diagnosef(diagnostic_level::warning, "gpumem: cuda_resource on device %d destroyed with %zu live allocation(s), %zu bytes; freeing them\n",
               state_->device, state_->live.size(), state_->allocated_bytes.load());
  try {
    detail::device_context_guard guard(state_->device);
    for (auto& [ptr, a] : state_->live) {
      (void)detail::driver().cuMemFree(a.base);
    }
  } catch (...) {
    // The driver is gone (process teardown); nothing left to free.
  }
}

int cuda_resource::device() const noexcept { return state_->device; }

std::size_t cuda_resource::allocated_bytes() const noexcept { return state_->allocated_bytes.load(); }

std::size_t cuda_resource::allocation_count() const noexcept {
  std::lock_guard lock(state_->mutex);
  return state_->live.size();
}

resource_properties cuda_resource::properties() const noexcept {
  return {.device = state_->device, .device_accessible = true, .host_accessible = false,
          .thread_safe = true};
}

void* cuda_resource::do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) {
  state& s = *state_;
  detail::device_context_guard guard(s.device);
  detail::check_stream_device(stream, s.device, "gpumem::cuda_resource::allocate");
  const std::size_t padding = alignment > driver_alignment ? alignment - driver_alignment : 0;
  if (bytes > s.device_total_bytes || padding > s.device_total_bytes - bytes) {
    out_of_memory_info info{.requested_bytes = bytes, .device = s.device,
                            .resource = "cuda_resource", .resource_held_bytes = s.allocated_bytes,
                            .device_free_bytes = device_memory_info(s.device).free_bytes,
                            .device_total_bytes = s.device_total_bytes,
                            .reason = "the request is larger than the device's total memory"};
    throw out_of_memory(std::move(info));
  }
  CUdeviceptr base = 0;
  CUresult r = CUDA_SUCCESS;
  {
    detail::relaxed_capture_interaction relaxed;  // Note [Calls a capture elsewhere forbids]
    r = detail::driver().cuMemAlloc(&base, bytes + padding);
  }
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    memory_info m = device_memory_info(s.device);
    throw out_of_memory({.requested_bytes = bytes, .device = s.device, .resource = "cuda_resource",
                         .resource_held_bytes = s.allocated_bytes,
                         .device_free_bytes = m.free_bytes, .device_total_bytes = m.total_bytes,
                         .reason = "cuMemAlloc found no room on the device"});
  }
  detail::check(r, "cuMemAlloc", __FILE__, __LINE__);
  const std::uintptr_t aligned = (base + alignment - 1) & ~(std::uintptr_t{alignment} - 1);
  {
    std::lock_guard lock(s.mutex);
    s.live.emplace(aligned, state::allocation{base, bytes});
  }
  s.allocated_bytes.fetch_add(bytes, std::memory_order_relaxed);
  return reinterpret_cast<void*>(aligned);
}

void cuda_resource::do_deallocate(void* ptr, std::size_t bytes, stream_view stream,
                                  std::size_t /*alignment*/) {
  state& s = *state_;
  detail::device_context_guard guard(s.device);
  detail::check_stream_device(stream, s.device, "gpumem::cuda_resource::deallocate");
  CUdeviceptr base = 0;
  {
    std::lock_guard lock(s.mutex);
    auto it = s.live.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == s.live.end()) {
      throw logic_error("gpumem::cuda_resource::deallocate: pointer " + detail::pointer_text(ptr) +
                        " was not allocated by this resource, or was already freed");
    }
    if (it->second.bytes != bytes) {
      throw logic_error("gpumem::cuda_resource::deallocate: pointer " + detail::pointer_text(ptr) + " has " +
                        std::to_string(it->second.bytes) + " bytes, not " + std::to_string(bytes));
    }
    base = it->second.base;
    s.live.erase(it);
  }
  s.allocated_bytes.fetch_sub(bytes, std::memory_order_relaxed);
  // cuMemFree waits for all work on the device, so work queued on `stream` before
  // this call has finished with the memory when it is released: the contract holds.
  detail::relaxed_capture_interaction relaxed;  // Note [Calls a capture elsewhere forbids]
  GPUMEM_CU(cuMemFree, base);
}


std::optional<std::size_t> cuda_resource::available_bytes() const {
  return device_memory_info(state_->device).free_bytes;
}

}  // namespace gpumem
