// One simulated device's memory: a reserved range of host address space in which
// regions are placed, with the device's capacity accounting, and the live
// allocations that pointer queries and copies are checked against.
//
// Two levels. A *region* is what counts against the device's capacity: a
// cuMemAlloc or cuMemAllocManaged allocation, or a segment a memory pool
// reserved. An *allocation* is what a program holds: for cuMemAlloc and
// cuMemAllocManaged the whole region; for a pool, a block inside one of its
// segments (the pool places blocks and adds and removes them here).
//
// The whole range is mapped PROT_NONE (and MAP_NORESERVE, so it costs nothing)
// when the device is created; a region makes its pages read/write, releasing it
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
#include <stdexcept>

#include <cuda.h>

namespace gpumem::detail::simulator {

class sim_pool;

enum class allocation_kind {
  synchronous,     // cuMemAlloc
  managed,         // cuMemAllocManaged
  stream_ordered,  // cuMemAllocAsync / cuMemAllocFromPoolAsync: a block of a pool's segment
  ipc_legacy,      // another process's memory opened with cuIpcOpenMemHandle (sim_ipc.hpp)
  ipc_pool,        // another process's pool block imported with cuMemPoolImportPointer
  graph,           // cuMemAllocAsync under stream capture: an allocation node's memory
};

// An allocation made shareable for IPC: its pages now live in a memfd of their own
// (see Note [Shareable simulated memory] in sim_ipc.hpp).
struct shared_region {
  int fd = -1;                // the memfd, owned by the address space
  std::size_t footprint = 0;  // whole pages
  std::uint64_t inode = 0;    // identifies the memfd to importers (st_dev, st_ino)
  std::uint64_t file_device = 0;
};

struct allocation {
  CUdeviceptr base = 0;
  std::size_t size = 0;       // as requested: the bounds copies are checked against
  std::size_t footprint = 0;  // rounded up to whole pages
  int device = -1;
  allocation_kind kind = allocation_kind::synchronous;
  bool free_pending = false;  // cuMemFreeAsync of cuMemAlloc memory: queued, not yet reached
  bool graph_launched = false;  // a graph allocation: a launch of its graph made it
  std::uint64_t graph_node = 0;  // a graph allocation: its allocation node (sim_graph.cpp)
  sim_pool* pool = nullptr;   // the pool of a stream-ordered block
  unsigned attach = 0;        // CU_MEM_ATTACH_* of managed memory

  bool contains(CUdeviceptr p) const { return p >= base && p - base < size; }
};

// The host has no room for a simulated device's address range (mmap refused even
// the smallest reservation): cuInit reports CUDA_ERROR_OUT_OF_MEMORY. Internal to
// the simulator; never reaches a gpumem caller as such.
struct host_reservation_failed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class device_address_space {
 public:
  // Reserves the address range. Throws host_reservation_failed if the host has no room for it.
  device_address_space(int device, std::size_t capacity);
  ~device_address_space();
  device_address_space(const device_address_space&) = delete;
  device_address_space& operator=(const device_address_space&) = delete;

  // Placement unit and alignment of regions and blocks: the host page, at least 4 KiB.
  static std::size_t granularity();

  // ---- regions ----
  // Places a region of `bytes` rounded up to pages and makes it read/write.
  // CUDA_ERROR_OUT_OF_MEMORY when the capacity (or, in pathological cases, the
  // reserved range) has no room. `bytes` must be > 0.
  CUresult reserve_region(std::size_t bytes, CUdeviceptr* out);
  // Gives a region back (its pages fault from now on). The caller owns it and
  // has removed every allocation inside it.
  void release_region(CUdeviceptr base, std::size_t footprint);

  // ---- capacity without placement: virtual-memory physical handles (sim_vmm.hpp) ----
  // Counts `bytes` against the capacity; CUDA_ERROR_OUT_OF_MEMORY if it has no room.
  CUresult charge(std::size_t bytes);
  void uncharge(std::size_t bytes);

  // ---- allocations that are whole regions: cuMemAlloc, cuMemAllocManaged ----
  CUresult allocate(std::size_t bytes, allocation_kind kind, unsigned attach, CUdeviceptr* out);
  // Frees the allocation that starts at `base`; CUDA_ERROR_INVALID_VALUE for a
  // pointer that is not the start of such a live allocation or whose free is queued.
  CUresult free(CUdeviceptr base);
  // For cuMemFreeAsync of such memory: checks like free() and marks the free as
  // queued, so the allocation can neither be freed twice nor used by work queued after it.
  CUresult mark_free_pending(CUdeviceptr base);
  // The graph allocation at `base` belongs to allocation node `node`.
  void set_graph_node(CUdeviceptr base, std::uint64_t node);
  // A launch of the graph whose node `node` allocated `base` made it.
  void mark_graph_launched(CUdeviceptr base, std::uint64_t node);
  // Node `node`'s allocation at `base`, if no launch made it, goes back (its graph
  // and every executable of it are gone: its address may be handed out again).
  void release_unlaunched_graph_allocation(CUdeviceptr base, std::uint64_t node);
  // Completes a free marked pending (when the stream reaches it), or takes the
  // mark back (when queuing the free failed).
  void complete_pending_free(CUdeviceptr base);
  void cancel_pending_free(CUdeviceptr base);

  // ---- pool blocks inside a pool's regions ----
  void add_block(const allocation& block);
  // Removes the live block of `pool` that starts at `base`; nullopt if there is none.
  std::optional<allocation> remove_block(CUdeviceptr base, const sim_pool* pool);

  // ---- IPC (sim_ipc.hpp) ----
  // Moves the pages of the live allocation starting at `base` (cuMemAlloc or a pool
  // block) into a memfd of their own, mapped at the same address, once; returns it.
  // The caller has waited for the device's work. CUDA_ERROR_INVALID_VALUE if `base`
  // does not start such an allocation.
  CUresult share(CUdeviceptr base, shared_region* out);
  // Maps `bytes` of another process's memfd (`fd`, not taken) at a new place in this
  // device's range as a live allocation of `kind`.
  CUresult map_import(int fd, std::size_t bytes, std::size_t footprint, allocation_kind kind, CUdeviceptr* out);
  // Unmaps an imported allocation of `kind` starting at `base`.
  CUresult unmap_import(CUdeviceptr base, allocation_kind kind);

  // The live allocation containing p, if any.
  std::optional<allocation> find(CUdeviceptr p) const;
  // Whether [p, p + bytes) touches this device's reserved range (bytes > 0).
  bool overlaps_reserved_range(CUdeviceptr p, std::size_t bytes) const;

  int device() const { return device_; }
  std::size_t capacity() const { return capacity_; }
  // Bytes of capacity in regions (what cuMemGetInfo reports as not free).
  std::size_t used_bytes() const;
  std::size_t live_allocations() const;

 private:
  void unmap_locked(CUdeviceptr base, std::size_t footprint);
  // Forgets the shared memfds of allocations in [base, base + footprint): their pages
  // stay with whoever still maps them (importers), this range gets fresh ones.
  void unshare_locked(CUdeviceptr base, std::size_t footprint);

  const int device_;
  const std::size_t capacity_;
  std::byte* base_ = nullptr;
  std::size_t reserved_ = 0;

  mutable std::mutex mutex_;
  std::map<std::size_t, std::size_t> free_ranges_;  // offset -> length, address order, coalesced
  std::map<CUdeviceptr, allocation> live_;          // base -> allocation
  std::size_t used_ = 0;
  std::map<CUdeviceptr, shared_region> shared_;    // base -> memfd, for allocations exported
};

}  // namespace gpumem::detail::simulator
