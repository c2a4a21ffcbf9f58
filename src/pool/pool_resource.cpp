// pool_resource: construction, the hot path (allocate and free on a stream's own
// arena), block splitting and coalescing, and statistics.
#include "gpumem/pool_resource.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "driver/driver.hpp"
#include "text.hpp"
#include "gpumem/error.hpp"
#include "pool/pool_impl.hpp"
#include "stream_device.hpp"

namespace gpumem {
namespace {

std::atomic<std::uint64_t> next_pool_id{1};

// The last arena this thread used, so the hot path finds it with two compares.
struct arena_cache {
  std::uint64_t pool_id = 0;
  std::uintptr_t key = 0;
  detail::arena* arena = nullptr;
};
// initial-exec: a plain TLS load, not a __tls_get_addr call, on the hot path.
thread_local arena_cache last_arena __attribute__((tls_model("initial-exec")));
thread_local char per_thread_stream_tag __attribute__((tls_model("initial-exec")));

// Arena key: the stream handle, with the two default streams made explicit.
// The per-thread default stream is a different stream on every thread.
std::uintptr_t key_of(CUstream s) noexcept {
  if (s == nullptr || s == CU_STREAM_LEGACY) return reinterpret_cast<std::uintptr_t>(CU_STREAM_LEGACY);
  if (s == CU_STREAM_PER_THREAD) return reinterpret_cast<std::uintptr_t>(&per_thread_stream_tag) | 3U;
  return reinterpret_cast<std::uintptr_t>(s);
}

}  // namespace

pool_resource::impl::impl(memory_resource& up, std::shared_ptr<memory_resource> owned, pool_options o)
    : upstream(&up), owned_upstream(std::move(owned)), opt(o), id(next_pool_id.fetch_add(1)) {
  const resource_properties props = up.properties();
  if (props.device < 0 || !props.device_accessible) {
    throw logic_error("gpumem::pool_resource: the upstream must hand out device memory");
  }
  device = props.device;
  if (opt.fence_interval == 0) throw logic_error("gpumem::pool_resource: fence_interval must be at least 1");
  if (opt.min_chunk_bytes < granule || opt.max_chunk_bytes < opt.min_chunk_bytes) {
    throw logic_error("gpumem::pool_resource: need 256 <= min_chunk_bytes <= max_chunk_bytes");
  }
  if (opt.maximum_bytes != 0 && opt.initial_bytes > opt.maximum_bytes) {
    throw logic_error("gpumem::pool_resource: initial_bytes exceeds maximum_bytes");
  }
  opt.min_chunk_bytes = (opt.min_chunk_bytes + granule - 1) & ~(granule - 1);
  if (opt.refuse_capture && opt.watch_captures) {
    watch = std::make_unique<capture_watch>();
    watched = !watch->source().empty();
  }
  periodic_fences = opt.fence_interval != std::numeric_limits<unsigned>::max() ||
                    opt.fence_bytes != std::numeric_limits<std::size_t>::max();
  if (opt.initial_bytes > 0) {
    // Allocated synchronously: usable by every stream, so its blocks start fenced (epoch 0).
    const std::size_t bytes = (opt.initial_bytes + granule - 1) & ~(granule - 1);
    void* p = upstream->allocate_sync(bytes);
    detail::arena& a = create_arena(key_of(CU_STREAM_LEGACY), CU_STREAM_LEGACY);
    add_chunk(a, reinterpret_cast<std::uintptr_t>(p), bytes, 0);
  }
}

pool_resource::impl::~impl() {
  std::size_t live_count = 0;
  std::size_t live_bytes = 0;
  for (auto& [key, a] : arenas) {
    live_count += a->live.size() - a->quick.count();
    live_bytes += a->used_bytes;
  }
  if (live_count != 0) {
    std::fprintf(stderr, "gpumem: pool_resource on device %d destroyed with %zu live allocation(s), %zu bytes; "
                 "returning their memory to the upstream\n", device, live_count, live_bytes);
  }
  try {
    // Every free must be complete before chunks go back upstream.
    detail::device_context_guard guard(device);
    GPUMEM_CU(cuCtxSynchronize);
    for (auto& [base, c] : chunks) upstream->deallocate_sync(reinterpret_cast<void*>(base), c->size);
    for (auto& [key, a] : arenas) {
      if (a->fence != nullptr) (void)detail::driver().cuEventDestroy(a->fence);
    }
    if (maintenance != nullptr) (void)detail::driver().cuStreamDestroy(maintenance);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpumem: pool_resource teardown: %s\n", e.what());
  }
}

detail::arena& pool_resource::impl::arena_for(stream_view s, const char* call) {
  const std::uintptr_t key = key_of(s.handle());
  const arena_cache& cache = last_arena;
  if (cache.pool_id == id && cache.key == key) [[likely]] {
    return *cache.arena;
  }
  return find_arena(key, s, call);
}

// Out of line so that the hit path above needs no stack frame.
detail::arena& pool_resource::impl::find_arena(std::uintptr_t key, stream_view s, const char* call) {
  arena_cache& cache = last_arena;
  detail::arena* found = nullptr;
  {
    std::shared_lock lock(arenas_mutex);
    auto it = arenas.find(key);
    if (it != arenas.end()) found = it->second.get();
  }
  if (found == nullptr) found = &create_arena(key, s.handle(), call);
  cache = {id, key, found};
  return *found;
}

detail::arena& pool_resource::impl::create_arena(std::uintptr_t key, CUstream s, const char* call) {
  CUstream normalized = s == nullptr ? CU_STREAM_LEGACY : s;
  // Before any other driver call on the stream: on a capturing stream they fail and
  // invalidate the program's capture. Also how the capture watch learns of a
  // capture that began before it (driver/capture_watch_state.hpp).
  if (opt.refuse_capture && detail::new_stream_is_capturing(normalized, device)) {
    detail::throw_capturing("pool_resource", call, normalized);
  }
  {
    // A stream of another device would order nothing useful: refuse it once, here.
    detail::device_context_guard guard(device);
    CUdevice dev{};
    GPUMEM_CU(cuStreamGetDevice, normalized, &dev);
    if (static_cast<int>(dev) != device) {
      throw logic_error("gpumem::pool_resource: the stream belongs to device " + std::to_string(dev) +
                        ", the pool to device " + std::to_string(device));
    }
  }
  std::unique_lock lock(arenas_mutex);
  auto& slot = arenas[key];
  if (!slot) slot = std::make_unique<detail::arena>(normalized);
  if (arenas.size() > 1) several_streams.store(true, std::memory_order_relaxed);
  return *slot;
}

namespace {
// A new record for the first `bytes` of `b`, linked before it in the chunk; `b`
// keeps the rest. The caller sets b's new size (through the index when b is in it).
detail::block* split_off_front(detail::arena& a, detail::block* b, std::size_t bytes) {
  detail::block* f = a.slab.make();
  f->address = b->address;
  f->size = bytes;
  f->owner = b->owner;
  f->prev_in_chunk = b->prev_in_chunk;
  f->next_in_chunk = b;
  if (b->prev_in_chunk != nullptr) b->prev_in_chunk->next_in_chunk = f;
  else b->owner->first = f;
  b->prev_in_chunk = f;
  b->address += bytes;
  return f;
}
}  // namespace

// Hands out the front of `b` (a free block in the arena's index). When the rest is
// a granule or more, `b` keeps it, and its place in the index unless its size class
// changes; the request gets a new record. So a split is one index update, not a
// removal and an insertion (W2).
void* pool_resource::impl::carve(detail::arena& a, detail::block* b, std::size_t size,
                                 std::size_t requested, std::size_t alignment) {
  const std::uintptr_t aligned = (b->address + alignment - 1) & ~(std::uintptr_t{alignment} - 1);
  if (aligned != b->address) {
    // Leave the misaligned front as a free block of its own.
    detail::block* front = split_off_front(a, b, aligned - b->address);
    front->free = true;
    front->free_epoch = b->free_epoch;
    a.free.insert(front);
    a.free.resize(b, b->size - front->size);
  }
  detail::block* out = b;
  if (b->size - size >= granule) {
    out = split_off_front(a, b, size);
    a.free.resize(b, b->size - size);
  } else {
    a.free.remove(b);
  }
  out->free = false;
  out->requested_bytes = requested;
  a.live.insert(out->address, out);
  a.used_bytes += out->size;
  return reinterpret_cast<void*>(out->address);
}

// Marks `b` free and coalesces it with free neighbours (the same chunk's, so the
// same arena's). The lower free neighbour, or else the upper one, absorbs it and
// keeps its record and mostly its place in the index (see carve).
void pool_resource::impl::free_into(detail::arena& a, detail::block* b, std::uint64_t epoch) {
  b->free = true;
  b->free_epoch = epoch;
  detail::block* const prev = b->prev_in_chunk;
  detail::block* const next = b->next_in_chunk;
  const bool next_free = next != nullptr && next->free;
  if (prev != nullptr && prev->free) {
    std::size_t merged = prev->size + b->size;
    std::uint64_t e = std::max(prev->free_epoch, b->free_epoch);
    detail::block* after = next;
    if (next_free) {
      a.free.remove(next);
      merged += next->size;
      e = std::max(e, next->free_epoch);
      after = next->next_in_chunk;
      a.slab.recycle(next);
    }
    prev->next_in_chunk = after;
    if (after != nullptr) after->prev_in_chunk = prev;
    prev->free_epoch = e;
    a.free.resize(prev, merged);
    a.slab.recycle(b);
    return;
  }
  if (next_free) {
    next->address = b->address;
    next->prev_in_chunk = prev;
    if (prev != nullptr) prev->next_in_chunk = next;
    else b->owner->first = next;
    next->free_epoch = std::max(next->free_epoch, b->free_epoch);
    a.free.resize(next, next->size + b->size);
    a.slab.recycle(b);
    return;
  }
  a.free.insert(b);
}

void pool_resource::impl::flush_quick(detail::arena& a) {
  a.quick.drain([&](detail::block* b) {
    a.live.erase(b->address);
    b->cached = false;
    free_into(a, b, b->free_epoch);
  });
}

// After a free on the arena's own stream. By default the only cost is one load of
// the arena's own cache line: fences are recorded on demand (arena.hpp's note).
void pool_resource::impl::note_free(detail::arena& a, std::size_t bytes) {
  if (periodic_fences) [[unlikely]] {
    ++a.unfenced_count;
    a.unfenced_bytes += bytes;
    if ((a.unfenced_count >= opt.fence_interval || a.unfenced_bytes >= opt.fence_bytes) &&
        several_streams.load(std::memory_order_relaxed)) {
      record_fence(a);
      return;
    }
  }
  if (a.fence_requested.load(std::memory_order_relaxed)) [[unlikely]] {
    record_fence(a);
  }
}

void pool_resource::impl::request_fences() {
  std::shared_lock lock(arenas_mutex);
  for (auto& [key, a] : arenas) a->fence_requested.store(true, std::memory_order_relaxed);
}

void pool_resource::impl::record_fence(detail::arena& a) {
  detail::device_context_guard guard(device);  // the default streams are the current context's
  if (a.fence == nullptr) GPUMEM_CU(cuEventCreate, &a.fence, CU_EVENT_DISABLE_TIMING);
  GPUMEM_CU(cuEventRecord, a.fence, a.stream);
  a.fenced_frees = a.frees;
  a.unfenced_count = 0;
  a.unfenced_bytes = 0;
  a.fence_requested.store(false, std::memory_order_relaxed);
}

void pool_resource::impl::add_chunk(detail::arena& a, std::uintptr_t base, std::size_t bytes,
                                    std::uint64_t epoch) {
  auto c = std::make_unique<detail::chunk>();
  c->base = base;
  c->size = bytes;
  detail::chunk* raw = c.get();
  {
    std::unique_lock dir(chunks_mutex);
    raw->owner = &a;
    chunks.emplace(base, std::move(c));
  }
  std::lock_guard lock(a.lock);
  detail::block* b = a.slab.make();
  b->address = base;
  b->size = bytes;
  b->owner = raw;
  raw->first = b;
  a.chunks.push_back(raw);
  a.reserved_bytes += bytes;
  free_into(a, b, epoch);
}

// ---------------------------------------------------------------------------

pool_resource::pool_resource(memory_resource& upstream, pool_options options)
    : impl_(std::make_unique<impl>(upstream, nullptr, options)) {}

pool_resource::pool_resource(std::shared_ptr<memory_resource> upstream, pool_options options) {
  if (!upstream) throw logic_error("gpumem::pool_resource: null upstream");
  memory_resource& up = *upstream;
  impl_ = std::make_unique<impl>(up, std::move(upstream), options);
}

pool_resource::~pool_resource() = default;

void* pool_resource::do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) {
  impl& p = *impl_;
  detail::arena& a = p.arena_for(stream);  // first: a stream new to the pool is checked there
  if (p.opt.refuse_capture && detail::stream_is_capturing(stream.handle(), p.device, p.watched)) [[unlikely]] {
    detail::throw_capturing("pool_resource", "allocate", stream.handle());
  }
  const std::size_t size = (bytes + impl::granule - 1) & ~(impl::granule - 1);
  const std::size_t need = alignment > impl::granule ? size + alignment - impl::granule : size;
  {
    std::lock_guard lock(a.lock);
    if (detail::block* b = a.quick.pop(size, alignment)) [[likely]] {
      b->cached = false;
      b->requested_bytes = bytes;
      a.used_bytes += b->size;
      return reinterpret_cast<void*>(b->address);
    }
    if (detail::block* b = a.free.find(need)) [[likely]] {
      return p.carve(a, b, size, bytes, alignment);
    }
  }
  return p.allocate_slow(a, size, bytes, alignment, need);
}

void pool_resource::do_deallocate(void* ptr, std::size_t bytes, stream_view stream,
                                  std::size_t /*alignment*/) {
  impl& p = *impl_;
  detail::arena& a = p.arena_for(stream, "deallocate");  // first, as in do_allocate
  if (p.opt.refuse_capture && detail::stream_is_capturing(stream.handle(), p.device, p.watched)) [[unlikely]] {
    detail::throw_capturing("pool_resource", "deallocate", stream.handle());
  }
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  {
    std::lock_guard lock(a.lock);
    if (detail::block* b = a.live.find(address); b != nullptr && !b->cached) [[likely]] {
      if (b->requested_bytes != bytes) {
        throw logic_error("gpumem::pool_resource::deallocate: pointer " + detail::pointer_text(ptr) + " has " +
                          std::to_string(b->requested_bytes) + " bytes, not " + std::to_string(bytes));
      }
      a.used_bytes -= b->size;
      const std::size_t size = b->size;
      b->free_epoch = ++a.frees;
      if (p.opt.quick_cache && a.quick.push(b)) {
        b->cached = true;  // stays in `live` so the next allocation of its size skips the map
      } else {
        a.live.erase(address);
        p.free_into(a, b, b->free_epoch);
      }
      p.note_free(a, size);
      return;
    }
  }
  p.deallocate_foreign(a, ptr, bytes);
}

std::size_t pool_resource::release() {
  std::lock_guard growing(impl_->growth_mutex);
  impl_->synchronize_and_fence_everything();
  return impl_->release_chunks(true);
}

std::size_t pool_resource::trim() {
  std::size_t released = 0;
  {
    std::lock_guard growing(impl_->growth_mutex);
    released = impl_->release_chunks(false);
  }
  // The pool records no fence it was not asked for: ask every stream now, so that
  // a later trim() finds what was freed before this one.
  impl_->request_fences();
  return released;
}

std::size_t pool_resource::trim(stream_view stream) {
  detail::arena& a = impl_->arena_for(stream, "trim");
  {
    std::lock_guard lock(a.lock);
    impl_->record_fence(a);
  }
  std::lock_guard growing(impl_->growth_mutex);
  return impl_->release_chunks(false);
}

pool_statistics pool_resource::statistics() const { return impl_->collect(); }

const pool_options& pool_resource::options() const noexcept { return impl_->opt; }

memory_resource& pool_resource::upstream() const noexcept { return *impl_->upstream; }

resource_properties pool_resource::properties() const noexcept {
  return {.device = impl_->device, .device_accessible = true, .host_accessible = false,
          .thread_safe = true};
}

}  // namespace gpumem
