// One simulated device's memory: a reserved range of host address space in which
// allocations are placed, with the device's capacity accounting.
//
// The whole range is mapped PROT_NONE (and MAP_NORESERVE, so it costs nothing)
// when the device is created; an allocation makes its pages read/write, a free
// makes them PROT_NONE again and gives the pages back, so a use after free
// faults as it would on a GPU. The range is several times the capacity, so
// address-space fragmentation practically never causes an out-of-memory that
// capacity does not (the real driver remaps pages and so hardly ever fails
// for fragmentation either).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>

#include <cuda.h>

namespace gpumem::detail::simulator {

enum class allocation_kind {
  synchronous,     // cuMemAlloc
  stream_ordered,  // cuMemAllocAsync, from the device's default pool
};

struct allocation {
  CUdeviceptr base = 0;
  std::size_t size = 0;       // as requested: the bounds copies are checked against
  std::size_t footprint = 0;  // rounded up to whole pages: what counts against capacity
  int device = -1;
  allocation_kind kind = allocation_kind::synchronous;
  bool free_pending = false;  // a cuMemFreeAsync is queued and not yet reached

  bool contains(CUdeviceptr p) const { return p >= base && p - base < size; }
};

// What the default pool reports (CU_MEMPOOL_ATTR_*_MEM_*): the live bytes of
// stream-ordered allocations and their high watermarks.
struct pool_usage {
  std::uint64_t current = 0;
  std::uint64_t used_high = 0;
  std::uint64_t reserved_high = 0;
};

class device_address_space {
 public:
  // Reserves the address range. Throws std::bad_alloc if the host has no room for it.
  device_address_space(int device, std::size_t capacity);
  ~device_address_space();
  device_address_space(const device_address_space&) = delete;
  device_address_space& operator=(const device_address_space&) = delete;

  // Placement unit and alignment of allocations: the host page, at least 4 KiB.
  static std::size_t granularity();

  // CUDA_ERROR_OUT_OF_MEMORY when the capacity (or, in pathological cases, the
  // reserved range) has no room. `bytes` must be > 0.
  CUresult allocate(std::size_t bytes, allocation_kind kind, CUdeviceptr* out);
  // Frees the allocation that starts at `base`; CUDA_ERROR_INVALID_VALUE for a
  // pointer that is not the start of a live allocation or whose free is queued.
  CUresult free(CUdeviceptr base);
  // For cuMemFreeAsync: checks like free() and marks the free as queued, so the
  // allocation can neither be freed twice nor used by work queued after it.
  CUresult mark_free_pending(CUdeviceptr base);
  // Completes a free marked pending (when the stream reaches it), or takes the
  // mark back (when queuing the free failed).
  void complete_pending_free(CUdeviceptr base);
  void cancel_pending_free(CUdeviceptr base);

  // The live allocation containing p, if any.
  std::optional<allocation> find(CUdeviceptr p) const;
  // Whether [p, p + bytes) touches this device's reserved range (bytes > 0).
  bool overlaps_reserved_range(CUdeviceptr p, std::size_t bytes) const;

  int device() const { return device_; }
  std::size_t capacity() const { return capacity_; }
  std::size_t used_bytes() const;
  std::size_t live_allocations() const;
  pool_usage stream_ordered_usage() const;
  // Resets a high watermark to the current value (setting it to 0, as the driver allows).
  void reset_used_high();
  void reset_reserved_high();

 private:
  void release_locked(std::map<CUdeviceptr, allocation>::iterator it);

  const int device_;
  const std::size_t capacity_;
  std::byte* base_ = nullptr;
  std::size_t reserved_ = 0;

  mutable std::mutex mutex_;
  std::map<std::size_t, std::size_t> free_ranges_;  // offset -> length, address order, coalesced
  std::map<CUdeviceptr, allocation> live_;          // base -> allocation
  std::size_t used_ = 0;
  pool_usage pool_;
};

}  // namespace gpumem::detail::simulator
