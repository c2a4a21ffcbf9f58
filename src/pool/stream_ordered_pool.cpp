// The stream-ordering engine (stream_ordered_pool.hpp): arenas, block splitting
// and coalescing, fences, frees on another stream, the order of the slow path,
// and statistics. arena.hpp's note on fencing says why each step is safe.
#include "pool/stream_ordered_pool.hpp"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <optional>
#include <system_error>
#include <tuple>

#include "driver/driver.hpp"
#include "gpumem/device.hpp"

namespace gpumem::detail {

namespace pool_tls {
thread_local arena_cache last_arena __attribute__((tls_model("initial-exec")));
}  // namespace pool_tls

namespace {
std::atomic<std::uint64_t> next_pool_id{1};
thread_local char per_thread_stream_tag __attribute__((tls_model("initial-exec")));
}  // namespace

// Arena key: the stream handle, with the two default streams made explicit.
// The per-thread default stream is a different stream on every thread.
std::uintptr_t stream_ordered_pool::key_of(CUstream s) noexcept {
  if (s == nullptr || s == CU_STREAM_LEGACY) return reinterpret_cast<std::uintptr_t>(CU_STREAM_LEGACY);
  if (s == CU_STREAM_PER_THREAD) return reinterpret_cast<std::uintptr_t>(&per_thread_stream_tag) | 3U;
  return reinterpret_cast<std::uintptr_t>(s);
}

stream_ordered_pool::stream_ordered_pool(const char* resource, int dev, stream_pool_settings s)
    : name(resource), device(dev), settings(s), id(next_pool_id.fetch_add(1)) {
  if (settings.fence_interval == 0) throw logic_error(std::string("gpumem::") + name + ": fence_interval must be at least 1");
  if (settings.fence_bytes == 0) throw logic_error(std::string("gpumem::") + name + ": fence_bytes must be at least 1");
  if (settings.refuse_capture && settings.watch_captures) {
    watch = std::make_unique<capture_watch>();
    watched = !watch->source().empty();
  }
  periodic_fences = settings.fence_interval != ~0U || settings.fence_bytes != ~std::size_t{0};
  if (settings.page_bytes != 0) {
    if ((settings.page_bytes & (settings.page_bytes - 1)) != 0) {
      throw logic_error(std::string("gpumem::") + name + ": the page size must be a power of two");
    }
    page_shift = static_cast<unsigned>(std::countr_zero(settings.page_bytes));
  }
}

growth_mutex_type::growth_mutex_type() {
  pthread_rwlockattr_t attributes;
  pthread_rwlockattr_init(&attributes);
  pthread_rwlockattr_setkind_np(&attributes, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  const int rc = pthread_rwlock_init(&lock_, &attributes);
  pthread_rwlockattr_destroy(&attributes);
  if (rc != 0) throw std::system_error(rc, std::generic_category(), "gpumem: the pool's growth mutex");
}

growth_mutex_type::~growth_mutex_type() { pthread_rwlock_destroy(&lock_); }

void growth_mutex_type::lock() {
  if (const int rc = pthread_rwlock_wrlock(&lock_); rc != 0) {
    throw std::system_error(rc, std::generic_category(), "gpumem: the pool's growth mutex");
  }
}

void growth_mutex_type::unlock() noexcept { pthread_rwlock_unlock(&lock_); }

void growth_mutex_type::lock_shared() {
  if (const int rc = pthread_rwlock_rdlock(&lock_); rc != 0) {
    throw std::system_error(rc, std::generic_category(), "gpumem: the pool's growth mutex");
  }
}

void growth_mutex_type::unlock_shared() noexcept { pthread_rwlock_unlock(&lock_); }

bool pool_backing::make_ready(arena&, block*) { return true; }

void* pool_backing::allocate_slot(arena&, const pool_request&) {
  throw logic_error("gpumem: this pool has no slots");
}

stream_ordered_pool::~stream_ordered_pool() {
  for (auto& [key, a] : arenas) {
    if (a->fence != nullptr) (void)driver().cuEventDestroy(a->fence);
  }
  if (maintenance != nullptr) (void)driver().cuStreamDestroy(maintenance);
}

// Out of line so that the hit path needs no stack frame.
arena& stream_ordered_pool::find_arena(std::uintptr_t key, stream_view s, const char* call) {
  pool_tls::arena_cache& cache = pool_tls::last_arena;
  arena* found = nullptr;
  {
    std::shared_lock lock(arenas_mutex);
    auto it = arenas.find(key);
    if (it != arenas.end()) found = it->second.get();
  }
  if (found == nullptr) found = &create_arena(key, s.handle(), call);
  cache = {id, key, found};
  return *found;
}

arena& stream_ordered_pool::create_arena(std::uintptr_t key, CUstream s, const char* call) {
  CUstream normalized = s == nullptr ? CU_STREAM_LEGACY : s;
  // Before any other driver call on the stream: on a capturing stream they fail and
  // invalidate the program's capture. Also how the capture watch learns of a
  // capture that began before it (driver/capture_watch_state.hpp).
  if (settings.refuse_capture && new_stream_is_capturing(normalized, device)) {
    throw_capturing(name, call, normalized);
  }
  {
    // A stream of another device would order nothing useful: refuse it once, here.
    device_context_guard guard(device);
    check_stream_device(normalized, device, (std::string("gpumem::") + name).c_str());
  }
  std::unique_lock lock(arenas_mutex);
  auto& slot = arenas[key];
  if (!slot) slot = std::make_unique<arena>(normalized);
  if (arenas.size() > 1) several_streams.store(true, std::memory_order_relaxed);
  return *slot;
}

std::vector<arena*> stream_ordered_pool::arenas_except(const arena* skip) const {
  std::vector<arena*> out;
  std::shared_lock lock(arenas_mutex);
  for (const auto& [key, other] : arenas) {
    if (other.get() != skip) out.push_back(other.get());
  }
  return out;
}

block* stream_ordered_pool::split_off_front(arena& a, block* b, std::size_t bytes) {
  block* f = a.slab.make();
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

// Hands out the front of `b` (a free block in the arena's index). When the rest is
// a granule or more, `b` keeps it, and its place in the index unless its size class
// changes; the request gets a new record. So a split is one index update, not a
// removal and an insertion (W2).
block* stream_ordered_pool::carve(arena& a, block* b, std::size_t size, std::size_t requested,
                                  std::size_t alignment) {
  const std::uintptr_t from = b->address, to = b->address + b->size;  // the free block's range
  const std::uintptr_t aligned = (b->address + alignment - 1) & ~(std::uintptr_t{alignment} - 1);
  if (aligned != b->address) {
    // Leave the misaligned front as a free block of its own.
    block* front = split_off_front(a, b, aligned - b->address);
    front->free = true;
    front->free_epoch = b->free_epoch;
    a.free.insert(front);
    a.free.resize(b, b->size - front->size);
  }
  block* out = b;
  if (b->size - size >= granule) {
    out = split_off_front(a, b, size);
    a.free.resize(b, b->size - size);
  } else {
    a.free.remove(b);
  }
  out->free = false;
  out->free_epoch = b->free_epoch;  // when its range was last freed (paged pools' make_ready)
  out->requested_bytes = requested;
  a.live.insert(out->address, out);
  a.used_bytes += out->size;
  if (page_shift != 0) pages_taken(out, from, to);
  return out;
}

void stream_ordered_pool::free_into(arena& a, block* b, std::uint64_t epoch) {
  const std::uintptr_t lo = b->address, hi = b->address + b->size;
  block* const merged = coalesce(a, b, epoch);
  if (page_shift != 0) pages_freed(a, lo, hi, merged);
}

// Marks `b` free and coalesces it with free neighbours (the same chunk's, so the
// same arena's). The lower free neighbour, or else the upper one, absorbs it and
// keeps its record and mostly its place in the index (see carve). Paged pools:
// free blocks merge whatever their pages' state (Note [Pages under the blocks]).
block* stream_ordered_pool::coalesce(arena& a, block* b, std::uint64_t epoch) {
  b->free = true;
  b->free_epoch = epoch;
  block* const prev = b->prev_in_chunk;
  block* const next = b->next_in_chunk;
  const bool next_free = next != nullptr && next->free;
  if (prev != nullptr && prev->free) {
    std::size_t merged = prev->size + b->size;
    std::uint64_t e = std::max(prev->free_epoch, b->free_epoch);
    block* after = next;
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
    return prev;
  }
  if (next_free) {
    next->address = b->address;
    next->prev_in_chunk = prev;
    if (prev != nullptr) prev->next_in_chunk = next;
    else b->owner->first = next;
    next->free_epoch = std::max(next->free_epoch, b->free_epoch);
    a.free.resize(next, next->size + b->size);
    a.slab.recycle(b);
    return next;
  }
  a.free.insert(b);
  return b;
}

// Note [Busy pages are the ones no free block covers]
// A paged pool may move a page's memory only while no block that is not free
// (live, quick-cached, pending) touches the page (Note [Pages under the
// blocks]). Free blocks always merge with free neighbours (coalesce), so such a
// page is exactly one that lies wholly inside one free block. A page's state
// then changes only where a carve takes from a free block that covered it whole
// (it becomes busy) or where a free makes a block that covers it whole (it
// becomes free): among the pages that the block taken or freed touches, those
// wholly inside the free block before the carve or after the merge. Every other
// page it touches keeps its state: another block that is not free still touches
// it, or it lies inside a free block before and after. So the carves and frees
// that change no page's state, most of those of blocks under a page on pages
// that other blocks share, compare two page numbers and read no per-page
// record, where a count of the blocks on each page would be read and written
// on every one (docs/benchmarks.md, "Measured in rounds"). Paged segments are
// reserved page-aligned, so page numbers follow from addresses alone (add_chunk
// checks). pool_inspector recomputes the busy pages from the blocks.
namespace {
struct page_numbers {
  std::uintptr_t first = 0;  // address >> page_shift
  std::uintptr_t end = 0;
};
// The pages that [lo, hi) touches and that lie wholly inside [from, to), which holds it.
page_numbers pages_within(std::uintptr_t lo, std::uintptr_t hi, std::uintptr_t from, std::uintptr_t to,
                          unsigned shift) noexcept {
  const std::uintptr_t below_page = (std::uintptr_t{1} << shift) - 1;
  return {std::max(lo >> shift, (from + below_page) >> shift), std::min(((hi - 1) >> shift) + 1, to >> shift)};
}
}  // namespace

void stream_ordered_pool::pages_taken(const block* out, std::uintptr_t from, std::uintptr_t to) noexcept {
  const page_numbers n = pages_within(out->address, out->address + out->size, from, to, page_shift);
  if (n.first >= n.end) return;
  chunk& c = *out->owner;
  const std::uintptr_t base = c.base >> page_shift;
  for (std::uintptr_t k = n.first; k < n.end; ++k) {
    c.set_busy(k - base, true);
    change_busy_mark(c, c.uses[k - base]);
  }
}

void stream_ordered_pool::pages_freed(const arena& a, std::uintptr_t lo, std::uintptr_t hi,
                                      const block* merged) noexcept {
  const page_numbers n = pages_within(lo, hi, merged->address, merged->address + merged->size, page_shift);
  if (n.first >= n.end) return;
  chunk& c = *merged->owner;
  const std::uintptr_t base = c.base >> page_shift;
  for (std::uintptr_t k = n.first; k < n.end; ++k) {
    c.set_busy(k - base, false);
    c.uses[k - base].freed_at = a.frees;
    change_busy_mark(c, c.uses[k - base]);
  }
}

// Note [Quick-cached blocks keep their pages]
// Paged pools: a block freed into the quick cache stays busy on its pages until
// the cache is flushed (the small blocks' slow path flushes its arena's; trims
// and the threshold flush every arena's), so its next hand-out, the hot path, touches no
// page record and needs no check that its pages are still there: a busy page
// never moves. What that holds back is small: quick-cached blocks are under
// slot_min_bytes, a page by default, so none covers a whole page that could
// move; they only keep slots and other blocks from swapping a page they share
// until the flush.
void stream_ordered_pool::flush_quick(arena& a) {
  a.quick.drain([&](block* b) {
    a.live.erase(b->address);
    b->cached = false;
    free_into(a, b, b->free_epoch);
  });
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
  const bool default_stream = a.stream == nullptr || a.stream == CU_STREAM_LEGACY || a.stream == CU_STREAM_PER_THREAD;
  if (default_stream || a.fence == nullptr) guard.emplace(device);
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
    c->pages.assign(n, 0);
    c->home_at.assign(n, nullptr);
    c->ready.assign((n + 63) / 64, 0);
    if (base % page_bytes != 0) throw logic_error(where("add_chunk") + ": a paged segment must start on a page");
    if (for_slots) {
      c->slot_at.assign(n, nullptr);
    } else {
      c->busy.assign((n + 63) / 64, 0);
      c->uses.assign(n, {});
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
  synchronize_and_fence_everything();
  if (void* p = try_own(a, r, true)) return p;
  if (void* p = backing->take_from_others(a, r, true)) return p;
  backing->before_last_growth();
  if (backing->grow(a, r.need, true)) {
    if (void* p = try_own(a, r, true)) return p;
  }
  throw_out_of_memory(r.requested, r.alignment);
}

void* stream_ordered_pool::allocate_slot(arena& a, std::size_t bytes) {
  const std::size_t page = settings.page_bytes;
  const std::size_t size = (bytes + page - 1) / page * page;
  const pool_request r{.size = size, .requested = bytes, .alignment = page, .need = size};
  // The hot path found no free slot that is ready or needs swaps within the
  // arena only (allocate()).
  if (size > backing->largest_possible()) throw_out_of_memory(bytes);
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
  synchronize_and_fence_everything();
  if (void* p = backing->allocate_slot(a, r)) return p;
  throw_out_of_memory(bytes);
}

void stream_ordered_pool::release_block(arena& a, block* b, std::uint64_t epoch) {
  b->pending = false;
  if (b->slot) {
    b->free_epoch = epoch;
    a.live.insert(b->address, b);
    cache_slot(a, b);
    return;
  }
  free_into(a, b, epoch);
}

void stream_ordered_pool::deallocate_foreign(arena& caller, void* ptr, std::size_t bytes) {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  arena* owner = nullptr;
  {
    std::shared_lock dir(chunks_mutex);
    auto it = chunks.upper_bound(address);
    if (it != chunks.begin()) {
      --it;
      if (address < it->first + it->second->size) owner = it->second->owner;
    }
  }
  auto not_ours = [&] {
    return logic_error(where("deallocate") + ": pointer " + pointer_text(ptr) +
                       " was not allocated by this pool, or was already freed");
  };
  if (owner == nullptr || owner == &caller) throw not_ours();  // caller's own live map missed it
  {
    std::lock_guard lock(owner->lock);
    block* b = owner->live.find(address);
    if (b == nullptr || b->cached) throw not_ours();
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
  if (b == nullptr || b->cached) throw not_ours();  // freed by another thread meanwhile
  owner->live.erase(address);
  owner->used_bytes -= b->size;
  b->freed_by = &caller;
  b->pending = true;
  owner->pending.push_back({b, fence, ++owner->pending_sequence, &caller, fenced});
}

void stream_ordered_pool::wait_for(arena& waiter, CUevent fence) {
  if (fence == nullptr) return;  // never recorded: what it covers needed no wait
  device_context_guard guard(device);
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

void stream_ordered_pool::synchronize_and_fence_everything() {
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
}

pool_totals stream_ordered_pool::collect() {
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

void stream_ordered_pool::throw_out_of_memory(std::size_t requested, std::size_t alignment) {
  const memory_info m = device_memory_info(device);
  std::string why = backing->shortage(requested);
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
