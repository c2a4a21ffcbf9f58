// The stream-ordering engine (stream_ordered_pool.hpp): arenas, fences, frees on
// another stream, the order of the slow path, and statistics (the block
// operations are in block_operations.cpp). arena.hpp's note on fencing says why
// each step is safe.
#include "pool/stream_ordered_pool.hpp"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <optional>
#include <system_error>
#include <tuple>

#include "diagnose.hpp"
#include "driver/capture_interaction.hpp"
#include "driver/driver.hpp"
#include "gpumem/device.hpp"

namespace gpumem::detail {

namespace pool_tls {
thread_local arena_cache last_arena __attribute__((tls_model("initial-exec")));
thread_local char per_thread_stream_tag __attribute__((tls_model("initial-exec")));
}  // namespace pool_tls

namespace {
std::atomic<std::uint64_t> next_pool_id{1};
}  // namespace

stream_ordered_pool::stream_ordered_pool(const char* resource, int dev, stream_pool_settings s)
    : name(resource), device(dev), settings(s), id(next_pool_id.fetch_add(1)), graph_memory(resource, dev) {
  if (settings.fence_interval == 0) throw logic_error(std::string("gpumem::") + name + ": fence_interval must be at least 1");
  if (settings.fence_bytes == 0) throw logic_error(std::string("gpumem::") + name + ": fence_bytes must be at least 1");
  if (settings.check_capture && settings.watch_captures) {
    watch = std::make_unique<capture_watch>();
    watched = !watch->source().empty();
    if (!watched) {
      // Asked for (GPUMEM_CONF's watch_captures among others) and silently slower otherwise.
      diagnosef(diagnostic_level::warning,
                "gpumem::%s on device %d: watch_captures was asked for, but the capture watch did not start (%s); "
                "the pool asks the driver whether its stream is captured on every call (docs/pool.md, \"The "
                "capture watch\")\n",
                name, device, watch->reason().c_str());
    }
  }
  periodic_fences = settings.fence_interval != ~0U || settings.fence_bytes != ~std::size_t{0};
  if (settings.page_bytes != 0) {
    if ((settings.page_bytes & (settings.page_bytes - 1)) != 0) {
      throw logic_error(std::string("gpumem::") + name + ": the page size must be a power of two");
    }
    page_shift = static_cast<unsigned>(std::countr_zero(settings.page_bytes));
  }
}

bool pool_backing::make_ready(arena&, block*) { return true; }

void* pool_backing::allocate_slot(arena&, const pool_request&) {
  throw logic_error("gpumem: this pool has no slots");
}

stream_ordered_pool::~stream_ordered_pool() {
  for (const graph_holds::held& h : held_for_graphs.take_released()) held_for_graphs.returned(h);  // gone with the pool
  if (const std::size_t held = held_for_graphs.count(); held != 0) {
    diagnosef(diagnostic_level::warning,
              "gpumem: %s on device %d destroyed while %zu block(s) freed under a CUDA graph capture are held for "
              "their graphs; those graphs must not run again (their memory goes back with the pool's)\n",
              name, device, held);
  }
  for (auto& [key, a] : arenas) {
    if (a->fence != nullptr) (void)driver().cuEventDestroy(a->fence);
  }
  if (maintenance != nullptr) (void)driver().cuStreamDestroy(maintenance);
}

// Out of line so that the hit path needs no stack frame.
arena* stream_ordered_pool::find_arena(std::uintptr_t key, stream_view s) {
  pool_tls::arena_cache& cache = pool_tls::last_arena;
  arena* found = nullptr;
  {
    std::shared_lock lock(arenas_mutex);
    auto it = arenas.find(key);
    if (it != arenas.end()) found = it->second.get();
  }
  if (found == nullptr) found = create_arena(key, s.handle());
  if (found != nullptr) cache = {id, key, found};
  return found;
}

arena& stream_ordered_pool::arena_for(stream_view s, const char* call) {
  arena* a = nullptr;
  // Its callers record on the stream (trim's fence), which under a capture would
  // become a node of the graph instead of a point the pool can wait for.
  if (!arena_of(s, a) || (settings.check_capture && stream_is_capturing(s.handle(), device, watched))) {
    throw_capturing(name, call, s.handle());
  }
  return *a;
}

arena* stream_ordered_pool::create_arena(std::uintptr_t key, CUstream s) {
  CUstream normalized = s == nullptr ? CU_STREAM_LEGACY : s;
  // Before any other driver call on the stream: on a capturing stream they fail and
  // invalidate the program's capture. Also how the capture watch learns of a
  // capture that began before it (driver/capture_watch_state.hpp).
  if (settings.check_capture && new_stream_is_capturing(normalized, device)) return nullptr;
  {
    // A stream of another device would order nothing useful: refuse it once, here.
    device_context_guard guard(device);
    check_stream_device(normalized, device, (std::string("gpumem::") + name).c_str());
  }
  std::unique_lock lock(arenas_mutex);
  auto& slot = arenas[key];
  if (!slot) slot = std::make_unique<arena>(normalized);
  if (arenas.size() > 1) several_streams.store(true, std::memory_order_relaxed);
  return slot.get();
}

arena* stream_ordered_pool::chunk_owner(std::uintptr_t address) const {
  std::shared_lock dir(chunks_mutex);
  auto it = chunks.upper_bound(address);
  if (it == chunks.begin()) return nullptr;
  --it;
  return address < it->first + it->second->size ? it->second->owner : nullptr;
}

std::vector<arena*> stream_ordered_pool::arenas_except(const arena* skip) const {
  std::vector<arena*> out;
  std::shared_lock lock(arenas_mutex);
  for (const auto& [key, other] : arenas) {
    if (other.get() != skip) out.push_back(other.get());
  }
  return out;
}

// After a free on the arena's own stream. By default the only cost is one load of
// the arena's own cache line: fences are recorded on demand (arena.hpp's note).
void stream_ordered_pool::note_free(arena& a, std::size_t bytes) {
  if (periodic_fences) [[unlikely]] {
    ++a.unfenced_count;
    a.unfenced_bytes += bytes;
    if ((a.unfenced_count >= settings.fence_interval || a.unfenced_bytes >= settings.fence_bytes) &&
        several_streams.load(std::memory_order_relaxed)) {
      record_fence(a);
      return;
    }
  }
  if (a.fence_requested.load(std::memory_order_relaxed)) [[unlikely]] {
    record_fence(a);
  }
}

void stream_ordered_pool::request_fences() {
  std::shared_lock lock(arenas_mutex);
  for (auto& [key, a] : arenas) a->fence_requested.store(true, std::memory_order_relaxed);
}

void stream_ordered_pool::record_fence(arena& a) {
  // A record needs a current context only on a default stream (the current
  // context's); creating the event needs one always. Other records skip the
  // guard's driver calls: with many streams, periodic fences are frequent (W3).
  std::optional<device_context_guard> guard;
  if (is_default_stream(a.stream) || a.fence == nullptr) guard.emplace(device);
  if (a.fence == nullptr) GPUMEM_CU(cuEventCreate, &a.fence, CU_EVENT_DISABLE_TIMING);
  GPUMEM_CU(cuEventRecord, a.fence, a.stream);
  a.fenced_frees = a.frees;
  a.unfenced_count = 0;
  a.unfenced_bytes = 0;
  a.fence_requested.store(false, std::memory_order_relaxed);
}

chunk* stream_ordered_pool::add_chunk(arena& a, std::uintptr_t base, std::size_t bytes, std::uint64_t epoch,
                                      std::size_t page_bytes, bool for_slots) {
  auto c = std::make_unique<chunk>();
  c->base = base;
  c->size = bytes;
  if (page_bytes != 0) {
    const std::size_t n = bytes / page_bytes;
    if (base % page_bytes != 0) throw logic_error(where("add_chunk") + ": a paged segment must start on a page");
    // Zero until written: a stream's first segment costs no pass over its
    // records (Note [Page records on demand], zeroed_array.hpp).
    c->pages = zeroed_array<std::uint64_t>(n);
    c->home_at = zeroed_array<page_home*>(n);
    c->ready = zeroed_array<std::uint64_t>((n + 63) / 64);
    c->mapped = zeroed_array<std::uint64_t>((n + 63) / 64);
    if (for_slots) {
      c->slot_at = zeroed_array<block*>(n);
    } else {
      c->busy = zeroed_array<std::uint64_t>((n + 63) / 64);
      c->uses = zeroed_array<chunk::page_uses>(n);
    }
  }
  chunk* raw = c.get();
  {
    std::unique_lock dir(chunks_mutex);
    raw->owner = &a;
    chunks.emplace(base, std::move(c));
  }
  std::lock_guard lock(a.lock);
  block* b = a.slab.make();
  b->address = base;
  b->size = bytes;
  b->owner = raw;
  raw->first = b;
  a.chunks.push_back(raw);
  if (page_bytes == 0) a.reserved_bytes += bytes;  // a paged segment has no memory yet
  raw->for_slots = for_slots;
  b->free_epoch = epoch;
  if (for_slots) {
    b->vacant = true;
  } else {
    b->free = true;
    a.free.insert(b);
  }
  return raw;
}

chunk* stream_ordered_pool::chunk_of(std::uintptr_t address) const {
  std::shared_lock dir(chunks_mutex);
  auto it = chunks.upper_bound(address);
  if (it == chunks.begin()) return nullptr;
  --it;
  return address < it->first + it->second->size ? it->second.get() : nullptr;
}

CUstream stream_ordered_pool::maintenance_stream() {
  std::lock_guard lock(maintenance_mutex);
  if (maintenance == nullptr) {
    device_context_guard guard(device);
    GPUMEM_CU(cuStreamCreate, &maintenance, CU_STREAM_NON_BLOCKING);
  }
  return maintenance;
}

// ---------------------------------------------------------------------------
// Slow paths

void* stream_ordered_pool::try_own(arena& a, const pool_request& r, bool growing) {
  block* out = nullptr;
  {
    std::lock_guard lock(a.lock);
    block* b = a.free.find(r.need);
    if (b == nullptr) return nullptr;
    out = carve(a, b, r.size, r.requested, r.alignment);
    if (page_shift == 0 || pages_ready(out)) return reinterpret_cast<void*>(out->address);
  }
  return finish_unready(a, out, growing);
}

void* stream_ordered_pool::finish_unready(arena& a, block* b, bool growing) {
  bool ready = false;
  if (growing) {
    ready = backing->make_ready(a, b);
  } else {
    growth_waiter waiting(a);
    std::lock_guard lock(growth_mutex);
    ready = backing->make_ready(a, b);
  }
  if (ready) return reinterpret_cast<void*>(b->address);
  // Memory is short: the block goes back, with what pages it got.
  std::lock_guard lock(a.lock);
  a.live.erase(b->address);
  a.used_bytes -= b->size;
  free_into(a, b, b->free_epoch);
  return nullptr;
}

void* stream_ordered_pool::allocate_slow(arena& a, const pool_request& r) {
  if (r.need > backing->largest_possible()) throw_out_of_memory(r.requested, r.alignment);
  take_back_from_graphs();
  // 1. This arena's quick cache, coalesced, and the blocks other streams freed back to it.
  {
    std::lock_guard lock(a.lock);
    flush_quick(a);
    if (a.fence_requested.load(std::memory_order_relaxed)) record_fence(a);  // another stream asked
  }
  if (void* p = try_own(a, r, false)) return p;
  if (absorb_pending(a)) {
    if (void* p = try_own(a, r, false)) return p;
  }
  // 2. Other streams' free memory the backing can take without growing or waiting.
  if (settings.reuse_across_streams) {
    if (void* p = backing->take_from_others(a, r, false)) return p;
  }
  // 3. and 4. run under growth_mutex: one thread at a time grows or gives memory
  // back, so no thread releases memory another has just grown and not yet carved,
  // and no thread fails against a maximum because another's growth is in flight.
  growth_waiter waiting(a);
  std::lock_guard growing(growth_mutex);
  if (void* p = try_own(a, r, true)) return p;  // another thread may have grown or freed meanwhile
  // 3. More memory.
  if (backing->grow(a, r.need, false)) {
    if (void* p = try_own(a, r, true)) return p;
  }
  // 4. Memory is short: what other streams hold, waiting for their locks.
  if (settings.reuse_across_streams) {
    if (void* p = backing->take_from_others(a, r, true)) return p;
  }
  // 5. Make every free complete (one device synchronisation, off the hot path),
  //    give free memory back, and try everything again.
  const last_sync sync = synchronize_as_last_resort();
  if (void* p = try_own(a, r, true)) return p;
  if (void* p = backing->take_from_others(a, r, true)) return p;
  if (sync == last_sync::done) backing->before_last_growth();  // it counts on the synchronisation
  if (backing->grow(a, r.need, true)) {
    if (void* p = try_own(a, r, true)) return p;
  }
  throw_out_of_memory(r.requested, r.alignment, sync);
}

void* stream_ordered_pool::allocate_slot(arena& a, std::size_t bytes) {
  const std::size_t page = settings.page_bytes;
  const std::size_t size = (bytes + page - 1) / page * page;
  const pool_request r{.size = size, .requested = bytes, .alignment = page, .need = size};
  // The hot path found no free slot that is ready or needs swaps within the
  // arena only (allocate()).
  if (size > backing->largest_possible()) throw_out_of_memory(bytes);
  take_back_from_graphs();
  growth_waiter waiting(a);
  // Slots other streams freed back to this one (no growth mutex needed), before
  // the exclusive path: with streams that free each other's blocks, that is
  // where most misses end (W5's data-pipeline).
  if (absorb_pending(a)) {
    std::shared_lock reusing(growth_mutex);
    if (void* p = backing->reuse_slot(a, r)) return p;
  }
  std::lock_guard growing(growth_mutex);
  if (void* p = backing->allocate_slot(a, r)) return p;
  // Memory is short: make every free complete, and try once more.
  const last_sync sync = synchronize_as_last_resort();
  if (void* p = backing->allocate_slot(a, r)) return p;
  throw_out_of_memory(bytes, 0, sync);
}

void stream_ordered_pool::release_block(arena& a, block* b, std::uint64_t epoch) {
  b->pending = false;
  if (b->slot) {
    b->free_epoch = epoch;
    a.live.insert(b->address, b);
    // A pending slot may have given its pages away (Note [Swaps across streams]):
    // it keeps a ready mark only if they are all back (Note [A slot's ready mark]).
    cache_slot(a, b, page_shift == 0 || pages_ready(b));
    return;
  }
  free_into(a, b, epoch);
}

logic_error stream_ordered_pool::not_ours(const void* ptr) const {
  return logic_error(where("deallocate") + ": pointer " + pointer_text(ptr) +
                     " was not allocated by this pool, or was already freed");
}

logic_error stream_ordered_pool::wrong_size(const void* ptr, std::size_t had, std::size_t bytes) const {
  return logic_error(where("deallocate") + ": pointer " + pointer_text(ptr) + " has " + std::to_string(had) +
                     " bytes, not " + std::to_string(bytes));
}

void stream_ordered_pool::deallocate_foreign(arena& caller, void* ptr, std::size_t bytes) {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  arena* const owner = chunk_owner(address);
  if (owner == nullptr || owner == &caller) {  // caller's own live map missed it
    // Handed out under a capture, freed after it: the graph's allocation.
    if (owner == nullptr && graph_memory.deallocate(ptr, bytes, caller.stream, false)) return;
    throw not_ours(ptr);
  }
  {
    std::lock_guard lock(owner->lock);
    block* b = owner->live.find(address);
    if (b == nullptr || b->cached) throw not_ours(ptr);
    if (b->requested_bytes != bytes) {
      throw logic_error(where("deallocate") + ": the allocation has " + std::to_string(b->requested_bytes) +
                        " bytes, not " + std::to_string(bytes));
    }
  }
  CUevent fence = nullptr;
  std::uint64_t fenced = 0;
  {
    // Order the free after the caller's stream's work so far.
    std::lock_guard lock(caller.lock);
    record_fence(caller);
    fence = caller.fence;
    fenced = caller.fenced_frees;
  }
  std::lock_guard lock(owner->lock);
  block* b = owner->live.find(address);
  if (b == nullptr || b->cached) throw not_ours(ptr);  // freed by another thread meanwhile
  owner->live.erase(address);
  owner->used_bytes -= b->size;
  b->freed_by = &caller;
  b->pending = true;
  owner->pending.push_back({b, fence, ++owner->pending_sequence, &caller, fenced});
}

void stream_ordered_pool::wait_for(arena& waiter, CUevent fence) {
  if (fence == nullptr) return;  // never recorded: what it covers needed no wait
  // As in record_fence, only a default stream needs the device's context
  // current (W5's data-pipeline waits tens of times a replay).
  std::optional<device_context_guard> guard;
  if (is_default_stream(waiter.stream)) guard.emplace(device);
  GPUMEM_CU(cuStreamWaitEvent, waiter.stream, fence, 0);
}

bool stream_ordered_pool::absorb_pending(arena& a) {
  std::vector<CUevent> fences;
  std::uint64_t upto = 0;
  {
    std::lock_guard lock(a.lock);
    if (a.pending.empty()) return false;
    upto = a.pending_sequence;
    for (const auto& pf : a.pending) {
      if (std::find(fences.begin(), fences.end(), pf.fence) == fences.end()) fences.push_back(pf.fence);
    }
  }
  for (CUevent e : fences) wait_for(a, e);
  std::lock_guard lock(a.lock);
  bool absorbed = false;
  for (std::size_t i = 0; i < a.pending.size();) {
    if (a.pending[i].sequence <= upto) {
      a.note_waited(a.pending[i].by, a.pending[i].by_fenced);  // its fence was waited for above
      release_block(a, a.pending[i].freed, ++a.frees);
      a.pending[i] = a.pending.back();
      a.pending.pop_back();
      absorbed = true;
    } else {
      ++i;
    }
  }
  // The absorbed blocks become usable by other streams too, once fenced. A
  // paged pool fences them on demand (another stream asks): the stream that
  // freed a slot takes its pages with no fence (block::freed_by, Note [Swaps
  // across streams]), and a record here was one per absorb.
  if (absorbed && (page_shift == 0 || a.fence_requested.load(std::memory_order_relaxed))) record_fence(a);
  return absorbed;
}

void stream_ordered_pool::absorb_completed_pending(arena& a) {
  if (a.pending.empty()) return;
  relaxed_capture_interaction relaxed;  // Note [Calls a capture elsewhere forbids]
  for (std::size_t i = 0; i < a.pending.size();) {
    const CUresult r = a.pending[i].fence != nullptr ? driver().cuEventQuery(a.pending[i].fence) : CUDA_SUCCESS;
    if (r == CUDA_SUCCESS) {
      release_block(a, a.pending[i].freed, 0);
      a.pending[i] = a.pending.back();
      a.pending.pop_back();
    } else {
      if (r != CUDA_ERROR_NOT_READY) check(r, "cuEventQuery", __FILE__, __LINE__);
      ++i;
    }
  }
}

bool stream_ordered_pool::synchronize_and_fence_everything() {
  if (watch_knows_a_capture()) return false;
  std::vector<std::tuple<arena*, std::uint64_t, std::uint64_t>> before;
  {
    std::shared_lock lock(arenas_mutex);
    for (auto& [key, a] : arenas) {
      std::lock_guard g(a->lock);
      before.emplace_back(a.get(), a->frees, a->pending_sequence);
    }
  }
  {
    device_context_guard guard(device);
    GPUMEM_CU(cuCtxSynchronize);
    // The driver caches the memory of graphs' allocations (the pools' calls
    // under capture) once they are freed: what no graph holds now goes back too,
    // as memory is short or the program asks for everything back. No capture is
    // in progress: the synchronisation above would have failed.
    GPUMEM_CU(cuDeviceGraphMemTrim, static_cast<CUdevice>(device));
  }
  // Everything freed before the synchronisation is complete: fenced and settled.
  for (auto [a, frees, pending_upto] : before) {
    std::lock_guard g(a->lock);
    flush_quick(*a);
    a->fenced_frees = std::max(a->fenced_frees, frees);
    a->settled_frees = std::max(a->settled_frees, frees);
    for (std::size_t i = 0; i < a->pending.size();) {
      if (a->pending[i].sequence <= pending_upto) {
        release_block(*a, a->pending[i].freed, frees);
        a->pending[i] = a->pending.back();
        a->pending.pop_back();
      } else {
        ++i;
      }
    }
  }
  return true;
}

stream_ordered_pool::last_sync stream_ordered_pool::synchronize_as_last_resort() {
  try {
    return synchronize_and_fence_everything() ? last_sync::done : last_sync::skipped;
  } catch (const cuda_error& e) {
    if (e.result() != CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) throw;
    // Said now, whether or not the request is served without it: the program's
    // capture is lost, and its end will only say that it was invalidated.
    diagnosef(diagnostic_level::warning,
              "gpumem: %s on device %d: memory was short, and the driver refused the device synchronisation "
              "that completes other streams' frees: a CUDA graph capture is in progress, and it is now "
              "invalidated (with watch_captures the pool knows of captures and does not ask: docs/pool.md, "
              "\"A capture elsewhere\")",
              name, device);
    return last_sync::refused;
  }
}

pool_totals stream_ordered_pool::collect() {
  take_back_from_graphs();
  pool_totals s;
  std::shared_lock lock(arenas_mutex);
  for (auto& [key, a] : arenas) {
    std::lock_guard g(a->lock);
    flush_quick(*a);  // report coalesced blocks, as they are after any slow path
    s.used_bytes += a->used_bytes;
    s.reserved_bytes += a->reserved_bytes;
    s.free_bytes += a->free.bytes() + a->slots.bytes();
    s.free_blocks += a->free.count() + a->slots.count();
    s.largest_free_block = std::max(s.largest_free_block, a->free.largest());
    s.allocations += a->live.size() - a->slots.count();
    s.chunks += a->chunks.size();
    for (const auto& pf : a->pending) {
      s.free_bytes += pf.freed->size;
      ++s.free_blocks;
    }
  }
  s.streams = arenas.size();
  return s;
}

void stream_ordered_pool::throw_out_of_memory(std::size_t requested, std::size_t alignment, last_sync sync) {
  const memory_info m = device_memory_info(device);
  std::string why = backing->shortage(requested);
  if (sync == last_sync::skipped) {
    why += "; the device was not synchronized to complete other streams' frees, as a CUDA graph capture is in "
           "progress (the driver forbids it then)";
  } else if (sync == last_sync::refused) {
    why += "; the driver refused the device synchronisation that completes other streams' frees, as a CUDA graph "
           "capture is in progress, and that capture is now invalidated (with pool_options::watch_captures the "
           "pool knows of captures and does not ask: docs/pool.md, \"A capture elsewhere\")";
  }
  if (const std::size_t held = held_for_graphs.bytes(); held != 0) {
    why += "; " + std::to_string(held) + " bytes of blocks freed under a CUDA graph capture are held until their " +
           "graphs and every executable made from them are destroyed (docs/pool.md, \"CUDA graphs\")";
  }
  if (alignment > granule) {
    // The alignment is what the pool must find room for: name it.
    why = "with alignment " + std::to_string(alignment) + " the request needs " +
          std::to_string(requested + alignment - granule) + " bytes of room; " + why;
  }
  throw out_of_memory({.requested_bytes = requested, .device = device, .resource = name,
                       .resource_held_bytes = reserved_bytes.load(), .device_free_bytes = m.free_bytes,
                       .device_total_bytes = m.total_bytes, .reason = why});
}

}  // namespace gpumem::detail
