// Page-locked host memory and its entry points (cuMemHostAlloc, cuMemFreeHost,
// cuMemHostGetDevicePointer, cuMemHostGetFlags, cuMemHostRegister,
// cuMemHostUnregister): see sim_host_memory.hpp.
#include "sim/sim_host_memory.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <limits>

#include "sim/sim_capture_rules.hpp"
#include "sim/sim_entry_points.hpp"
#include "sim/sim_state.hpp"

namespace gpumem::detail::simulator {
namespace {

std::size_t host_page() {
  static const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

std::size_t round_up(std::size_t n, std::size_t unit) { return (n + unit - 1) / unit * unit; }

// Two mappings of the same pages (write-combined memory's host and device
// pointers), or nullptr. Both are MAP_SHARED views of one anonymous file.
bool map_twice(std::size_t length, void*& host, void*& device) {
  const int fd = memfd_create("gpumem-sim-write-combined", MFD_CLOEXEC);
  if (fd < 0) return false;
  bool ok = ftruncate(fd, static_cast<off_t>(length)) == 0;
  host = ok ? mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  device = host != MAP_FAILED ? mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  close(fd);
  if (device == MAP_FAILED) {
    if (host != MAP_FAILED) munmap(host, length);
    return false;
  }
  return true;
}

// Whether every page of [p, p + bytes) is mapped in this process.
bool mapped(std::uintptr_t p, std::size_t bytes) {
  const std::uintptr_t first = p / host_page() * host_page();
  const std::size_t length = round_up(p + bytes - first, host_page());
  // msync fails with ENOMEM for a range with unmapped pages, and does nothing
  // to private anonymous memory.
  return msync(reinterpret_cast<void*>(first), length, MS_ASYNC) == 0;
}

}  // namespace

CUresult host_memory::allocate(std::size_t bytes, unsigned flags, int device, void** out) {
  if (bytes > std::numeric_limits<std::size_t>::max() - host_page()) return CUDA_ERROR_OUT_OF_MEMORY;
  const std::size_t length = round_up(bytes, host_page());
  void* host = nullptr;
  void* device_view = nullptr;
  if ((flags & CU_MEMHOSTALLOC_WRITECOMBINED) != 0) {
    if (!map_twice(length, host, device_view)) return CUDA_ERROR_OUT_OF_MEMORY;
  } else {
    host = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (host == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    device_view = host;
  }
  host_range range;
  range.base = reinterpret_cast<std::uintptr_t>(host);
  range.size = bytes;
  range.flags = flags;
  range.kind = host_range_kind::allocated;
  range.device_base = reinterpret_cast<std::uintptr_t>(device_view);
  range.mapped_bytes = length;
  range.device = device;
  std::lock_guard lock(mutex_);
  ranges_.emplace(range.base, range);
  if (range.device_base != range.base) aliases_.emplace(range.device_base, range.base);
  *out = host;
  return CUDA_SUCCESS;
}

CUresult host_memory::free(void* p) {
  host_range range;
  {
    std::lock_guard lock(mutex_);
    auto it = ranges_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == ranges_.end() || it->second.kind != host_range_kind::allocated) return CUDA_ERROR_INVALID_VALUE;
    range = it->second;
    ranges_.erase(it);
    aliases_.erase(range.device_base);
  }
  // Unmapped, so a use after free faults (SIGSEGV), as it would on the host with real pinned memory.
  munmap(reinterpret_cast<void*>(range.base), range.mapped_bytes);
  if (range.device_base != range.base) munmap(reinterpret_cast<void*>(range.device_base), range.mapped_bytes);
  return CUDA_SUCCESS;
}

CUresult host_memory::register_range(void* p, std::size_t bytes, unsigned flags, int device) {
  const auto base = reinterpret_cast<std::uintptr_t>(p);
  if (base > std::numeric_limits<std::uintptr_t>::max() - bytes) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(mutex_);
  // Overlap with a range already known. The driver answers
  // HOST_MEMORY_ALREADY_REGISTERED for a registered range, but INVALID_VALUE
  // for cuMemHostAlloc memory (pinned already), as seen on an H200 (driver 580).
  CUresult overlap = CUDA_SUCCESS;
  auto note = [&](const host_range& known) {
    if (known.kind == host_range_kind::allocated) {
      overlap = CUDA_ERROR_INVALID_VALUE;
    } else if (overlap == CUDA_SUCCESS) {
      overlap = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
  };
  auto next = ranges_.lower_bound(base);
  if (next != ranges_.begin() && std::prev(next)->second.base + std::prev(next)->second.size > base) {
    note(std::prev(next)->second);
  }
  for (auto it = next; it != ranges_.end() && it->first < base + bytes; ++it) note(it->second);
  if (overlap != CUDA_SUCCESS) return overlap;
  if (!mapped(base, bytes)) return CUDA_ERROR_INVALID_VALUE;
  host_range range;
  range.base = base;
  range.size = bytes;
  range.flags = flags;
  range.kind = host_range_kind::registered;
  range.device_base = base;  // CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM is 1
  range.device = device;
  ranges_.emplace(base, range);
  return CUDA_SUCCESS;
}

CUresult host_memory::unregister(void* p) {
  std::lock_guard lock(mutex_);
  auto it = ranges_.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == ranges_.end() || it->second.kind != host_range_kind::registered) {
    return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  }
  ranges_.erase(it);
  return CUDA_SUCCESS;
}

std::optional<host_range> host_memory::find(std::uintptr_t p) const {
  std::lock_guard lock(mutex_);
  auto it = ranges_.upper_bound(p);
  if (it != ranges_.begin() && std::prev(it)->second.contains(p)) return std::prev(it)->second;
  auto alias = aliases_.upper_bound(p);
  if (alias != aliases_.begin()) {
    auto range = ranges_.find(std::prev(alias)->second);
    if (range != ranges_.end() && range->second.device_contains(p)) return range->second;
  }
  return std::nullopt;
}

// ---- entry points ----

namespace {

constexpr unsigned host_alloc_flags =
    CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
constexpr unsigned host_register_flags = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                                         CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;

bool touches_device_memory(sim_state& state, std::uintptr_t p, std::size_t bytes) {
  for (int d = 0; d < state.device_count(); ++d) {
    if (state.device(d)->memory.overlaps_reserved_range(p, bytes)) return true;
  }
  return false;
}

}  // namespace

CUresult mem_host_alloc(void** pointer, std::size_t bytes, unsigned int flags) {
  return entry_point([&](sim_state& state) {
    sim_context* context = nullptr;
    if (CUresult r = require_current_context(context); r != CUDA_SUCCESS) return r;
    if (pointer == nullptr || bytes == 0 || (flags & ~host_alloc_flags) != 0) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = unsafe_call_permitted(); r != CUDA_SUCCESS) return r;  // sim_capture_rules.hpp
    return state.host.allocate(bytes, flags, context->device(), pointer);
  });
}

CUresult mem_free_host(void* pointer) {
  return entry_point([&](sim_state& state) {
    sim_context* context = nullptr;
    if (CUresult r = require_current_context(context); r != CUDA_SUCCESS) return r;
    if (CUresult r = unsafe_call_permitted(); r != CUDA_SUCCESS) return r;  // sim_capture_rules.hpp
    return state.host.free(pointer);
  });
}

CUresult mem_host_get_device_pointer(CUdeviceptr* device_pointer, void* pointer, unsigned int flags) {
  return entry_point([&](sim_state& state) {
    sim_context* context = nullptr;
    if (CUresult r = require_current_context(context); r != CUDA_SUCCESS) return r;
    if (device_pointer == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    const auto p = reinterpret_cast<std::uintptr_t>(pointer);
    auto range = state.host.find(p);
    // Only memory allocated or registered as mapped has a device pointer to ask for.
    if (!range || !range->contains(p) || !range->mapped()) return CUDA_ERROR_INVALID_VALUE;
    *device_pointer = static_cast<CUdeviceptr>(range->device_base + (p - range->base));
    return CUDA_SUCCESS;
  });
}

CUresult mem_host_get_flags(unsigned int* flags, void* pointer) {
  return entry_point([&](sim_state& state) {
    sim_context* context = nullptr;
    if (CUresult r = require_current_context(context); r != CUDA_SUCCESS) return r;
    if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto p = reinterpret_cast<std::uintptr_t>(pointer);
    auto range = state.host.find(p);
    if (!range || !range->contains(p) || range->kind != host_range_kind::allocated) return CUDA_ERROR_INVALID_VALUE;
    *flags = range->flags;
    return CUDA_SUCCESS;
  });
}

CUresult mem_host_register(void* pointer, std::size_t bytes, unsigned int flags) {
  return entry_point([&](sim_state& state) {
    sim_context* context = nullptr;
    if (CUresult r = require_current_context(context); r != CUDA_SUCCESS) return r;
    if (pointer == nullptr || bytes == 0 || (flags & ~host_register_flags) != 0) return CUDA_ERROR_INVALID_VALUE;
    if ((flags & CU_MEMHOSTREGISTER_IOMEMORY) != 0) return CUDA_ERROR_NOT_SUPPORTED;  // no I/O memory here
    const auto p = reinterpret_cast<std::uintptr_t>(pointer);
    if (p > std::numeric_limits<std::uintptr_t>::max() - bytes) return CUDA_ERROR_INVALID_VALUE;
    if (touches_device_memory(state, p, bytes)) return CUDA_ERROR_INVALID_VALUE;
    return state.host.register_range(pointer, bytes, flags, context->device());
  });
}

CUresult mem_host_unregister(void* pointer) {
  return entry_point([&](sim_state& state) {
    sim_context* context = nullptr;
    if (CUresult r = require_current_context(context); r != CUDA_SUCCESS) return r;
    return state.host.unregister(pointer);
  });
}

}  // namespace gpumem::detail::simulator
