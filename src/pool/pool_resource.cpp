// pool_resource: a fast, stream-ordered, coalescing sub-allocator over any
// upstream resource (docs/pool.md). The engine (stream_ordered_pool.hpp) does the
// work; this file makes it and gives it the upstream (pool_reclaim.cpp).
#include <string>
#include "gpumem/pool_resource.hpp"
#include "diagnose.hpp"
#include "gpumem/device.hpp"

#include <algorithm>
#include <cstdio>

#include "driver/driver.hpp"
#include "gpumem/error.hpp"
#include "pool/pool_impl.hpp"

namespace gpumem {
namespace {

int device_of_upstream(const memory_resource& up) {
  const resource_properties props = up.properties();
  if (props.device < 0 || !props.device_accessible) {
    throw logic_error("gpumem::pool_resource: the upstream must hand out device memory");
  }
  return props.device;
}

detail::stream_pool_settings settings_of(const pool_options& o) {
  return {.reuse_across_streams = o.reuse_across_streams, .quick_cache = o.quick_cache,
          .fence_interval = o.fence_interval, .fence_bytes = o.fence_bytes,
          .check_capture = o.check_capture, .watch_captures = o.watch_captures};
}

const pool_options& checked(const pool_options& o) {
  constexpr std::size_t granule = detail::stream_ordered_pool::granule;
  // Sizes past any device's memory (and past the address space) would overflow
  // the pool's rounding: refused here, with the field named.
  constexpr std::size_t largest = std::size_t{1} << 50;  // 1 PiB
  auto refuse = [](const std::string& why) { throw logic_error("gpumem::pool_resource: " + why); };
  if (o.min_chunk_bytes < granule || o.max_chunk_bytes < o.min_chunk_bytes) {
    refuse("need 256 <= min_chunk_bytes <= max_chunk_bytes (min_chunk_bytes " + std::to_string(o.min_chunk_bytes) +
           ", max_chunk_bytes " + std::to_string(o.max_chunk_bytes) + ")");
  }
  if (o.max_chunk_bytes > largest) {
    refuse("max_chunk_bytes " + std::to_string(o.max_chunk_bytes) + " is larger than 1 PiB (2^50 bytes)");
  }
  if (o.initial_bytes > largest) {
    refuse("initial_bytes " + std::to_string(o.initial_bytes) + " is larger than 1 PiB (2^50 bytes)");
  }
  if (o.maximum_bytes != 0 && o.initial_bytes > o.maximum_bytes) {
    refuse("initial_bytes " + std::to_string(o.initial_bytes) + " exceeds maximum_bytes " +
           std::to_string(o.maximum_bytes));
  }
  return o;
}

}  // namespace

pool_resource::impl::impl(memory_resource& up, std::shared_ptr<memory_resource> owned, pool_options o)
    : upstream(&up),
      owned_upstream(std::move(owned)),
      opt(checked(o)),
      pool("pool_resource", device_of_upstream(up), settings_of(opt)) {
  opt.min_chunk_bytes = (opt.min_chunk_bytes + granule - 1) & ~(granule - 1);
  pool.set_backing(this);
  if (opt.initial_bytes > 0) {
    // Allocated synchronously: usable by every stream, so its blocks start fenced (epoch 0).
    const std::size_t bytes = (opt.initial_bytes + granule - 1) & ~(granule - 1);
    void* p = upstream->allocate_sync(bytes);
    detail::arena& a = *pool.create_arena(detail::stream_ordered_pool::key_of(CU_STREAM_LEGACY), CU_STREAM_LEGACY);
    pool.reserved_bytes += bytes;
    pool.note_reserved();
    pool.add_chunk(a, reinterpret_cast<std::uintptr_t>(p), bytes, 0);
  }
}

pool_resource::impl::~impl() {
  std::size_t live_count = 0;
  std::size_t live_bytes = 0;
  for (auto& [key, a] : pool.arenas) {
    live_count += a->live.size() - a->quick.count();
    live_bytes += a->used_bytes;
  }
  if (live_count != 0) {
    detail::diagnosef(diagnostic_level::warning, "gpumem: pool_resource on device %d destroyed with %zu live allocation(s), %zu bytes; "
                 "returning their memory to the upstream\n", pool.device, live_count, live_bytes);
  }
  try {
    // Every free must be complete before chunks go back upstream.
    detail::device_context_guard guard(pool.device);
    GPUMEM_CU(cuCtxSynchronize);
    for (auto& [base, c] : pool.chunks) upstream->deallocate_sync(reinterpret_cast<void*>(base), c->size);
  } catch (const std::exception& e) {
    detail::diagnosef(diagnostic_level::error, "gpumem: pool_resource teardown: %s\n", e.what());
  }
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
  return impl_->pool.allocate(bytes, stream, alignment);
}

void pool_resource::do_deallocate(void* ptr, std::size_t bytes, stream_view stream, std::size_t /*alignment*/) {
  impl_->pool.deallocate(ptr, bytes, stream);
}

void* pool_resource::do_try_allocate_now(std::size_t bytes, stream_view stream, std::size_t alignment) {
  return impl_->pool.try_allocate_now(bytes, stream, alignment);
}

bool pool_resource::do_try_deallocate_now(void* ptr, std::size_t bytes, stream_view stream, std::size_t /*alignment*/) {
  return impl_->pool.try_deallocate_now(ptr, bytes, stream);
}

std::size_t pool_resource::release() {
  impl_->pool.take_back_from_graphs();
  std::lock_guard growing(impl_->pool.growth_mutex);
  const bool synchronized = impl_->pool.synchronize_and_fence_everything();
  return impl_->give_back(synchronized);
}

std::size_t pool_resource::trim() {
  impl_->pool.take_back_from_graphs();
  std::size_t released = 0;
  {
    std::lock_guard growing(impl_->pool.growth_mutex);
    released = impl_->give_back(false);
  }
  // The pool records no fence it was not asked for: ask every stream now, so that
  // a later trim() finds what was freed before this one.
  impl_->pool.request_fences();
  return released;
}

std::size_t pool_resource::trim(stream_view stream) {
  impl_->pool.take_back_from_graphs();
  detail::arena& a = impl_->pool.arena_for(stream, "trim");
  {
    std::lock_guard lock(a.lock);
    impl_->pool.record_fence(a);
  }
  std::lock_guard growing(impl_->pool.growth_mutex);
  return impl_->give_back(false);
}

pool_statistics pool_resource::statistics() const {
  const detail::pool_totals t = impl_->pool.collect();
  return {.used_bytes = t.used_bytes, .reserved_bytes = t.reserved_bytes,
          .peak_reserved_bytes = std::max(impl_->pool.peak_reserved_bytes.load(), t.reserved_bytes),
          .free_bytes = t.free_bytes, .free_blocks = t.free_blocks, .largest_free_block = t.largest_free_block,
          .allocations = t.allocations, .chunks = t.chunks, .streams = t.streams};
}

void pool_resource::reset_peak() { impl_->pool.reset_peak_reserved(); }

const pool_options& pool_resource::options() const noexcept { return impl_->opt; }

memory_resource& pool_resource::upstream() const noexcept { return *impl_->upstream; }

resource_properties pool_resource::properties() const noexcept {
  return {.device = impl_->pool.device, .device_accessible = true, .host_accessible = false,
          .thread_safe = true};
}


std::optional<std::size_t> pool_resource::available_bytes() const {
  return device_memory_info(impl_->pool.device).free_bytes + statistics().free_bytes;
}

std::size_t pool_resource::release_free_memory() { return release(); }

}  // namespace gpumem
