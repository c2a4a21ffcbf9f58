// One stream's share of a pool: its free blocks, its live allocations, the
// upstream chunks it owns, and the fence that orders its frees for other streams.
//
// Note [Fencing frees on demand]
// A block freed on stream S may be reused on S at once: S runs in order. Another
// stream T may reuse it only after S's work queued before the free, so T must
// wait (on the device) for an event recorded on S after the free. RMM records an
// event on every free, which costs more than the rest of a free; with many
// threads the event records also meet in the driver's locks. An arena instead
// counts its frees (`frees`); a block carries the count at which it became free
// (block::free_epoch) and is *fenced*, safe for T after cuStreamWaitEvent(T,
// fence), once `fenced_frees` >= that count. The arena records its `fence` event
// on S, and sets `fenced_frees = frees`, only:
//  - at S's next free or slow path after another stream asked (`fence_requested`:
//    it found S's free memory it could use unfenced, or S's lock busy);
//  - on S's slow paths that make blocks usable by others (absorbing pending
//    frees; in a paged pool only when asked, since the stream that freed a
//    slot takes its pages without one: Note [Swaps across streams]) and on a
//    free on S of another arena's block (deallocate_foreign);
//  - on trim(S);
//  - every `fence_interval` frees or `fence_bytes` freed while the pool serves
//    several streams, if the options ask for it (by default they do not).
// So the hot path records nothing and a pool used by one stream never fences.
// The cost is timeliness: T's first miss finds S's frees unfenced, asks, and
// grows; a later miss takes what S fenced meanwhile. When the pool cannot grow,
// a device synchronisation makes every free complete (the memory-short path).
//
// Why not let T record S's fence itself, under S's lock (requester-side fencing)?
// That needs S to be alive, and gpumem cannot know: a program may destroy a stream
// as soon as its last call returns (docs/pool.md, "Assumptions"), and recording on
// a destroyed handle is undefined (or on a new stream that reuses it, or on a
// stream of another context); the per-thread default stream names the calling
// thread's stream, so T cannot name S's at all; and a record on a stream under
// capture becomes a node of the program's graph, and T's wait on it would pull T
// into that capture. So every record is made on the stream of the call being
// served, which is alive and ordered by its caller.
//
// Waits use the event's most recent record when cuStreamWaitEvent is called. All
// records of one arena's event are on the arena's stream and `fenced_frees` only
// grows under the arena's lock, so a newer record than the one that fenced a
// block covers it too: a taker may wait after dropping the lock.
//
// Taking other streams' memory while the pool can still grow is opportunistic and
// whole chunks only: a whole chunk changes arena, and the streams keep no tie.
// Lending single blocks of another arena (the block stays there, and its free on
// the borrower's stream goes back as a pending free, with an event record) is kept
// for when the upstream cannot give more: lent blocks otherwise keep passing from
// stream to stream, each free an event record and a visit to another arena's lock.
//
// Every block of a chunk is managed by the chunk's owning arena, so splitting and
// coalescing need only that arena's lock. A block freed on another stream U goes
// to its owner's `pending` list with U's fence recorded; the owner absorbs it
// after waiting on U's fence (on the device), when its own free blocks fall short.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <cuda.h>

#include "pool/block.hpp"
#include "pool/free_index.hpp"
#include "pool/pointer_map.hpp"
#include "pool/quick_cache.hpp"
#include "pool/free_slots.hpp"
#include "pool/spin_lock.hpp"

namespace gpumem::detail {

struct arena;

struct pending_free {
  block* freed = nullptr;
  CUevent fence = nullptr;  // the freeing stream's fence, recorded after the free
  std::uint64_t sequence = 0;
  const arena* by = nullptr;     // the freeing stream's arena
  std::uint64_t by_fenced = 0;   // its fenced_frees when that fence was recorded
};

// Own cache lines: arenas are written by different threads on every operation.
struct alignas(64) arena {
  explicit arena(CUstream s) : stream(s) {}

  spin_lock lock;
  CUstream stream;  // the stream every call through this arena is ordered on

  free_index free;
  quick_cache quick;  // freed blocks kept whole by size (quick_cache.hpp)
  pointer_map live;   // live and quick-cached blocks by address
  block_slab slab;
  std::vector<chunk*> chunks;
  std::vector<pending_free> pending;
  std::uint64_t pending_sequence = 0;

  CUevent fence = nullptr;  // created at first record
  std::uint64_t frees = 0;
  std::uint64_t fenced_frees = 0;
  unsigned unfenced_count = 0;
  std::size_t unfenced_bytes = 0;
  // Set by a stream that found this arena's free memory unfenced: fence at the
  // next free or slow path (Note [Fencing frees on demand]).
  std::atomic<bool> fence_requested{false};

  std::size_t used_bytes = 0;
  std::size_t reserved_bytes = 0;

  // The free count the host has seen complete: the fence's last record, once
  // cuEventQuery said so, or everything before a device synchronisation (paged
  // pools unmap only what is settled: src/vmm/page_blocks.cpp).
  std::uint64_t settled_frees = 0;
  free_slots slots;  // paged pools: free slots by size
  std::uint64_t slot_handouts = 0;  // slots handed out, ever: each hand-out's block::uses
  // Paged pools: pages taken back by a place of this arena that they had left
  // (swaps), ever; counted under the lock, not on a word every thread writes.
  std::uint64_t pages_revived = 0;
  // Paged pools: free slots whose pages were looked at (usable()), ever: what
  // the slots' recorded waits spare (pool_inspector::slot_looks).
  std::uint64_t slot_looks = 0;
  // Paged pools: `frees` when another stream last saw it change, and when
  // (steady_clock ns); a stream that has freed nothing for a while is idle, and
  // its free pages may go to others (src/vmm/page_backing.cpp).
  std::uint64_t frees_seen = 0;
  std::int64_t frees_seen_ns = 0;
  // Paged pools: the most bytes this arena had in use when it needed pages (its
  // own peak; Note [Pages, frugal first]).
  std::size_t peak_used_bytes = 0;
  // Threads of this arena's stream waiting for or holding the growth mutex: a
  // stream that waits there frees nothing meanwhile and is not idle.
  std::atomic<int> growth_waiters{0};
  // The host thread (this_thread_tag) that last took a slow path on this
  // arena's stream: paged pools let the streams one thread drives share free
  // pages as they go (Note [Streams that take turns], src/vmm/swaps_across_streams.cpp).
  std::atomic<std::uintptr_t> thread_tag{0};
  // Paged pools: another stream was seen driven by the same thread (`lock`).
  bool takes_turns = false;

  // Other arenas' free counts this arena's stream is ordered after: it waited
  // on the device for their fences recorded at those counts (absorbing their
  // frees of its blocks, or taking their pages). Paged pools read it (Note
  // [Swaps across streams], src/vmm/swaps_across_streams.cpp). Guarded by `lock`.
  std::vector<std::pair<const arena*, std::uint64_t>> waited;
  void note_waited(const arena* s, std::uint64_t fenced) {
    for (auto& [who, upto] : waited) {
      if (who == s) {
        upto = std::max(upto, fenced);
        return;
      }
    }
    waited.emplace_back(s, fenced);
  }
  std::uint64_t waited_for(const arena* s) const noexcept {
    for (const auto& [who, upto] : waited) {
      if (who == s) return upto;
    }
    return 0;
  }

  bool is_fenced(const block* b) const noexcept { return b->free_epoch <= fenced_frees; }
};

// A word unique to the calling thread while it runs. Initial-exec, as the
// pools' other thread-locals: one load, no call into the dynamic loader.
inline std::uintptr_t this_thread_tag() noexcept {
  thread_local const char tag __attribute__((tls_model("initial-exec"))) = 0;
  return reinterpret_cast<std::uintptr_t>(&tag);
}

// Counts a thread of `a` as waiting for (then holding) the growth mutex, and
// notes it as the thread that drives a's stream.
struct growth_waiter {
  explicit growth_waiter(arena& a) noexcept : a_(a) {
    a_.growth_waiters.fetch_add(1, std::memory_order_relaxed);
    a_.thread_tag.store(this_thread_tag(), std::memory_order_relaxed);
  }
  ~growth_waiter() { a_.growth_waiters.fetch_sub(1, std::memory_order_relaxed); }
  growth_waiter(const growth_waiter&) = delete;
  growth_waiter& operator=(const growth_waiter&) = delete;

 private:
  arena& a_;
};

}  // namespace gpumem::detail
