// Stream-ordered memory pools (cuDeviceGetDefaultMemPool, cuMemPoolCreate):
// the driver's caching of freed memory, its reuse rules, its release threshold,
// trimming, attributes and access from other devices.
//
// Note [Pool reuse in stream order]
// A pool reserves *segments* of device memory (counted against the device's
// capacity: RESERVED_MEM_*): 32 MiB for a request up to 32 MiB, else the
// request in 2 MiB granules, as the driver does on an H200 (driver 580); it
// places page-granular *blocks* in
// them (USED_MEM_*). A block freed with cuMemFreeAsync goes back into the pool
// at once, remembering the position of the free in its stream's order. A later
// allocation on stream S may take it without waiting when
//   - the free was on S (stream order makes it safe: this is what lets a tight
//     allocate/free loop run in constant memory, as on a GPU);
//   - REUSE_FOLLOW_EVENT_DEPENDENCIES is on and S's next work is already
//     ordered after the free (an event wait, or the legacy stream's rules:
//     Note [Stream clocks] in sim_stream.hpp);
//   - REUSE_ALLOW_OPPORTUNISTIC is on and the free's stream has reached it;
//   - the host has seen the free complete (a synchronization covered it), which
//     the driver honours whatever the flags say.
// Only when none fits does the pool reserve a new segment; only when that fails
// (capacity, or the pool's maximum size) and REUSE_ALLOW_INTERNAL_DEPENDENCIES
// is on does it take a block whose free is still pending on another stream,
// making S wait for that free on the device (cuStreamWaitEvent-like).
//
// Memory goes back to the device only from whole segments that are entirely
// free, with every free in them seen complete by the host: at a
// synchronization (cuStreamSynchronize, cuEventSynchronize, cuCtxSynchronize),
// down to the release threshold; by cuMemPoolTrimTo, down to its argument;
// and when a destroyed pool's last allocation is freed.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include <cuda.h>

#include "sim/sim_address_space.hpp"
#include "sim/sim_stream.hpp"

namespace gpumem::detail::simulator {

class sim_state;

// What a synchronization tells the host: work up to a stream position (stream
// and event synchronize), or all work of a device's context (context synchronize).
class host_observation {
 public:
  static host_observation of_position(stream_position position);
  static host_observation of_context(int device);
  // Whether the host now knows the work before `p` is complete.
  bool covers(const stream_position& p) const;

 private:
  std::optional<stream_position> position_;
  int device_ = -1;
};

// Tells every pool what the host has seen complete, then lets them release
// memory above their thresholds (see Note [Pool reuse in stream order]).
void observe_synchronization(sim_state& state, const host_observation& seen);

class sim_pool {
 public:
  // Segments are reserved in multiples of this (the driver's 2 MiB granule)...
  static constexpr std::size_t segment_granularity = std::size_t{2} << 20;
  // ...and at least this large where the pool has room (the driver's step, as
  // observed on an H200, driver 580: a 4 KiB request reserves 32 MiB). A pool's
  // maximum size is rounded up to a multiple of it, as the driver's is.
  static constexpr std::size_t segment_step = std::size_t{32} << 20;

  // `max_bytes` 0: no limit beyond the device. `device_count` sizes the access table.
  sim_pool(device_address_space& memory, int device_count, bool is_default,
           CUmemAllocationHandleType handle_types, std::size_t max_bytes);

  int device() const { return memory_.device(); }
  bool is_default() const { return is_default_; }
  CUmemAllocationHandleType handle_types() const { return handle_types_; }
  CUmemoryPool handle() { return reinterpret_cast<CUmemoryPool>(this); }

  // bytes > 0, out non-null. CUDA_ERROR_OUT_OF_MEMORY when nothing can be reused,
  // the device or the pool's maximum has no room for a new segment, and no
  // pending free may be waited for.
  CUresult allocate(std::size_t bytes, const std::shared_ptr<sim_stream>& stream, CUdeviceptr* out);
  // cuMemFreeAsync of a block of this pool. CUDA_ERROR_INVALID_VALUE if `base`
  // is not the start of a live block of this pool.
  CUresult free(CUdeviceptr base, const std::shared_ptr<sim_stream>& stream);

  void observe(const host_observation& seen);
  void trim_to(std::size_t keep_bytes);
  // cuMemPoolDestroy: no new allocations; memory goes back as it is freed.
  void destroy();

  // CU_MEMPOOL_ATTR_*, with the value types and rules cuda.h documents;
  // CUDA_ERROR_INVALID_VALUE for anything else.
  CUresult set_attribute(CUmemPool_attribute attribute, void* value);
  CUresult get_attribute(CUmemPool_attribute attribute, void* value) const;
  // cuMemPoolSetAccess / cuMemPoolGetAccess (descriptors already non-null).
  CUresult set_access(const CUmemAccessDesc* map, std::size_t count);
  CUresult get_access(CUmemAccess_flags* flags, const CUmemLocation& location) const;

 private:
  struct free_block {
    std::size_t size = 0;
    // Where the free sits in stream order; nullopt once the host has seen it
    // complete (or for memory never handed out).
    std::optional<stream_position> freed_at;
  };
  struct segment {
    std::size_t size = 0;
    std::size_t live_bytes = 0;
  };
  using free_iterator = std::map<CUdeviceptr, free_block>::iterator;

  bool reusable_now(const free_block& block, const std::shared_ptr<sim_stream>& stream) const;
  CUdeviceptr take(free_iterator it, std::size_t footprint, std::size_t bytes);
  std::optional<free_iterator> grow(std::size_t footprint);
  void insert_free(CUdeviceptr base, free_block block);
  void erase_free(free_iterator it);
  std::map<CUdeviceptr, segment>::iterator segment_of(CUdeviceptr p);
  void merge_seen_neighbours();
  void release_above(std::size_t keep_bytes);
  void release_if_destroyed();

  device_address_space& memory_;
  const bool is_default_;
  const CUmemAllocationHandleType handle_types_;
  const std::size_t max_bytes_;

  mutable std::mutex mutex_;
  std::map<CUdeviceptr, free_block> free_;               // address order; neighbours merged
  std::set<std::pair<std::size_t, CUdeviceptr>> by_size_;  // the same blocks, best fit first
  std::map<CUdeviceptr, segment> segments_;
  std::size_t reserved_ = 0;
  std::size_t used_ = 0;
  std::size_t reserved_high_ = 0;
  std::size_t used_high_ = 0;
  cuuint64_t release_threshold_ = 0;
  int follow_event_dependencies_ = 1;
  int allow_opportunistic_ = 1;
  int allow_internal_dependencies_ = 1;
  std::vector<CUmemAccess_flags> access_;  // by device ordinal
  bool destroyed_ = false;
};

// Every pool: the devices' default pools and those made by cuMemPoolCreate.
// Created pools are never deleted (a destroyed one lingers until its memory is
// back, and its address is never reused for another handle).
class pool_registry {
 public:
  void add(sim_pool* pool);                   // a default pool, owned by its device
  sim_pool* create(std::unique_ptr<sim_pool> pool);
  sim_pool* find(CUmemoryPool handle) const;  // live pools only
  bool remove(sim_pool* pool);                // cuMemPoolDestroy
  std::vector<sim_pool*> all() const;         // live and destroyed, for synchronizations

 private:
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<sim_pool>> created_;
  std::vector<sim_pool*> all_;
  std::set<const void*> live_;
};

}  // namespace gpumem::detail::simulator
