// The stream-ordering engine both pools are built on (docs/pool.md, docs/vmm.md):
// per-stream arenas of blocks carved from chunks, the hot path (a quick cache and
// a good-fit index under one arena's lock), fences recorded on demand, frees made
// on another stream than the allocation's, and the order of the slow path.
//
// Where memory comes from and where it goes back is the backing's business
// (pool_backing below): pool_resource's backing takes chunks from an upstream
// resource and moves whole free chunks between streams (pool_reclaim.cpp);
// vmm_pool_resource's maps physical pages under address segments and moves pages
// (src/vmm/page_backing.cpp). The engine calls the backing only on slow paths.
//
// Read arena.hpp's Note [Fencing frees on demand] first.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpumem/capture_watch.hpp"
#include "gpumem/error.hpp"
#include "gpumem/memory_resource.hpp"
#include "pool/arena.hpp"
#include "pool/graph_allocations.hpp"
#include "pool/graph_holds.hpp"
#include "pool/growth_mutex.hpp"
#include "stream_device.hpp"
#include "text.hpp"

namespace gpumem::detail {

// What both pools' options share (pool_options, vmm_pool_options).
struct stream_pool_settings {
  bool reuse_across_streams = true;
  bool quick_cache = true;
  unsigned fence_interval = ~0U;
  std::size_t fence_bytes = ~std::size_t{0};
  bool check_capture = true;
  bool watch_captures = false;
  // Paged pools (vmm_pool_resource): the page, a power of two; chunks then track
  // their pages (chunk::pages, ready, busy) and a block carved over pages that
  // are not ready goes to the backing's make_ready. 0: every chunk is memory.
  std::size_t page_bytes = 0;
  // Paged pools: requests of at least this many bytes (aligned to at most a
  // page) are slots (Note [Slots for large requests]); the default means none.
  std::size_t slot_min_bytes = ~std::size_t{0};
};

// One request on the slow path: `size` rounded to the granule, `need` with room
// for an alignment above the granule.
struct pool_request {
  std::size_t size = 0;
  std::size_t requested = 0;
  std::size_t alignment = 0;
  std::size_t need = 0;
};

// How a pool gets memory and gives it back. Every hook runs off the hot path.
class pool_backing {
 public:
  virtual ~pool_backing() = default;
  // Memory other streams' arenas hold, without growing (slow path steps 2 and 4):
  // carves the request and returns it, or null. `memory_short`: the pool cannot
  // grow, so wait for other arenas' locks and take what is otherwise left alone.
  virtual void* take_from_others(arena& a, const pool_request& r, bool memory_short) = 0;
  // Makes a free block of at least `need` bytes exist in a's index (step 3). The
  // growth mutex is held. `memory_short`: after a device synchronisation.
  virtual bool grow(arena& a, std::size_t need, bool memory_short) = 0;
  // Gives back to the device or the upstream what is free: all of it once the
  // device was synchronised, else what the host has seen complete or fenced. The
  // growth mutex is held. Returns bytes.
  virtual std::size_t give_back(bool device_synchronized) = 0;
  // Step 5, after the device synchronisation and before the last growth: makes
  // the free memory usable for it (pool_resource gives every fully free chunk
  // back to the upstream, so that it can come back as one).
  virtual void before_last_growth() { give_back(true); }
  // Paged pools: gives every page under the carved block `b` of `a` memory of
  // its own (the growth mutex held, no arena lock). False when memory is short
  // (b is then freed by the engine, keeping what it got).
  virtual bool make_ready(arena& a, block* b);
  // Paged pools: a slot for the request (r.size whole pages), the growth mutex
  // held, when the lowest-addressed free slot of that size (if any) is not ready:
  // another free slot, or a new one. Null when memory is short.
  virtual void* allocate_slot(arena& a, const pool_request& r);
  // Paged pools: a free slot for the request whose pages need swaps within
  // `a` only, or null; a's lock held, not the growth mutex (the hot path's
  // miss: Note [Reusing a slot on the hot path], src/vmm/page_slots.cpp).
  virtual void* swap_slot(arena&, const pool_request&) { return nullptr; }
  // Paged pools: a free slot for the request that needs no driver call, or
  // null, once the frees other streams made of a's blocks were absorbed; the
  // growth mutex held shared (no thread grows meanwhile, other threads may
  // reuse slots of other arenas).
  virtual void* reuse_slot(arena&, const pool_request&) { return nullptr; }
  // The end of the out-of-memory message: what the pool holds and what limits it.
  virtual std::string shortage(std::size_t requested) = 0;
  // Requests that need more than this fail at once, without a device synchronisation.
  virtual std::size_t largest_possible() const { return ~std::size_t{0}; }
};

struct pool_totals {
  std::size_t used_bytes = 0;
  std::size_t reserved_bytes = 0;
  std::size_t free_bytes = 0;  // free blocks' bytes (paged pools: addresses, with memory or not)
  std::size_t free_blocks = 0;
  std::size_t largest_free_block = 0;
  std::size_t allocations = 0;
  std::size_t chunks = 0;
  std::size_t streams = 0;
};

class stream_ordered_pool {
 public:
  static constexpr std::size_t granule = std::size_t{1} << free_index::granule_shift;

  // `name`: the resource in messages ("pool_resource").
  stream_ordered_pool(const char* name, int device, stream_pool_settings settings);
  ~stream_ordered_pool();
  stream_ordered_pool(const stream_ordered_pool&) = delete;
  stream_ordered_pool& operator=(const stream_ordered_pool&) = delete;

  void set_backing(pool_backing* b) noexcept { backing = b; }

  // ---- the hot path ----
  void* allocate(std::size_t bytes, stream_view stream, std::size_t alignment);
  void deallocate(void* ptr, std::size_t bytes, stream_view stream);
  // Note [Allocating without waiting]: the hot path's own cases, or null / false
  // before any state changed.
  void* try_allocate_now(std::size_t bytes, stream_view stream, std::size_t alignment);
  bool try_deallocate_now(void* ptr, std::size_t bytes, stream_view stream);
  // The arena the thread's cache holds for `stream`, unless the stream is
  // capturing; null otherwise (no lookup: the arenas' mutex is not taken).
  arena* arena_now(stream_view stream);

  // ---- calls under capture (Note [Pools and stream capture]) ----
  [[gnu::noinline, gnu::cold]] void* allocate_under_capture(std::size_t bytes, stream_view stream,
                                                            std::size_t alignment);
  [[gnu::noinline, gnu::cold]] void deallocate_under_capture(void* ptr, std::size_t bytes, stream_view stream);
  // A block of `a` freed on a's stream under its capture: held for the graph
  // (Note [A pool block freed under a capture], graph_holds.cpp).
  void hold_for_graph(arena& a, void* ptr, std::size_t bytes, CUstream stream);
  [[gnu::noinline, gnu::cold]] void free_blocks_graphs_released();

  // ---- arenas ----
  // The arena of `s` in `out`; false when `s` is new to the pool and being
  // captured (no arena is made then: Note [Pools and stream capture]). A bool, not
  // a null pointer: inlined, the thread's cached arena answers true at compile
  // time, so the hot path tests nothing more than before.
  bool arena_of(stream_view s, arena*& out);
  // The same, for calls that record on the stream: a stream under capture is a
  // logic_error naming `call`.
  arena& arena_for(stream_view s, const char* call);
  [[gnu::noinline]] arena* find_arena(std::uintptr_t key, stream_view s);
  arena* create_arena(std::uintptr_t key, CUstream s);
  static std::uintptr_t key_of(CUstream s) noexcept;
  std::vector<arena*> arenas_except(const arena* skip) const;

  // ---- block operations; the arena's lock is held ----
  // Carves the request from the free block `b`; returns the live block.
  block* carve(arena& a, block* b, std::size_t size, std::size_t requested, std::size_t alignment);
  // Paged pools: the pages of the block `out`, just carved from the free block
  // [from, to), or of [lo, hi), just freed and merged into the free block
  // `merged`, that became busy or free (Note [Busy pages are the ones no free
  // block covers], block_operations.cpp).
  void pages_taken(const block* out, std::uintptr_t from, std::uintptr_t to) noexcept;
  void pages_freed(const arena& a, std::uintptr_t lo, std::uintptr_t hi, const block* merged) noexcept;
  // A page became busy or free (chunk::page_uses::busy_mark).
  static void change_busy_mark(chunk& c, chunk::page_uses& u) noexcept;
  // Paged pools: whether every page `b` touches is ready.
  bool pages_ready(const block* b) const noexcept;
  // The same for a free slot, without a look at its pages while its ready
  // mark holds (Note [A slot's ready mark]).
  bool slot_ready(const block* s) const noexcept;
  // Frees `b` into a's index, merged with its free neighbours; paged pools
  // mark the pages that became free.
  void free_into(arena& a, block* b, std::uint64_t epoch);
  // The merge alone; returns the free block that holds b's range now.
  block* coalesce(arena& a, block* b, std::uint64_t epoch);
  // A free slot of the request's size that is ready, or ready after swaps
  // within `a` (a's lock held), handed out; or null.
  void* take_free_slot(arena& a, std::size_t bytes);
  // Hands out `b`, a block of a's quick cache just taken from it, for `bytes`.
  // Paged pools: its pages stayed busy, and so ready, while it was cached (Note
  // [Quick-cached blocks keep their pages]).
  void take_cached(arena& a, block* b, std::size_t bytes) noexcept;
  // The same for a slot just taken from a's free slots: it also gets its use
  // word (block::uses), which the waits of other slots compare against.
  void take_slot(arena& a, block* s, std::size_t bytes) noexcept;
  // Puts the slot `s`, just freed, into a's free slots, marking its use word freed.
  // `pages_own`: every page under it is known to be its own, so it keeps a ready
  // mark (Note [A slot's ready mark]).
  void cache_slot(arena& a, block* s, bool pages_own);
  // Frees `b`, a live block of `a` at `address` handed out for `bytes`, into the
  // caches or the index (not counted toward fences: note_free does that).
  void free_live(arena& a, block* b, std::uintptr_t address, std::size_t bytes);
  void note_free(arena& a, std::size_t bytes);
  // Whether note_free(a, bytes) would record a fence (a driver call) now.
  bool fence_due_on_free(const arena& a, std::size_t bytes) const noexcept;
  void record_fence(arena& a);
  void request_fences();  // every arena fences at its next free or slow path
  void flush_quick(arena& a);
  // A new record for the first `bytes` of `b`, linked before it in the chunk; `b`
  // keeps the rest. The caller sets b's new size (through an index when b is in one).
  static block* split_off_front(arena& a, block* b, std::size_t bytes);
  // The good fit in a's index carved for the request, or null. `growing`: the
  // caller holds the growth mutex.
  void* try_own(arena& a, const pool_request& r, bool growing);
  // A block just carved whose pages are not all ready (paged pools): made ready
  // by the backing, or freed again (null).
  void* finish_unready(arena& a, block* b, bool growing);

  // ---- slow paths; no lock held on entry ----
  // Blocks held for graphs that are gone: freed now, each on its own stream.
  void take_back_from_graphs() {
    if (held_for_graphs.any_released()) [[unlikely]] free_blocks_graphs_released();
  }
  void* allocate_slow(arena& a, const pool_request& r);
  // Requests of slot_min_bytes or more that take_free_slot found no free slot
  // for: the backing.
  void* allocate_slot(arena& a, std::size_t bytes);
  // A block freed on another stream, or when the device was synchronised, made
  // free in its arena; a slot goes back to the slot cache. a's lock is held.
  void release_block(arena& a, block* b, std::uint64_t epoch);
  void deallocate_foreign(arena& caller, void* ptr, std::size_t bytes);
  // The arena whose chunk holds `address`, or null (takes chunks_mutex).
  arena* chunk_owner(std::uintptr_t address) const;
  bool absorb_pending(arena& a);
  // The blocks other streams freed back to `a` whose frees the host has seen
  // complete (their fence queried): free in `a` at once, needing no wait from
  // anyone (epoch 0). a's lock is held. Any thread may call it.
  void absorb_completed_pending(arena& a);
  // `fence`: an arena's fence event, read under that arena's lock (null: never
  // recorded, so nothing to wait for).
  void wait_for(arena& waiter, CUevent fence);
  // Synchronizes the device, after which every free made before is complete.
  // false, synchronizing nothing, while the capture watch knows of a capture in
  // progress: the driver forbids cuCtxSynchronize then, and it would invalidate
  // that capture (Note [Calls a capture elsewhere forbids]). Without a running
  // watch a pool cannot know, and synchronizes.
  bool synchronize_and_fence_everything();
  // The last resort of an allocation short of memory: synchronize_and_fence_everything,
  // and how it went. A synchronisation the driver refused for a capture the pool
  // could not know of (no watch) is no error of the request's: it fails for want
  // of memory, and its out_of_memory says what happened to the capture.
  enum class last_sync { done, skipped, refused };
  last_sync synchronize_as_last_resort();
  // Every arena's blocks are coalesced (quick caches flushed) before they are read.
  pool_totals collect();
  // `sync`: how the last resort's device synchronisation went, which the error
  // says when it did not run (synchronize_as_last_resort).
  [[noreturn]] void throw_out_of_memory(std::size_t requested, std::size_t alignment = 0,
                                        last_sync sync = last_sync::done);

  // ---- chunks ----
  // Registers a chunk owned by `a` whose whole range is one free block with
  // `epoch`; given `page_bytes` (a paged pool's segment), a block without memory
  // and the chunk's page records, and, `for_slots`, a vacant block (no free
  // index). Takes a's lock.
  chunk* add_chunk(arena& a, std::uintptr_t base, std::size_t bytes, std::uint64_t epoch,
                   std::size_t page_bytes = 0, bool for_slots = false);
  // The chunk holding address, or null (chunks_mutex is taken).
  chunk* chunk_of(std::uintptr_t address) const;
  CUstream maintenance_stream();

  // Messages: "gpumem::<name>::<call>: ...".
  std::string where(const char* call) const { return std::string("gpumem::") + name + "::" + call; }
  // The errors of a free the pool refuses: `ptr` is no live allocation of its
  // own, or was handed out for `had` bytes, not `bytes`. Out of line: thrown only.
  [[gnu::cold]] logic_error not_ours(const void* ptr) const;
  [[gnu::cold]] logic_error wrong_size(const void* ptr, std::size_t had, std::size_t bytes) const;

  const char* const name;
  const int device;
  const stream_pool_settings settings;
  const std::uint64_t id;
  pool_backing* backing = nullptr;
  std::unique_ptr<capture_watch> watch;  // held with settings.watch_captures
  bool watched = false;                  // the watch started: stream_is_capturing may skip the query
  bool periodic_fences = false;          // fence_interval or fence_bytes set (arena.hpp's note)
  unsigned page_shift = 0;               // paged pools: log2(settings.page_bytes)
  std::atomic<bool> several_streams{false};  // fences matter only once a second stream exists

  // Note [Fields that threads write apart from what the hot path reads]
  // Everything above is read by every call and written (almost) never. The
  // locks and counters below are written by whichever thread takes them: the
  // growth mutex by every slot reuse of every stream (W3). Sharing a cache
  // line with them would make each call of every other thread miss on it (a
  // 16-thread W3 spent most of its time on one load of page_shift). Each
  // written group starts a line pair of its own (128 bytes: Intel CPUs fetch
  // lines in adjacent pairs).
  static constexpr std::size_t apart = 128;

  // Lock order: arenas_mutex, then chunks_mutex, then arena locks (one at a time,
  // except under growth_mutex, whose holder alone may hold two).
  alignas(apart) mutable std::shared_mutex arenas_mutex;  // guards `arenas` (lookup misses only)
  std::unordered_map<std::uintptr_t, std::unique_ptr<arena>> arenas;

  alignas(apart) mutable std::shared_mutex chunks_mutex;  // guards `chunks` and chunk::owner
  std::map<std::uintptr_t, std::unique_ptr<chunk>> chunks;  // by base address
  alignas(apart) std::atomic<std::size_t> reserved_bytes{0};  // what the backing holds
  std::atomic<std::size_t> peak_reserved_bytes{0};  // the most reserved_bytes was since the last reset

  // After reserved_bytes grew (and the memory is held): raises the peak to it.
  void note_reserved() noexcept {
    const std::size_t now = reserved_bytes.load(std::memory_order_relaxed);
    std::size_t peak = peak_reserved_bytes.load(std::memory_order_relaxed);
    while (now > peak && !peak_reserved_bytes.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
  }
  // The peak becomes what is held now.
  void reset_peak_reserved() noexcept { peak_reserved_bytes.store(reserved_bytes.load()); }

  // Serialises growing and giving back; held shared only for swaps across
  // streams after an absorb (growth_mutex_type above).
  alignas(apart) growth_mutex_type growth_mutex;
  alignas(apart) std::mutex maintenance_mutex;
  CUstream maintenance = nullptr;

  // What calls under capture handed out: written only then, and large (its shards),
  // so after everything the hot path reads.
  alignas(apart) graph_allocations graph_memory;
  graph_holds held_for_graphs;
};

// ---------------------------------------------------------------------------
// The hot path, inline so that each pool's do_allocate is one call deep.

namespace pool_tls {
// The last arena this thread used, so the hot path finds it with two compares.
struct arena_cache {
  std::uint64_t pool_id = 0;
  std::uintptr_t key = 0;
  arena* found = nullptr;
};
// initial-exec: a plain TLS load, not a __tls_get_addr call, on the hot path.
extern thread_local arena_cache last_arena __attribute__((tls_model("initial-exec")));
// A byte per thread whose address names the thread's per-thread default stream (key_of).
extern thread_local char per_thread_stream_tag __attribute__((tls_model("initial-exec")));
}  // namespace pool_tls

// Arena key: the stream handle, with the two default streams made explicit.
// The per-thread default stream is a different stream on every thread. Inline:
// every call of the hot path computes it.
inline std::uintptr_t stream_ordered_pool::key_of(CUstream s) noexcept {
  if (s == nullptr || s == CU_STREAM_LEGACY) return reinterpret_cast<std::uintptr_t>(CU_STREAM_LEGACY);
  if (s == CU_STREAM_PER_THREAD) return reinterpret_cast<std::uintptr_t>(&pool_tls::per_thread_stream_tag) | 3U;
  return reinterpret_cast<std::uintptr_t>(s);
}

inline bool stream_ordered_pool::arena_of(stream_view s, arena*& out) {
  const std::uintptr_t key = key_of(s.handle());
  const pool_tls::arena_cache& cache = pool_tls::last_arena;
  if (cache.pool_id == id && cache.key == key) [[likely]] {
    out = cache.found;
    return true;
  }
  out = find_arena(key, s);
  return out != nullptr;
}

inline void* stream_ordered_pool::allocate(std::size_t bytes, stream_view stream, std::size_t alignment) {
  arena* found = nullptr;
  if (!arena_of(stream, found) || (settings.check_capture && stream_is_capturing(stream.handle(), device, watched)))
      [[unlikely]] {  // arena_of first: a stream new to the pool is checked there
    return allocate_under_capture(bytes, stream, alignment);
  }
  arena& a = *found;
  if (bytes >= settings.slot_min_bytes && alignment <= settings.page_bytes) {
    {
      std::lock_guard lock(a.lock);
      if (void* p = take_free_slot(a, bytes)) [[likely]] return p;
    }
    return allocate_slot(a, bytes);
  }
  const std::size_t size = (bytes + granule - 1) & ~(granule - 1);
  const std::size_t need = alignment > granule ? size + alignment - granule : size;
  block* unready = nullptr;
  {
    std::lock_guard lock(a.lock);
    if (block* b = a.quick.pop(size, alignment)) [[likely]] {
      take_cached(a, b, bytes);
      return reinterpret_cast<void*>(b->address);
    } else if (block* f = a.free.find(need)) [[likely]] {
      block* out = carve(a, f, size, bytes, alignment);
      if (page_shift == 0 || pages_ready(out)) [[likely]] return reinterpret_cast<void*>(out->address);
      unready = out;
    }
  }
  if (unready != nullptr) [[unlikely]] {
    if (void* p = finish_unready(a, unready, false)) return p;
  }
  return allocate_slow(a, {.size = size, .requested = bytes, .alignment = alignment, .need = need});
}

// Always inline: the compiler stopped inlining it once the lone slot's path was
// added, and a call of its own is a measurable part of W1's large column's pair.
[[gnu::always_inline]] inline void* stream_ordered_pool::take_free_slot(arena& a, std::size_t bytes) {
  // The slot cache's hit, inline as the quick cache's is (W1's large column):
  // the lowest-addressed free slot past those that still wait on a page in
  // use, when it is ready (Note [Slots for large requests]).
  const std::size_t size = (bytes + settings.page_bytes - 1) & ~(settings.page_bytes - 1);
  if (block* s = a.slots.pop_first_ready(size, [&](const block* y) { return slot_ready(y); })) [[likely]] {
    take_slot(a, s, bytes);
    return reinterpret_cast<void*>(s->address);
  }
  // Else one whose pages need swaps within the arena only.
  return backing->swap_slot(a, {.size = size, .requested = bytes, .alignment = settings.page_bytes, .need = size});
}

inline void stream_ordered_pool::take_cached(arena& a, block* b, std::size_t bytes) noexcept {
  b->cached = false;
  b->requested_bytes = bytes;
  a.used_bytes += b->size;
}

inline void stream_ordered_pool::take_slot(arena& a, block* s, std::size_t bytes) noexcept {
  take_cached(a, s, bytes);
  // Taken again over the pages it had, it gets its word back, and the waits on
  // it hold again (Note [A slot's use word across its frees], src/vmm/page_slots.cpp).
  s->uses = (s->uses & slot_freed) != 0 ? s->uses & ~slot_freed : ++a.slot_handouts;
}

inline void stream_ordered_pool::cache_slot(arena& a, block* s, bool pages_own) {
  s->cached = true;  // stays in `live`, as a quick-cached block does
  if (s->uses & waited_on) [[unlikely]] a.slots.wake();  // Note [Slots known to wait]
  s->uses |= slot_freed;  // waited_on stays: the word comes back with it (take_slot)
  a.slots.push(s, pages_own ? s->owner->unready_marks : no_ready_mark);
}

inline void stream_ordered_pool::change_busy_mark(chunk& c, chunk::page_uses& u) noexcept {
  // Only a mark that a wait reads must change (Note [Slots known to wait]).
  if (u.busy_mark & waited_on) [[unlikely]] {
    u.busy_mark = (u.busy_mark & ~waited_on) + 1;
    c.owner->slots.wake();
  }
}

inline bool stream_ordered_pool::slot_ready(const block* s) const noexcept {
  return s->ready_mark == s->owner->unready_marks || pages_ready(s);
}

inline bool stream_ordered_pool::pages_ready(const block* b) const noexcept {
  const chunk& c = *b->owner;
  const std::size_t first = (b->address - c.base) >> page_shift;
  const std::size_t last = (b->address + b->size - 1 - c.base) >> page_shift;
  return c.all_ready(first, last);
}

inline void stream_ordered_pool::deallocate(void* ptr, std::size_t bytes, stream_view stream) {
  arena* found = nullptr;
  if (!arena_of(stream, found) || (settings.check_capture && stream_is_capturing(stream.handle(), device, watched)))
      [[unlikely]] {  // arena_of first, as in allocate
    deallocate_under_capture(ptr, bytes, stream);
    return;
  }
  arena& a = *found;
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  {
    std::lock_guard lock(a.lock);
    if (block* b = a.live.find(address); b != nullptr && !b->cached) [[likely]] {
      if (b->requested_bytes != bytes) throw wrong_size(ptr, b->requested_bytes, bytes);
      const std::size_t size = b->size;
      free_live(a, b, address, bytes);
      note_free(a, size);
      return;
    }
  }
  deallocate_foreign(a, ptr, bytes);
}

// Note [A free tells a slot by its size first]
// Whether a freed block is a slot is a branch that mixed sizes (W2's, a
// program's) mispredict often, and b->slot is known only once the live map's
// lookup and the block's record are loaded: a misprediction there is found
// late. A slot was handed out for at least slot_min_bytes (allocate), and the
// caller checked that `bytes` is what it was handed out for, so a request
// under slot_min_bytes is never a slot: testing `bytes` first, which the
// caller passed in, settles the branch early, and b->slot is read only for
// the large ones (an over-aligned large request is a block). Kept as two
// branches on purpose: folded into one, the test would wait for the record
// again. Measured in docs/benchmarks.md, "Where gpumem loses, and why".
inline void stream_ordered_pool::free_live(arena& a, block* b, std::uintptr_t address, std::size_t bytes) {
  a.used_bytes -= b->size;
  b->free_epoch = ++a.frees;
  if (bytes >= settings.slot_min_bytes) {
    if (b->slot) {
      b->freed_by = &a;
      // Live until now, so its pages are its own; from now on they may move
      // (Note [Slots for large requests]).
      cache_slot(a, b, true);
      return;
    }
  }
  if (settings.quick_cache && a.quick.push(b)) {
    // Stays in `live` so the next allocation of its size skips the map, and
    // keeps its pages busy (Note [Quick-cached blocks keep their pages]).
    b->cached = true;
  } else {
    a.live.erase(address);
    free_into(a, b, b->free_epoch);
  }
}

inline bool stream_ordered_pool::fence_due_on_free(const arena& a, std::size_t bytes) const noexcept {
  if (a.fence_requested.load(std::memory_order_relaxed)) return true;
  return periodic_fences && several_streams.load(std::memory_order_relaxed) &&
         (a.unfenced_count + 1 >= settings.fence_interval || a.unfenced_bytes + bytes >= settings.fence_bytes);
}

// Note [Allocating without waiting]
// try_allocate_now and try_deallocate_now serve callers that hold a lock of
// their own under which the pool must not wait: Python's GIL (DeviceBuffer,
// python/src/device_buffer.cpp), whose release and retake cost about as much as
// the pool's whole hot path. Waiting there would stall every Python thread, and
// could deadlock when the thread the pool waits for needs the GIL. So these do
// the hot path's own cases and nothing that may wait:
//  - the arena is the one the thread's cache holds (no arenas_mutex, which a
//    thread creating an arena holds across driver calls);
//  - the arena's lock is only tried: the slot and growth paths hold it across
//    driver calls and host waits for fences (page_slots.cpp);
//  - an allocation comes from the quick cache, the free index's good fit only
//    where every page under it is ready, or the slot cache where every page
//    is ready or comes back by a swap within the arena (no driver call: Note
//    [Reusing a slot on the hot path]); a free is of the arena's own live
//    block and records no fence (cuEventRecord);
//  - the only driver call is the capture check, a query that takes no lock of
//    the pool's, as CuPy's pool makes under the GIL.
// Anything else returns null or false before any state changes, and the caller
// takes the ordinary path, which may wait, with its lock released, and which
// raises every error (a wrong size, a foreign pointer, a capturing stream).
inline arena* stream_ordered_pool::arena_now(stream_view stream) {
  const pool_tls::arena_cache& cache = pool_tls::last_arena;
  if (cache.pool_id != id || cache.key != key_of(stream.handle())) return nullptr;
  if (settings.check_capture && stream_is_capturing(stream.handle(), device, watched)) return nullptr;
  return cache.found;
}

inline void* stream_ordered_pool::try_allocate_now(std::size_t bytes, stream_view stream, std::size_t alignment) {
  arena* const cached = arena_now(stream);
  if (cached == nullptr) return nullptr;
  arena& a = *cached;
  std::unique_lock lock(a.lock, std::try_to_lock);
  if (!lock.owns_lock()) return nullptr;
  if (bytes >= settings.slot_min_bytes && alignment <= settings.page_bytes) return take_free_slot(a, bytes);
  const std::size_t size = (bytes + granule - 1) & ~(granule - 1);
  if (block* b = a.quick.peek(size, alignment)) {
    if (page_shift != 0 && !pages_ready(b)) return nullptr;
    a.quick.pop(size, alignment);
    take_cached(a, b, bytes);
    return reinterpret_cast<void*>(b->address);
  }
  const std::size_t need = alignment > granule ? size + alignment - granule : size;
  block* f = a.free.find(need);
  if (f == nullptr) return nullptr;
  if (page_shift != 0) {
    // The pages under what carve would hand out (the front of f, aligned; all
    // of f's rest when under a granule would be left).
    const std::uintptr_t start = (f->address + alignment - 1) & ~(std::uintptr_t{alignment} - 1);
    const std::size_t left = f->size - (start - f->address);
    const std::size_t out = left - size >= granule ? size : left;
    const chunk& c = *f->owner;
    if (!c.all_ready((start - c.base) >> page_shift, (start + out - 1 - c.base) >> page_shift)) return nullptr;
  }
  return reinterpret_cast<void*>(carve(a, f, size, bytes, alignment)->address);
}

inline bool stream_ordered_pool::try_deallocate_now(void* ptr, std::size_t bytes, stream_view stream) {
  arena* const cached = arena_now(stream);
  if (cached == nullptr) return false;
  arena& a = *cached;
  std::unique_lock lock(a.lock, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  block* b = a.live.find(address);
  if (b == nullptr || b->cached || b->requested_bytes != bytes || fence_due_on_free(a, b->size)) return false;
  const std::size_t size = b->size;
  free_live(a, b, address, bytes);
  // Counts the free toward periodic fences. None was due above; one another
  // stream asks for meanwhile is recorded here, as deallocate would: a record never waits.
  note_free(a, size);
  return true;
}

}  // namespace gpumem::detail
