// vmm_pool_resource: the streams one host thread drives share their free
// pages, and take them back by swapping. The growth mutex is held where these
// run, exclusively or shared (vmm_pool_impl.hpp).

#include <algorithm>
#include <mutex>
#include <utility>

#include "vmm/vmm_pool_impl.hpp"

namespace gpumem {

// Note [Streams that take turns]
// Streams that work at the same time keep what they freed until memory is
// short (Note [Pages, frugal first]): taking a busy stream's free pages makes
// it take pages back a moment later, a move each time, under the growth mutex,
// and threads that allocate at once would queue there (W3 at 16 threads, when
// every stream took every other's fenced pages before the device: docs/vmm.md).
// Such streams hold about the sum of their own peaks.
//
// Streams that one host thread drives do not work at the same time, as far as
// the pool can tell: their calls come in one program order, one after
// another, and no other thread waits on the mutex meanwhile. A loader stream
// and a compute stream (W5's data-pipeline), a side stream for copies: one
// allocates while the other has its memory free, and the pages should go back
// and forth between them, as one stream's own pages go between its blocks. So
// for those streams (arena::thread_tag: the thread that last took a slow path
// on each):
//  - they count as one stream for the slack (note_peak): what they use
//    together, not the sum of their own peaks;
//  - their fenced free pages come before the device (supply_pages, step 4),
//    the taking stream waiting for the other's fence on the device;
//  - a slot takes back the pages it gave to another of them by swapping, as
//    within one arena (Note [Swaps across streams]), so that once a loop has
//    mapped each page where each stream needs it, the pages change hands with
//    no driver call.
// W5's data-pipeline (three streams, one thread) so holds about the peak of its
// live bytes rather than the sum of its streams' peaks, and moves no page after
// its first replay (docs/benchmarks.md). The thread that last took a slow path
// stands for the thread that drives a stream; a stream several threads use
// changes hands, which changes where pages come from, never the order.
//
// Note [Swaps across streams]
// A slot of stream a whose page is an alias of a handle whose primary place
// is in the arena of stream s (another stream of a's thread) takes the handle
// back when that place is free and a's stream is ordered after its last use
// there:
//  - s's place is in a slot that a's stream freed itself (block::freed_by, a
//    deallocate on a of s's block), whether s has absorbed that slot yet or
//    not: a's stream ordered the free. A pending slot may so give its pages
//    away before it is absorbed; it is not ready then, like any free slot
//    whose pages moved, and the inspector allows it;
//  - or the free there is settled, or covered by a fence of s that a's stream
//    has waited for already (arena::waited: absorbing s's frees of its blocks
//    waits on s's fence);
//  - or the free is fenced: a's stream then waits for s's fence on the device
//    (cuStreamWaitEvent) before the slot is handed out.
// The swap sets the primary place and two ready bits, and moves the page's
// bytes from s's reserved count to a's, all under both arenas' locks, checked
// again under s's (s's hot path may have handed its block out since the
// look). It runs after the slots that need swaps within the arena: in
// find_slot, the growth mutex held exclusively, where one thread at a time
// holds two arena locks; and in reuse_slot right after an absorb of the frees
// other streams made of a's blocks (that absorb's wait orders most of their
// pages for a), the mutex held shared, where s's lock is only tried (Note
// [Reusing a slot on the hot path]).
//
// Which free slot is taken stays the lowest-addressed one of the size that
// needs no driver call. Whether a place is ordered for a depends on which
// stream freed it and on which fences were recorded and waited for, all in
// the program's order (never on whether the device has finished), so a loop
// makes the same choices at every step and settles as in Note [Slots for
// large requests]. (A rule that looked at settled frees first kept moving
// pages for several replays on the simulator and on the GPU: completion
// depends on timing.) A fence recorded after an absorb is no longer needed for
// that: a paged pool records it only when another stream asks
// (stream_ordered_pool.cpp, absorb_pending).

vmm_pool_resource::impl::order_across vmm_pool_resource::impl::order_of(const arena& a, const arena& s,
                                                                           page_ref there) {
  std::uint64_t freed = 0;
  if (there.c->for_slots) {
    const block* y = there.c->slot_at[there.index];
    if (y == nullptr) return order_across::none;
    // a's own stream freed it: free for a, whether s absorbed it yet or not.
    if (y->freed_by == &a && (y->cached || y->pending)) return order_across::ordered;
    if (!y->cached) return order_across::none;
    freed = y->free_epoch;
  } else {
    if (there.c->page_busy(there.index)) return order_across::none;
    freed = there.c->uses[there.index].freed_at;
  }
  if (freed <= s.settled_frees || freed <= a.waited_for(&s)) return order_across::ordered;
  return freed <= s.fenced_frees ? order_across::after_wait : order_across::none;
}

// Holds the lock of one other arena than the caller's at a time: at once under
// the exclusive growth mutex, where one thread at a time holds two arena locks;
// only if free under the shared one, where a thread holding its own lock must
// not wait for another. Kept from page to page while their handles lie in the
// same arena (a slot's pages taken back from another stream mostly do), not
// taken and let go for each: docs/benchmarks.md, "This tree on a slow H200 host".
class vmm_pool_resource::impl::other_arena_lock {
 public:
  explicit other_arena_lock(bool shared) : shared_(shared) {}
  // Whether o's lock is held now (taken if it was not).
  bool hold(arena& o) {
    if (held_ == &o) return true;
    release();
    std::unique_lock lock(o.lock, std::defer_lock);
    if (!shared_) {
      lock.lock();
    } else if (!lock.try_lock()) {
      return false;
    }
    lock_ = std::move(lock);
    held_ = &o;
    return true;
  }
  void release() {
    if (held_ == nullptr) return;
    lock_.unlock();
    held_ = nullptr;
  }

 private:
  std::unique_lock<detail::spin_lock> lock_;
  arena* held_ = nullptr;
  bool shared_;
};

bool vmm_pool_resource::impl::usable_across(arena& a, const block* s, other_arena_lock& held) {
  const chunk& c = *s->owner;
  const auto [first, end] = pages_of(s);
  bool across = false;
  for (std::size_t i = first; i < end; ++i) {
    if (c.is_ready(i)) continue;
    if (c.pages[i] == 0) return false;
    const page_ref there = c.home_at[i]->primary.load();
    if (there.c == nullptr) return false;
    arena& o = *there.c->owner;
    if (&o == &a) {
      if (there.c->page_busy(there.index)) return false;
      continue;
    }
    if (!take_turns(a, o)) return false;  // a stream of another thread keeps its pages
    if (!held.hold(o)) return false;
    // Read again under o's lock: a swap that moved it holds o's lock.
    if (!(c.home_at[i]->primary.load() == there) || order_of(a, o, there) == order_across::none) return false;
    across = true;
  }
  return across;  // one that needs no swap across was take_usable's to take
}

bool vmm_pool_resource::impl::take_back_across(arena& a, chunk& c, std::size_t i, std::vector<fence_wait>& waits,
                                               other_arena_lock& held) {
  page_home& h = *c.home_at[i];
  const page_ref there = h.primary.load();
  arena& s = *there.c->owner;
  // Every write under s's lock (and a's, held by the caller): a's look and s's
  // both read the handle's primary place under their own lock.
  if (!held.hold(s)) return false;
  // Looked at again: where s's lock was let go since usable_across looked (a
  // page of another arena came between), s's hot path may have handed the page
  // out, or another swap moved the handle.
  if (!(h.primary.load() == there)) return false;
  const order_across order = order_of(a, s, there);
  if (order == order_across::none) return false;
  if (order == order_across::after_wait) {
    // One wait per arena: its fence is one event, and its latest record covers
    // every free it fenced before.
    auto same = std::find_if(waits.begin(), waits.end(), [&](const fence_wait& w) { return w.of == &s; });
    if (same == waits.end()) waits.push_back({&s, s.fence, s.fenced_frees});
    else same->fenced = std::max(same->fenced, s.fenced_frees);
  }
  there.c->set_ready(there.index, false);
  s.reserved_bytes -= page;
  h.primary.store({&c, i});
  c.set_ready(i, true);
  a.reserved_bytes += page;
  return true;
}

void vmm_pool_resource::impl::wait_across(arena& a, const std::vector<fence_wait>& waits) {
  for (const fence_wait& w : waits) {
    pool.wait_for(a, w.fence);  // its latest record covers every free it had fenced
    a.note_waited(w.of, w.fenced);
  }
}

vmm_pool_resource::impl::block* vmm_pool_resource::impl::take_usable_across(arena& a, std::size_t size, bool shared) {
  other_arena_lock held(shared);
  block* s = a.slots.pop_lowest_accepted(size, [&](block* y) { return usable_across(a, y, held); });
  if (s == nullptr) return nullptr;
  chunk& c = *s->owner;
  const auto [first, end] = pages_of(s);
  std::size_t swaps = 0;
  bool complete = true;
  std::vector<fence_wait> waits;
  for (std::size_t i = first; i < end; ++i) {
    if (c.is_ready(i)) continue;
    if (c.home_at[i]->primary.load().c->owner == &a) {
      take_back(c, i);
    } else if (!take_back_across(a, c, i, waits, held)) {
      complete = false;  // taken meanwhile: the slot goes back with what it swapped
      continue;
    }
    ++swaps;
  }
  a.pages_revived += swaps;
  held.release();  // before a driver call
  wait_across(a, waits);  // the pages it swapped are the slot's own now, in order
  if (!complete) {
    a.slots.push(s);
    return nullptr;
  }
  return s;
}

}  // namespace gpumem
