// One simulated device's memory: address-range reservation, first-fit placement,
// page protection and capacity accounting (see sim_address_space.hpp).
#include "sim/sim_address_space.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <limits>
#include <new>
#include <string>

namespace gpumem::detail::simulator {
namespace {

// The reserved range is this many times the capacity, so first-fit placement
// has room to spare however the allocations fragment it.
constexpr std::size_t reservation_factor = 4;

constexpr int reserved_protection = PROT_NONE;
constexpr int reserved_flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;

std::size_t round_up(std::size_t n, std::size_t unit) { return (n + unit - 1) / unit * unit; }

// Maps `bytes` of PROT_NONE address space, shrinking the slack factor if the
// host cannot give that much (huge GPUMEM_SIM_MEMORY with many devices).
std::byte* reserve(std::size_t capacity, std::size_t& reserved) {
  const std::size_t unit = device_address_space::granularity();
  const std::size_t minimum = round_up(capacity, unit);
  for (std::size_t factor = reservation_factor; factor >= 1; factor /= 2) {
    if (minimum > std::numeric_limits<std::size_t>::max() / factor) continue;
    const std::size_t bytes = minimum * factor;
    void* p = mmap(nullptr, bytes, reserved_protection, reserved_flags, -1, 0);
    if (p != MAP_FAILED) {
      reserved = bytes;
      return static_cast<std::byte*>(p);
    }
  }
  throw host_reservation_failed("cannot reserve " + std::to_string(minimum) + " bytes of host address space");
}

}  // namespace

std::size_t device_address_space::granularity() {
  static const std::size_t unit = std::max<std::size_t>(4096, static_cast<std::size_t>(sysconf(_SC_PAGESIZE)));
  return unit;
}

device_address_space::device_address_space(int device, std::size_t capacity)
    : device_(device), capacity_(capacity) {
  base_ = reserve(capacity, reserved_);
  free_ranges_.emplace(0, reserved_);
}

device_address_space::~device_address_space() {
  // Only reached when building the simulator fails part way; the simulator
  // itself is never destroyed.
  munmap(base_, reserved_);
}

CUresult device_address_space::reserve_region(std::size_t bytes, CUdeviceptr* out) {
  const std::size_t unit = granularity();
  if (bytes > std::numeric_limits<std::size_t>::max() - unit) return CUDA_ERROR_OUT_OF_MEMORY;
  const std::size_t footprint = round_up(bytes, unit);

  std::lock_guard lock(mutex_);
  if (footprint > capacity_ - used_) return CUDA_ERROR_OUT_OF_MEMORY;
  // First fit in address order: simple, and keeps regions packed low.
  auto hole = std::find_if(free_ranges_.begin(), free_ranges_.end(),
                           [&](const auto& range) { return range.second >= footprint; });
  if (hole == free_ranges_.end()) return CUDA_ERROR_OUT_OF_MEMORY;

  const std::size_t offset = hole->first;
  std::byte* address = base_ + offset;
  // Fails only if the host runs out of mappings (vm.max_map_count) or commit.
  if (mprotect(address, footprint, PROT_READ | PROT_WRITE) != 0) return CUDA_ERROR_OUT_OF_MEMORY;

  const std::size_t hole_length = hole->second;
  free_ranges_.erase(hole);
  if (hole_length > footprint) free_ranges_.emplace(offset + footprint, hole_length - footprint);
  used_ += footprint;
  *out = reinterpret_cast<CUdeviceptr>(address);
  return CUDA_SUCCESS;
}

CUresult device_address_space::charge(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  if (bytes > capacity_ - used_) return CUDA_ERROR_OUT_OF_MEMORY;
  used_ += bytes;
  return CUDA_SUCCESS;
}

void device_address_space::uncharge(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  used_ -= bytes;
}

void device_address_space::release_region(CUdeviceptr base, std::size_t footprint) {
  std::lock_guard lock(mutex_);
  unmap_locked(base, footprint);
}

void device_address_space::unshare_locked(CUdeviceptr base, std::size_t footprint) {
  for (auto it = shared_.lower_bound(base); it != shared_.end() && it->first < base + footprint;) {
    close(it->second.fd);
    it = shared_.erase(it);
  }
}

void device_address_space::unmap_locked(CUdeviceptr base, std::size_t footprint) {
  unshare_locked(base, footprint);
  used_ -= footprint;
  // A fresh PROT_NONE mapping over the pages: they fault on use and their
  // memory goes back to the host at once (like MADV_DONTNEED + mprotect, in one call).
  void* address = reinterpret_cast<void*>(base);
  if (mmap(address, footprint, reserved_protection, reserved_flags | MAP_FIXED, -1, 0) == MAP_FAILED) {
    // Cannot happen for a range we own short of the host running out of mappings;
    // fall back to taking away access, which cannot fail for lack of memory.
    madvise(address, footprint, MADV_DONTNEED);
    mprotect(address, footprint, PROT_NONE);
  }

  // Give the range back to the free map, coalescing with its neighbours.
  std::size_t offset = static_cast<std::size_t>(reinterpret_cast<std::byte*>(address) - base_);
  std::size_t length = footprint;
  auto next = free_ranges_.lower_bound(offset);
  if (next != free_ranges_.end() && offset + length == next->first) {
    length += next->second;
    next = free_ranges_.erase(next);
  }
  if (next != free_ranges_.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second == offset) {
      previous->second += length;
      return;
    }
  }
  free_ranges_.emplace(offset, length);
}

CUresult device_address_space::allocate(std::size_t bytes, allocation_kind kind, unsigned attach,
                                        CUdeviceptr* out) {
  CUdeviceptr base = 0;
  if (CUresult r = reserve_region(bytes, &base); r != CUDA_SUCCESS) return r;
  allocation a;
  a.base = base;
  a.size = bytes;
  a.footprint = round_up(bytes, granularity());
  a.device = device_;
  a.kind = kind;
  a.attach = attach;
  std::lock_guard lock(mutex_);
  live_.emplace(base, a);
  *out = base;
  return CUDA_SUCCESS;
}

CUresult device_address_space::free(CUdeviceptr base) {
  std::lock_guard lock(mutex_);
  auto it = live_.find(base);
  if (it == live_.end() || it->second.free_pending || it->second.kind == allocation_kind::stream_ordered ||
      it->second.kind == allocation_kind::ipc_legacy) {  // cuIpcCloseMemHandle's
    return CUDA_ERROR_INVALID_VALUE;
  }
  const std::size_t footprint = it->second.footprint;
  live_.erase(it);
  unmap_locked(base, footprint);
  return CUDA_SUCCESS;
}

CUresult device_address_space::mark_free_pending(CUdeviceptr base) {
  std::lock_guard lock(mutex_);
  auto it = live_.find(base);
  if (it == live_.end() || it->second.free_pending || it->second.kind == allocation_kind::stream_ordered ||
      it->second.kind == allocation_kind::ipc_legacy) {  // cuIpcCloseMemHandle's
    return CUDA_ERROR_INVALID_VALUE;
  }
  it->second.free_pending = true;
  return CUDA_SUCCESS;
}

void device_address_space::complete_pending_free(CUdeviceptr base) {
  std::lock_guard lock(mutex_);
  auto it = live_.find(base);
  if (it != live_.end() && it->second.free_pending) {
    const std::size_t footprint = it->second.footprint;
    live_.erase(it);
    unmap_locked(base, footprint);
  }
}

void device_address_space::set_graph_node(CUdeviceptr base, std::uint64_t node) {
  std::lock_guard lock(mutex_);
  auto it = live_.find(base);
  if (it != live_.end() && it->second.kind == allocation_kind::graph) it->second.graph_node = node;
}

void device_address_space::mark_graph_launched(CUdeviceptr base, std::uint64_t node) {
  std::lock_guard lock(mutex_);
  auto it = live_.find(base);
  if (it != live_.end() && it->second.kind == allocation_kind::graph && it->second.graph_node == node) {
    it->second.graph_launched = true;
  }
}

void device_address_space::release_unlaunched_graph_allocation(CUdeviceptr base, std::uint64_t node) {
  std::lock_guard lock(mutex_);  // one hold: no other allocation can take `base` between the look and the free
  auto it = live_.find(base);
  if (it == live_.end() || it->second.kind != allocation_kind::graph || it->second.graph_node != node ||
      it->second.graph_launched || it->second.free_pending) {
    return;
  }
  const std::size_t footprint = it->second.footprint;
  live_.erase(it);
  unmap_locked(base, footprint);
}

void device_address_space::cancel_pending_free(CUdeviceptr base) {
  std::lock_guard lock(mutex_);
  auto it = live_.find(base);
  if (it != live_.end()) it->second.free_pending = false;
}

void device_address_space::add_block(const allocation& block) {
  std::lock_guard lock(mutex_);
  live_.emplace(block.base, block);
}

std::optional<allocation> device_address_space::remove_block(CUdeviceptr base, const sim_pool* pool) {
  std::lock_guard lock(mutex_);
  auto it = live_.find(base);
  if (it == live_.end() || it->second.kind != allocation_kind::stream_ordered || it->second.pool != pool) {
    return std::nullopt;
  }
  allocation a = it->second;
  live_.erase(it);
  if (auto s = shared_.find(base); s != shared_.end()) {
    // The block goes back to its pool's segment on private pages again; importers
    // that still map the memfd keep its pages and cannot touch the pool's.
    void* at = reinterpret_cast<void*>(base);
    mmap(at, s->second.footprint, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    close(s->second.fd);
    shared_.erase(s);
  }
  return a;
}

CUresult device_address_space::share(CUdeviceptr base, shared_region* out) {
  std::lock_guard lock(mutex_);
  auto it = live_.find(base);
  if (it == live_.end() || it->second.free_pending) return CUDA_ERROR_INVALID_VALUE;
  const allocation& a = it->second;
  if (a.kind != allocation_kind::synchronous && a.kind != allocation_kind::stream_ordered) return CUDA_ERROR_INVALID_VALUE;
  if (auto s = shared_.find(base); s != shared_.end()) {
    *out = s->second;
    return CUDA_SUCCESS;
  }
  const std::size_t footprint = a.footprint;
  const int fd = memfd_create("gpumem-sim-ipc", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  struct stat st {};
  void* at = reinterpret_cast<void*>(base);
  // Copy the current contents in, then put the memfd's pages at the same address.
  std::size_t written = 0;
  bool ok = ftruncate(fd, static_cast<off_t>(footprint)) == 0 && fstat(fd, &st) == 0;
  while (ok && written < footprint) {
    const ssize_t n = pwrite(fd, static_cast<const std::byte*>(at) + written, footprint - written,
                             static_cast<off_t>(written));
    if (n <= 0) ok = false; else written += static_cast<std::size_t>(n);
  }
  if (!ok || mmap(at, footprint, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  shared_region r;
  r.fd = fd;
  r.footprint = footprint;
  r.inode = static_cast<std::uint64_t>(st.st_ino);
  r.file_device = static_cast<std::uint64_t>(st.st_dev);
  shared_.emplace(base, r);
  *out = r;
  return CUDA_SUCCESS;
}

CUresult device_address_space::map_import(int fd, std::size_t bytes, std::size_t footprint, allocation_kind kind,
                                          CUdeviceptr* out) {
  CUdeviceptr base = 0;
  if (CUresult r = reserve_region(footprint, &base); r != CUDA_SUCCESS) return r;
  if (mmap(reinterpret_cast<void*>(base), footprint, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) ==
      MAP_FAILED) {
    release_region(base, footprint);
    return CUDA_ERROR_INVALID_VALUE;
  }
  allocation a;
  a.base = base;
  a.size = bytes;
  a.footprint = footprint;
  a.device = device_;
  a.kind = kind;
  std::lock_guard lock(mutex_);
  live_.emplace(base, a);
  *out = base;
  return CUDA_SUCCESS;
}

CUresult device_address_space::unmap_import(CUdeviceptr base, allocation_kind kind) {
  std::lock_guard lock(mutex_);
  auto it = live_.find(base);
  if (it == live_.end() || it->second.kind != kind) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t footprint = it->second.footprint;
  live_.erase(it);
  unmap_locked(base, footprint);
  return CUDA_SUCCESS;
}

std::optional<allocation> device_address_space::find(CUdeviceptr p) const {
  const auto lo = reinterpret_cast<CUdeviceptr>(base_);
  if (p < lo || p - lo >= reserved_) return std::nullopt;  // not this device's: no lock needed
  std::lock_guard lock(mutex_);
  auto it = live_.upper_bound(p);  // first allocation starting after p
  if (it == live_.begin()) return std::nullopt;
  --it;
  if (!it->second.contains(p)) return std::nullopt;
  return it->second;
}

bool device_address_space::overlaps_reserved_range(CUdeviceptr p, std::size_t bytes) const {
  const auto lo = reinterpret_cast<CUdeviceptr>(base_);
  const CUdeviceptr hi = lo + reserved_;
  // [p, p + bytes) and [lo, hi) intersect; the caller has checked p + bytes does not wrap.
  return p < hi && p + bytes > lo;
}

std::size_t device_address_space::used_bytes() const {
  std::lock_guard lock(mutex_);
  return used_;
}

std::size_t device_address_space::live_allocations() const {
  std::lock_guard lock(mutex_);
  return live_.size();
}

}  // namespace gpumem::detail::simulator
