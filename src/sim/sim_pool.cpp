// Stream-ordered memory pools and their entry points (cuMemAllocAsync,
// cuMemAllocFromPoolAsync, cuMemFreeAsync, cuMemPool*, cuDevice*MemPool): see
// Note [Pool reuse in stream order] in sim_pool.hpp.
#include "sim/sim_pool.hpp"

#include <algorithm>
#include <limits>

#include "sim/sim_entry_points.hpp"
#include "sim/sim_graph.hpp"
#include "sim/sim_capture_rules.hpp"
#include "sim/sim_ipc.hpp"
#include "sim/sim_memory.hpp"
#include "sim/sim_state.hpp"

namespace gpumem::detail::simulator {
namespace {

std::size_t round_up(std::size_t n, std::size_t unit) { return (n + unit - 1) / unit * unit; }

}  // namespace

// ---- host_observation ----

host_observation host_observation::of_position(stream_position position) {
  host_observation seen;
  seen.position_ = std::move(position);
  return seen;
}

host_observation host_observation::of_context(int device) {
  host_observation seen;
  seen.device_ = device;
  return seen;
}

bool host_observation::covers(const stream_position& p) const {
  if (position_) return position_->covers(p.stream->id(), p.sequence);
  return p.stream->device() == device_ && p.reached();
}

void observe_synchronization(sim_state& state, const host_observation& seen) {
  for (sim_pool* pool : state.pools.all()) pool->observe(seen);
}

// ---- sim_pool ----

sim_pool::sim_pool(device_address_space& memory, int device_count, bool is_default,
                   CUmemAllocationHandleType handle_types, std::size_t max_bytes)
    : memory_(memory),
      is_default_(is_default),
      handle_types_(handle_types),
      // The driver lets a pool reserve up to its maximum rounded up to its step
      // (observed on an H200: maxSize 2 MiB holds two 2 MiB allocations).
      max_bytes_(max_bytes == 0 ? memory.capacity()
                                : max_bytes > std::numeric_limits<std::size_t>::max() - segment_step
                                    ? max_bytes
                                    : round_up(max_bytes, segment_step)),
      access_(static_cast<std::size_t>(device_count), CU_MEM_ACCESS_FLAGS_PROT_NONE) {
  access_[static_cast<std::size_t>(memory.device())] = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

std::map<CUdeviceptr, sim_pool::segment>::iterator sim_pool::segment_of(CUdeviceptr p) {
  auto it = segments_.upper_bound(p);
  return std::prev(it);  // callers pass addresses inside a segment
}

void sim_pool::insert_free(CUdeviceptr base, free_block block) {
  by_size_.emplace(block.size, base);
  free_.emplace(base, std::move(block));
}

void sim_pool::erase_free(free_iterator it) {
  by_size_.erase({it->second.size, it->first});
  free_.erase(it);
}

bool sim_pool::reusable_now(const free_block& block, const std::shared_ptr<sim_stream>& stream) const {
  if (!block.freed_at) return true;  // seen complete by the host, or never used
  const stream_position& at = *block.freed_at;
  if (at.stream == stream) return true;  // stream order covers it
  if (follow_event_dependencies_ != 0 && next_work_ordered_after(stream, at.stream->id(), at.sequence)) {
    return true;
  }
  return allow_opportunistic_ != 0 && at.reached();
}

CUdeviceptr sim_pool::take(free_iterator it, std::size_t footprint, std::size_t bytes) {
  const CUdeviceptr base = it->first;
  free_block block = std::move(it->second);
  erase_free(it);
  if (block.size > footprint) {
    // The rest keeps the free's position: it is the same memory, freed at the same point.
    insert_free(base + footprint, free_block{block.size - footprint, block.freed_at});
  }
  segment_of(base)->second.live_bytes += footprint;
  used_ += footprint;
  used_high_ = std::max(used_high_, used_);
  allocation a;
  a.base = base;
  a.size = bytes;
  a.footprint = footprint;
  a.device = device();
  a.kind = allocation_kind::stream_ordered;
  a.pool = this;
  memory_.add_block(a);
  return base;
}

std::optional<sim_pool::free_iterator> sim_pool::grow(std::size_t footprint) {
  // A whole step for a small request, where the pool and the device have room
  // for it; else just the request, in granules.
  const std::size_t needed = round_up(footprint, segment_granularity);
  if (needed < footprint) return std::nullopt;
  auto fits = [&](std::size_t size) { return size <= max_bytes_ && reserved_ <= max_bytes_ - size; };
  std::size_t size = 0;
  CUdeviceptr base = 0;
  if (needed < segment_step && fits(segment_step) && memory_.reserve_region(segment_step, &base) == CUDA_SUCCESS) {
    size = segment_step;
  } else if (fits(needed) && memory_.reserve_region(needed, &base) == CUDA_SUCCESS) {
    size = needed;
  } else {
    return std::nullopt;
  }
  segments_.emplace(base, segment{size, 0});
  reserved_ += size;
  reserved_high_ = std::max(reserved_high_, reserved_);
  insert_free(base, free_block{size, std::nullopt});
  return free_.find(base);
}

CUresult sim_pool::allocate(std::size_t bytes, const std::shared_ptr<sim_stream>& stream, CUdeviceptr* out) {
  const std::size_t unit = device_address_space::granularity();
  if (bytes > std::numeric_limits<std::size_t>::max() - segment_granularity) return CUDA_ERROR_OUT_OF_MEMORY;
  const std::size_t footprint = round_up(bytes, unit);

  std::lock_guard lock(mutex_);
  if (destroyed_) return CUDA_ERROR_INVALID_VALUE;  // a current pool destroyed meanwhile
  // 1. Memory that may be reused without waiting, best fit first.
  for (auto it = by_size_.lower_bound({footprint, 0}); it != by_size_.end(); ++it) {
    auto block = free_.find(it->second);
    if (reusable_now(block->second, stream)) {
      *out = take(block, footprint, bytes);
      return CUDA_SUCCESS;
    }
  }
  // 2. A new segment.
  if (auto grown = grow(footprint)) {
    *out = take(*grown, footprint, bytes);
    return CUDA_SUCCESS;
  }
  // 3. A free still pending on another stream: `stream` waits for it on the device.
  if (allow_internal_dependencies_ != 0) {
    for (auto it = by_size_.lower_bound({footprint, 0}); it != by_size_.end(); ++it) {
      auto block = free_.find(it->second);
      if (enqueue(stream, [] {}, {*block->second.freed_at}) == CUDA_SUCCESS) {
        *out = take(block, footprint, bytes);
        return CUDA_SUCCESS;
      }
    }
  }
  return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult sim_pool::free(CUdeviceptr base, const std::shared_ptr<sim_stream>& stream) {
  // Removed from the live allocations at once: a second free, or a copy queued
  // after this one, is refused at the call.
  std::optional<allocation> a = memory_.remove_block(base, this);
  if (!a) return CUDA_ERROR_INVALID_VALUE;
  stream_position at;
  if (CUresult r = order_point(stream, &at); r != CUDA_SUCCESS) {
    memory_.add_block(*a);
    return r;
  }

  std::lock_guard lock(mutex_);
  segment_of(base)->second.live_bytes -= a->footprint;
  used_ -= a->footprint;

  // Merge with free neighbours in the same segment whose frees are
  // interchangeable with this one: frees on the same stream (the later one
  // stands for both) or frees the host has seen complete (never, for a new free).
  free_block block{a->footprint, std::move(at)};
  CUdeviceptr start = base;
  const auto seg = segment_of(base);
  const CUdeviceptr seg_end = seg->first + seg->second.size;
  auto same_stream = [&](const free_block& other) {
    return other.freed_at && other.freed_at->stream == block.freed_at->stream;
  };
  if (start + block.size < seg_end) {
    auto next = free_.find(start + block.size);
    if (next != free_.end() && same_stream(next->second)) {
      if (next->second.freed_at->sequence > block.freed_at->sequence) block.freed_at = next->second.freed_at;
      block.size += next->second.size;
      erase_free(next);
    }
  }
  auto after = free_.lower_bound(start);
  if (after != free_.begin()) {
    auto previous = std::prev(after);
    if (previous->first >= seg->first && previous->first + previous->second.size == start &&
        same_stream(previous->second)) {
      if (previous->second.freed_at->sequence > block.freed_at->sequence) block.freed_at = previous->second.freed_at;
      block.size += previous->second.size;
      start = previous->first;
      erase_free(previous);
    }
  }
  insert_free(start, std::move(block));
  if (destroyed_) release_if_destroyed();
  return CUDA_SUCCESS;
}

void sim_pool::merge_seen_neighbours() {
  // One pass in address order: runs of adjacent seen blocks in one segment become one block.
  for (auto seg = segments_.begin(); seg != segments_.end(); ++seg) {
    const CUdeviceptr end = seg->first + seg->second.size;
    auto it = free_.lower_bound(seg->first);
    while (it != free_.end() && it->first < end) {
      auto next = free_.find(it->first + it->second.size);
      if (next != free_.end() && next->first < end && !it->second.freed_at && !next->second.freed_at) {
        const std::size_t merged = it->second.size + next->second.size;
        const CUdeviceptr at = it->first;
        erase_free(next);
        by_size_.erase({it->second.size, at});
        it->second.size = merged;
        by_size_.emplace(merged, at);
        continue;  // try to grow the same block further
      }
      ++it;
    }
  }
}

void sim_pool::release_above(std::size_t keep_bytes) {
  for (auto seg = segments_.begin(); seg != segments_.end();) {
    const std::size_t size = seg->second.size;
    auto block = free_.find(seg->first);
    const bool whole_and_seen = seg->second.live_bytes == 0 && block != free_.end() &&
                                block->second.size == size && !block->second.freed_at;
    if (whole_and_seen && reserved_ >= size && reserved_ - size >= keep_bytes) {
      erase_free(block);
      memory_.release_region(seg->first, size);
      reserved_ -= size;
      seg = segments_.erase(seg);
    } else {
      ++seg;
    }
  }
}

void sim_pool::release_if_destroyed() {
  // Nobody can allocate from a destroyed pool any more: a free that has been
  // reached is as good as one the host saw.
  for (auto& [base, block] : free_) {
    if (block.freed_at && block.freed_at->reached()) block.freed_at.reset();
  }
  merge_seen_neighbours();
  release_above(0);
}

void sim_pool::observe(const host_observation& seen) {
  std::lock_guard lock(mutex_);
  bool changed = false;
  for (auto& [base, block] : free_) {
    if (block.freed_at && seen.covers(*block.freed_at)) {
      block.freed_at.reset();
      changed = true;
    }
  }
  if (changed) merge_seen_neighbours();
  if (destroyed_) {
    release_if_destroyed();
  } else if (reserved_ > release_threshold_) {
    release_above(static_cast<std::size_t>(
        std::min<cuuint64_t>(release_threshold_, std::numeric_limits<std::size_t>::max())));
  }
}

void sim_pool::trim_to(std::size_t keep_bytes) {
  std::lock_guard lock(mutex_);
  release_above(keep_bytes);
}

void sim_pool::destroy() {
  std::lock_guard lock(mutex_);
  destroyed_ = true;
  release_if_destroyed();
}

CUresult sim_pool::set_attribute(CUmemPool_attribute attribute, void* value) {
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(mutex_);
  switch (attribute) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      release_threshold_ = *static_cast<cuuint64_t*>(value);
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
      follow_event_dependencies_ = *static_cast<int*>(value);
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
      allow_opportunistic_ = *static_cast<int*>(value);
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      allow_internal_dependencies_ = *static_cast<int*>(value);
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      // A high watermark can only be reset, by setting 0: it becomes the current value.
      if (*static_cast<cuuint64_t*>(value) != 0) return CUDA_ERROR_INVALID_VALUE;
      if (attribute == CU_MEMPOOL_ATTR_USED_MEM_HIGH) {
        used_high_ = used_;
      } else {
        reserved_high_ = reserved_;
      }
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;  // the *_CURRENT values are read-only
  }
}

CUresult sim_pool::get_attribute(CUmemPool_attribute attribute, void* value) const {
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(mutex_);
  switch (attribute) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      *static_cast<cuuint64_t*>(value) = release_threshold_;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
      *static_cast<int*>(value) = follow_event_dependencies_;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
      *static_cast<int*>(value) = allow_opportunistic_;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      *static_cast<int*>(value) = allow_internal_dependencies_;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
      *static_cast<cuuint64_t*>(value) = reserved_;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      *static_cast<cuuint64_t*>(value) = reserved_high_;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
      *static_cast<cuuint64_t*>(value) = used_;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      *static_cast<cuuint64_t*>(value) = used_high_;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult sim_pool::set_access(const CUmemAccessDesc* map, std::size_t count) {
  // The driver checks the whole map before changing anything.
  for (std::size_t i = 0; i < count; ++i) {
    const CUmemAccessDesc& d = map[i];
    if (d.location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (d.location.id < 0 || static_cast<std::size_t>(d.location.id) >= access_.size()) {
      return CUDA_ERROR_INVALID_DEVICE;
    }
    if (d.flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && d.flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        d.flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    // The owning device's read-write access cannot be changed.
    if (d.location.id == device() && d.flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      return CUDA_ERROR_INVALID_DEVICE;
    }
  }
  std::lock_guard lock(mutex_);
  for (std::size_t i = 0; i < count; ++i) access_[static_cast<std::size_t>(map[i].location.id)] = map[i].flags;
  return CUDA_SUCCESS;
}

CUresult sim_pool::get_access(CUmemAccess_flags* flags, const CUmemLocation& location) const {
  if (location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  if (location.id < 0 || static_cast<std::size_t>(location.id) >= access_.size()) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard lock(mutex_);
  *flags = access_[static_cast<std::size_t>(location.id)];
  return CUDA_SUCCESS;
}

// ---- pool_registry ----

void pool_registry::add(sim_pool* pool) {
  std::lock_guard lock(mutex_);
  all_.push_back(pool);
  live_.insert(pool);
}

sim_pool* pool_registry::create(std::unique_ptr<sim_pool> pool) {
  std::lock_guard lock(mutex_);
  sim_pool* raw = pool.get();
  created_.push_back(std::move(pool));
  all_.push_back(raw);
  live_.insert(raw);
  return raw;
}

sim_pool* pool_registry::find(CUmemoryPool handle) const {
  std::lock_guard lock(mutex_);
  // Only ever dereferenced after being found here: a made-up handle is an error, not a crash.
  return live_.count(handle) != 0 ? reinterpret_cast<sim_pool*>(handle) : nullptr;
}

bool pool_registry::remove(sim_pool* pool) {
  std::lock_guard lock(mutex_);
  return live_.erase(pool) != 0;
}

std::vector<sim_pool*> pool_registry::all() const {
  std::lock_guard lock(mutex_);
  return all_;
}

// ---- entry points ----

namespace {

sim_device* device_of_pool(sim_state& state, const sim_pool& pool) { return state.device(pool.device()); }

}  // namespace

CUresult mem_alloc_async(CUdeviceptr* pointer, std::size_t bytes, CUstream stream_handle) {
  return entry_point([&](sim_state& state) {
    std::shared_ptr<sim_stream> stream;
    if (CUresult r = resolve_stream(state, stream_handle, stream); r != CUDA_SUCCESS) return r;
    sim_context* context = nullptr;
    if (CUresult r = require_current_context(context); r != CUDA_SUCCESS) return r;
    // The pool is the stream's device's; gpumem always has that device current.
    if (stream->device() != context->device()) return CUDA_ERROR_INVALID_VALUE;
    if (pointer == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    if (stream->capturing()) return allocate_graph_memory(state, stream, bytes, pointer);  // sim_graph.hpp
    if (CUresult r = unsafe_call_permitted(); r != CUDA_SUCCESS) return r;  // sim_capture_rules.hpp
    if (state.faults.should_fail_allocation()) return CUDA_ERROR_OUT_OF_MEMORY;
    // From the device's current pool; usable by work queued after this call on `stream`.
    sim_pool* pool = state.device(stream->device())->current_pool.load(std::memory_order_acquire);
    return pool->allocate(bytes, stream, pointer);
  });
}

CUresult mem_alloc_from_pool_async(CUdeviceptr* pointer, std::size_t bytes, CUmemoryPool pool_handle,
                                   CUstream stream_handle) {
  return entry_point([&](sim_state& state) {
    std::shared_ptr<sim_stream> stream;
    if (CUresult r = resolve_stream(state, stream_handle, stream); r != CUDA_SUCCESS) return r;
    sim_pool* pool = state.pools.find(pool_handle);
    if (pool == nullptr || pointer == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    if (!stream->capturing()) {
      if (CUresult r = unsafe_call_permitted(); r != CUDA_SUCCESS) return r;  // sim_capture_rules.hpp
    }
    if (state.faults.should_fail_allocation()) return CUDA_ERROR_OUT_OF_MEMORY;
    // The pool may be of another device than the stream, as in CUDA.
    return pool->allocate(bytes, stream, pointer);
  });
}

CUresult mem_free_async(CUdeviceptr pointer, CUstream stream_handle) {
  return entry_point([&](sim_state& state) {
    std::shared_ptr<sim_stream> stream;
    if (CUresult r = resolve_stream(state, stream_handle, stream); r != CUDA_SUCCESS) return r;
    auto a = find_allocation(state, pointer);
    if (!a || a->base != pointer) return CUDA_ERROR_INVALID_VALUE;
    if (!stream->capturing()) {
      if (CUresult r = unsafe_call_permitted(); r != CUDA_SUCCESS) return r;  // sim_capture_rules.hpp
    }
    if (a->kind == allocation_kind::stream_ordered) return a->pool->free(pointer, stream);
    if (a->kind == allocation_kind::graph) return free_graph_memory(state, *a, stream);  // sim_graph.hpp
    if (stream->capturing()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  // only the graph's own memory
    // cuMemAlloc / cuMemAllocManaged memory: marked now, so a second free or a
    // copy queued after this one is refused at the call; the memory returns to
    // the device when the stream reaches the free.
    device_address_space& memory = state.device(a->device)->memory;
    if (CUresult r = memory.mark_free_pending(pointer); r != CUDA_SUCCESS) return r;
    CUresult r = enqueue(stream, [&memory, pointer] { memory.complete_pending_free(pointer); });
    if (r != CUDA_SUCCESS) memory.cancel_pending_free(pointer);
    return r;
  });
}

CUresult device_get_default_mem_pool(CUmemoryPool* pool, CUdevice device) {
  return entry_point([&](sim_state& state) {
    if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
    sim_device* d = state.device(device);
    if (d == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    *pool = d->default_pool.handle();
    return CUDA_SUCCESS;
  });
}

CUresult device_get_mem_pool(CUmemoryPool* pool, CUdevice device) {
  return entry_point([&](sim_state& state) {
    if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
    sim_device* d = state.device(device);
    if (d == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    *pool = d->current_pool.load(std::memory_order_acquire)->handle();
    return CUDA_SUCCESS;
  });
}

CUresult device_set_mem_pool(CUdevice device, CUmemoryPool pool_handle) {
  return entry_point([&](sim_state& state) {
    sim_device* d = state.device(device);
    if (d == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    sim_pool* pool = state.pools.find(pool_handle);
    if (pool == nullptr || pool->device() != device) return CUDA_ERROR_INVALID_VALUE;
    d->current_pool.store(pool, std::memory_order_release);
    return CUDA_SUCCESS;
  });
}

CUresult mem_pool_create(CUmemoryPool* pool, const CUmemPoolProps* props) {
  return entry_point([&](sim_state& state) {
    if (pool == nullptr || props == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
    if (std::any_of(std::begin(props->reserved), std::end(props->reserved), [](unsigned char c) { return c != 0; })) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (props->win32SecurityAttributes != nullptr) return CUDA_ERROR_INVALID_VALUE;
    // Host and NUMA pools, and the usage flags, are not modelled.
    if (props->location.type != CU_MEM_LOCATION_TYPE_DEVICE || props->usage != 0) return CUDA_ERROR_NOT_SUPPORTED;
    sim_device* d = state.device(props->location.id);
    if (d == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    // IPC: POSIX file descriptors only (what cuDeviceGetAttribute says is supported).
    if (props->handleTypes != CU_MEM_HANDLE_TYPE_NONE &&
        props->handleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    // The driver refuses a maxSize far past the device (2^50 bytes on an H100) with
    // CUDA_ERROR_OUT_OF_MEMORY; the simulator refuses anything past its capacity.
    if (props->maxSize > d->memory.capacity()) return CUDA_ERROR_OUT_OF_MEMORY;
    sim_pool* created = state.pools.create(std::make_unique<sim_pool>(
        d->memory, state.device_count(), false, props->handleTypes, props->maxSize));
    *pool = created->handle();
    return CUDA_SUCCESS;
  });
}

CUresult mem_pool_destroy(CUmemoryPool pool_handle) {
  return entry_point([&](sim_state& state) {
    if (destroy_imported_pool(pool_handle)) return CUDA_SUCCESS;  // another process's pool (sim_ipc.hpp)
    sim_pool* pool = state.pools.find(pool_handle);
    if (pool == nullptr || pool->is_default()) return CUDA_ERROR_INVALID_VALUE;
    if (!state.pools.remove(pool)) return CUDA_ERROR_INVALID_VALUE;  // a concurrent destroy won
    // Destroying a device's current pool makes its default pool current again.
    sim_device* d = device_of_pool(state, *pool);
    sim_pool* expected = pool;
    d->current_pool.compare_exchange_strong(expected, &d->default_pool, std::memory_order_acq_rel);
    pool->destroy();
    return CUDA_SUCCESS;
  });
}

CUresult mem_pool_set_attribute(CUmemoryPool pool, CUmemPool_attribute attribute, void* value) {
  return entry_point([&](sim_state& state) {
    sim_pool* p = state.pools.find(pool);
    return p != nullptr ? p->set_attribute(attribute, value) : CUDA_ERROR_INVALID_VALUE;
  });
}

CUresult mem_pool_get_attribute(CUmemoryPool pool, CUmemPool_attribute attribute, void* value) {
  return entry_point([&](sim_state& state) {
    sim_pool* p = state.pools.find(pool);
    return p != nullptr ? p->get_attribute(attribute, value) : CUDA_ERROR_INVALID_VALUE;
  });
}

CUresult mem_pool_trim_to(CUmemoryPool pool, std::size_t min_bytes_to_keep) {
  return entry_point([&](sim_state& state) {
    sim_pool* p = state.pools.find(pool);
    if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
    p->trim_to(min_bytes_to_keep);
    return CUDA_SUCCESS;
  });
}

CUresult mem_pool_set_access(CUmemoryPool pool, const CUmemAccessDesc* map, std::size_t count) {
  return entry_point([&](sim_state& state) {
    if (map == nullptr && count != 0) return CUDA_ERROR_INVALID_VALUE;
    sim_pool* p = state.pools.find(pool);
    if (p != nullptr) return p->set_access(map, count);
    // Another process's pool (sim_ipc.hpp): checked as sim_pool::set_access checks.
    const int owner = imported_pool_device(pool);
    if (owner < 0) return CUDA_ERROR_INVALID_VALUE;
    for (std::size_t i = 0; i < count; ++i) {
      const CUmemAccessDesc& d = map[i];
      if (d.location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
      if (state.device(d.location.id) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
      if (d.flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && d.flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
          d.flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      if (d.location.id == owner && d.flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) return CUDA_ERROR_INVALID_DEVICE;
    }
    return CUDA_SUCCESS;
  });
}

CUresult mem_pool_get_access(CUmemAccess_flags* flags, CUmemoryPool pool, CUmemLocation* location) {
  return entry_point([&](sim_state& state) {
    sim_pool* p = state.pools.find(pool);
    if (p == nullptr || flags == nullptr || location == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return p->get_access(flags, *location);
  });
}

}  // namespace gpumem::detail::simulator
