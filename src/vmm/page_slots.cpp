// vmm_pool_resource: slots, the blocks of large requests. The growth mutex and
// the arena's lock are held throughout (vmm_pool_impl.hpp).
#include <algorithm>
#include <tuple>

#include "vmm/virtual_memory.hpp"
#include "vmm/vmm_pool_impl.hpp"

namespace gpumem {
namespace vm = detail::vmm;
namespace {
// Free slots of one size beyond which a slot with pages in use elsewhere is
// repaired (remapped) rather than a new one made (Note [Slots for large requests]).
constexpr std::size_t max_free_slots_of_a_size = 64;
}  // namespace

// Note [Slots for large requests]
// A request of slot_min_bytes or more (a page by default) gets a slot: a
// block of whole pages, page-aligned, in a segment of the arena that holds
// slots only; a slot is never split or merged and keeps its address range for
// life. Freed, it waits in the arena's slot cache (exact size, ordered by
// address) with its pages still mapped, and the next request of its size takes
// the lowest-addressed free slot of the size on the hot path when that slot's
// pages are still its own (ready).
//
// Its pages are free memory meanwhile: when a block elsewhere needs pages,
// they move like any free page (Note [Pages under the blocks]), and the slot
// keeps their old places as aliases. A request whose lowest-addressed slot is
// not ready looks, off the hot path, at every free slot of its size for the
// lowest-addressed one whose every page is ready or an alias of a page that is
// free now (not busy) in this arena: it takes those back by swapping primary and
// alias (no driver call). Only when none is usable does it make a new slot:
// addresses from the arena's slot segments (after every slot made so far),
// pages frugal first (Note [Pages, frugal first]), mapped there; their old
// places become aliases. A usable slot is one that needs no driver call; a slot
// whose pages are in use elsewhere waits, and its pages stay where they are.
//
// Why a loop settles. Which slot a request takes depends only on which
// handles are in use at that moment (a slot is usable when none of its handles
// is) and on the slots' addresses, never on where a handle is the primary or
// on the order of the frees. Take a loop whose steps repeat the same requests
// and frees. If step k makes new slots at requests r1 < r2 < ..., then in step
// k + 1 every request before r1 takes the slot it took in step k (the same
// handles are in use, and no slot made later has a lower address); at r1 the
// slot made there in step k is usable (its handles were free at that moment,
// and the same ones are now), and no lower-addressed slot is (none was in step
// k); so the handles in use stay the same, and the argument goes on to r2 and
// beyond. Step k + 1 therefore makes no slot and no driver call, and neither
// does any step after it. (A choice that depended on the order of frees or on
// where handles are primary, as a most-recently-freed cache or remapping a
// slot that is almost usable does, changes the handles in use from step to
// step, and the loop keeps moving pages: docs/benchmarks-history.md, "Slots
// that settle".) The price is addresses and aliases, never memory: a new slot's
// pages are free pages mapped once more. Only a size with
// max_free_slots_of_a_size free slots already gets its nearest slot repaired
// (its pages in use elsewhere replaced by free ones, when under half of them)
// instead of another slot, which bounds the slots a loop that never repeats
// can pile up. The other price is rounding: a slot is whole pages, under a page
// per large request more than asked (a few percent of the peak for the logs W5
// replays).
//
// trim() and release() unmap the settled aliases and give back the free
// pages; a free slot left without pages becomes vacant addresses again.

// Note [A slot's use word across its frees]
// A free slot whose page is an alias of a handle that a live slot x holds waits
// on x's use word (block::uses; Note [Slots known to wait]). When x is freed,
// the wait must end: the handle is free in x, and the waiting slot could take it
// back. So the free sets slot_freed in the word (and wakes the free slots when
// a wait reads it). When x is handed out again without a page of it remapped,
// which is every hand-out but a repair's and a new slot's, the word loses
// slot_freed and is what it was, waited_on included: x's pages hold the same
// handles as before (a slot is handed out with every page ready, each page maps
// the handle it mapped, and a live slot's pages do not move), so every wait
// recorded on the word is true again, and the slots that recorded it are passed
// again with one load, not looked at (usable()) and found waiting on the same
// word once more. (With a new word at every hand-out, a W2 slot request in six
// left the hot path for that look.) A repair (find_slot) and a new slot
// (new_slot, vacant addresses that may have been another slot's) clear the word,
// so that their hand-out draws a new one from the arena's count, as a slot
// handed out for the first time does; vacant addresses keep none. The choice of
// slots is unchanged: a slot passed is one whose look would have found it
// waiting.

vmm_pool_resource::impl::page_use vmm_pool_resource::impl::use_of(arena& a, const chunk& c, std::size_t i) const {
  if (c.is_ready(i)) return page_use::ready;
  if (c.pages[i] == 0) return page_use::conflict;
  const page_ref there = c.home_at[i]->primary.load();
  if (there.c == nullptr || there.c->owner != &a || there.c->page_busy(there.index)) return page_use::conflict;
  return page_use::swap;
}

vmm_pool_resource::impl::slot_fit vmm_pool_resource::impl::fit_of(arena& a, const block* s) const {
  const chunk& c = *s->owner;
  const auto [first, end] = pages_of(s);
  slot_fit f;
  for (std::size_t i = first; i < end; ++i) {
    const page_use u = use_of(a, c, i);
    f.conflicts += u == page_use::conflict;
    f.swaps += u == page_use::swap;
  }
  return f;
}

bool vmm_pool_resource::impl::usable(arena& a, block* s) {
  ++a.slot_looks;
  const chunk& c = *s->owner;
  const auto [first, end] = pages_of(s);
  return c.for_each_unready(first, end, [&](std::size_t i) {
    // What keeps the page's handle from this slot, when the arena's lock alone
    // can tell that it still does: a busy page or a live slot of this arena,
    // or no handle at all. The first found is the slot's wait (Note [Slots
    // known to wait]). A handle in another arena or on its way is not known:
    // the look stops there too, without a wait (looking on for one cost more
    // pages looked at than the waits it found saved).
    const page_home* h = c.home_at[i];  // null exactly where no handle is mapped
    if (h == nullptr) {
      s->wait_seen = {&chunk::never_changes, chunk::never_changes};
      return false;
    }
    const page_ref there = h->primary.load();
    if (there.c == nullptr || there.c->owner != &a) return false;
    if (!there.c->page_busy(there.index)) return true;  // a swap
    std::uint64_t* word =
        there.c->for_slots ? &there.c->slot_at[there.index]->uses : &there.c->uses[there.index].busy_mark;
    *word |= detail::waited_on;  // its change wakes the free slots (Note [Slots known to wait])
    s->wait_seen = {word, *word};
    return false;
  });
}

void vmm_pool_resource::impl::take_back(chunk& c, std::size_t i) {
  page_home& h = *c.home_at[i];
  const page_ref there = h.primary.load();
  there.c->set_ready(there.index, false);
  h.primary.store({&c, i});
  c.set_ready(i, true);
}

vmm_pool_resource::impl::block* vmm_pool_resource::impl::new_slot(arena& a, std::size_t size,
                                                                   std::unique_lock<detail::spin_lock>& lock) {
  auto find_vacant = [&]() -> block* {
    for (chunk* c : a.chunks) {
      if (!c->for_slots) continue;
      for (block* b = c->first; b != nullptr; b = b->next_in_chunk) {
        if (b->vacant && b->size >= size) return b;
      }
    }
    return nullptr;
  };
  block* v = find_vacant();
  if (v == nullptr) {
    // A new segment: addresses are plentiful, and the free slots' pages and
    // aliases are what lets a loop's next steps make no driver call. Only when
    // no address range is left do free slots give their addresses back (their
    // pages go back to the device, or stay where they serve as primaries), and
    // empty segments theirs (Note [When addresses run short], page_backing.cpp):
    // then vacant addresses of this arena's may serve, or none (memory short).
    lock.unlock();
    new_segment(a, size, true);
    lock.lock();
    v = find_vacant();
    if (v == nullptr) return nullptr;
  }
  block* s = v;
  if (v->size > size) {
    s = detail::stream_ordered_pool::split_off_front(a, v, size);
    v->size -= size;
  }
  s->vacant = false;
  s->slot = true;
  s->uses = 0;  // a record may have served another slot: a new word when handed out
  chunk& c = *s->owner;
  const std::size_t first = page_index(c, s->address);
  std::fill_n(c.slot_at.begin() + static_cast<std::ptrdiff_t>(first), s->size / page, s);
  return s;
}

std::size_t vmm_pool_resource::impl::take_whole_slots(arena& a, std::size_t count, std::vector<std::uint64_t>& out,
                                                      const std::function<bool(const block*)>& accept) {
  // Free slots with pages of their own, and how many.
  std::vector<std::pair<block*, std::size_t>> have;
  a.slots.for_each_until([&](block* y) {
    if (!accept(y)) return false;
    const auto [first, end] = pages_of(y);
    const std::size_t n = y->owner->count_ready(first, end);
    if (n != 0) have.emplace_back(y, n);
    return false;
  });
  std::size_t got = 0;
  while (got < count && !have.empty()) {
    const std::size_t want = count - got;
    // The slot with exactly the pages left, else the fewest that cover them, else the most.
    std::size_t pick = 0;
    for (std::size_t k = 1; k < have.size(); ++k) {
      const std::size_t nk = have[k].second, np = have[pick].second;
      const bool k_covers = nk >= want, p_covers = np >= want;
      if (k_covers != p_covers ? k_covers : (k_covers ? nk < np : nk > np)) pick = k;
    }
    block* y = have[pick].first;
    have.erase(have.begin() + static_cast<std::ptrdiff_t>(pick));
    chunk& c = *y->owner;
    const auto [first, end] = pages_of(y);
    for (std::size_t i = end; i-- > first && got < count;) {
      if (!c.is_ready(i)) continue;
      take_page(a, c, i, out);
      ++got;
    }
  }
  return got;
}

// Note [Reusing a slot on the hot path]
// Most requests that miss the slot cache's hit find a free slot that needs
// swaps only: its aliases' handles are free in the same arena. Taking it
// reads the handles' places and swaps primary and alias; it does not create,
// map or move anything. It runs on the hot path, under the arena's lock alone
// (swap_slot), as a ready slot's hit does; the growth mutex is taken only
// after that fails: shared for the swaps across streams after an absorb
// (reuse_slot), exclusively for a new or repaired slot (allocate_slot). What
// makes the arena's lock enough:
//  - a handle's primary place is written only under the lock of the arena
//    where it was and of the one where it goes (a swap within the arena, a
//    swap across streams, take_page, map_pages and return_unplaced all hold
//    them), so a place in this arena does not change under the look, and a
//    handle on its way elsewhere (no primary, or a place in another arena) is
//    not a swap (usable() checks the owner);
//  - other arenas read a handle's primary place (page_home::primary, two
//    relaxed atomics) only to see whether it is theirs, and a swap within this
//    arena leaves it in this arena;
//  - a handle's record is erased, and an alias unmapped, only under the lock
//    of the arena of its places (release_free_pages, unmap_alias), so the
//    records the slot's pages point at stay; the swap looks nothing up in the
//    handle map, whose shape growth changes;
//  - whoever looks at several arenas (growth, trim, statistics, the
//    inspector) takes each one's lock, and counts nothing that a swap within
//    an arena changes (its reserved bytes, its alias count) across two of them;
//  - a thread that holds its arena's lock never waits for another's.
// Threads of different streams so reuse slots at once without meeting on any
// shared word (W3), and a miss costs the swaps and a second look at the row,
// not two more lock round trips (W5, docs/benchmarks.md).

void* vmm_pool_resource::impl::swap_slot(arena& a, const detail::pool_request& r) {
  block* s = take_usable(a, r.size);
  return s != nullptr ? hand_out(a, s, r.requested) : nullptr;
}

void* vmm_pool_resource::impl::reuse_slot(arena& a, const detail::pool_request& r) {
  std::lock_guard lock(a.lock);
  // The frees other streams made of a's blocks were just absorbed: a slot may
  // need swaps within a now, or swaps across streams, whose absorb's wait on
  // their fences ordered most of their pages too (arena::waited), where a swap
  // before it would wait on its own.
  block* s = take_usable(a, r.size);
  if (s == nullptr && a.takes_turns) s = take_usable_across(a, r.size, true);
  return s != nullptr ? hand_out(a, s, r.requested) : nullptr;
}

void* vmm_pool_resource::impl::allocate_slot(arena& a, const detail::pool_request& r) {
  void* p = find_slot(a, r);
  enforce_threshold();
  return p;
}

void* vmm_pool_resource::impl::hand_out(arena& a, block* s, std::size_t requested) {
  if (!s->cached) a.live.insert(s->address, s);  // a new slot
  pool.take_slot(a, s, requested);
  return reinterpret_cast<void*>(s->address);
}

vmm_pool_resource::impl::block* vmm_pool_resource::impl::take_usable(arena& a, std::size_t size) {
  // The lowest-addressed free slot of the size that needs no page remapped,
  // past those whose recorded wait still holds. The choice depends on the
  // slots and on which handles are in use, not on the order of the frees, so
  // a loop makes it the same way at every step (the hot paths take the
  // lowest-addressed free slot past those that wait only when it is ready: the
  // same choice). Its aliases take their handles back: swaps, no driver call.
  block* s = a.slots.pop_lowest_accepted(size, [&](block* y) { return usable(a, y); });
  if (s == nullptr) return nullptr;
  chunk& c = *s->owner;
  const auto [first, end] = pages_of(s);
  std::size_t swaps = 0;
  c.for_each_unready(first, end, [&](std::size_t i) {
    take_back(c, i);
    ++swaps;
    return true;
  });
  a.pages_revived += swaps;
  return s;
}

void* vmm_pool_resource::impl::find_slot(arena& a, const detail::pool_request& r) {
  const std::vector<arena*> others = pool.arenas_except(&a);
  pool.absorb_pending(a);  // slots other streams freed back to this one
  std::unique_lock lock(a.lock);
  // 1. A free slot that needs swaps only (take_usable), or swaps with the free
  //    pages of streams this thread drives too (Note [Swaps across streams]).
  if (block* s = take_usable(a, r.size)) return hand_out(a, s, r.requested);
  if (pool.settings.reuse_across_streams && !others.empty()) {
    if (block* s = take_usable_across(a, r.size, false)) return hand_out(a, s, r.requested);
  }
  //    Failing that, only while the size has many free slots, the one that
  //    needs the fewest remapped, repaired when under half (Note [Slots for
  //    large requests]).
  const std::size_t n = r.size / page;
  block* best = nullptr;
  if (a.slots.count_of(r.size) >= max_free_slots_of_a_size) {
    std::size_t fewest = n;
    a.slots.for_each_of(r.size, [&](block* s) {
      const std::size_t conflicts = fit_of(a, s).conflicts;
      if (conflicts * 2 < n && (conflicts < fewest || (conflicts == fewest && s->address < best->address))) {
        best = s;
        fewest = conflicts;
      }
    });
    if (best != nullptr) a.slots.remove(best);
  }
  if (best != nullptr) {
    best->uses = 0;  // its pages change: a new word when handed out (Note [A slot's use word across its frees])
    chunk& c = *best->owner;
    const auto [first, end] = pages_of(best);
    // Its pages in use elsewhere lose their aliases (once settled), and pages come.
    const std::vector<std::size_t> missing = repair_pages(a, c, first, end, best->free_epoch);
    if (!missing.empty() && !fill_pages(a, others, c, missing)) {
      a.slots.push(best);  // memory is short: it waits, with what it got
      return nullptr;
    }
    return hand_out(a, best, r.requested);
  }
  // 2. A new slot, its pages frugal first.
  block* s = new_slot(a, r.size, lock);
  if (s == nullptr) return nullptr;
  note_peak(a, others);
  chunk& c = *s->owner;
  const std::size_t first = page_index(c, s->address);
  // Whole free slots first (GMLake stitches whole blocks the same way): the new
  // slot's pages are then exactly those of a few others, and it can be used
  // again whenever those are free, which in a loop is at the same point of
  // every step. Then pages from anywhere, frugal first.
  std::vector<std::uint64_t> handles;
  note_moved(take_whole_slots(a, n, handles, [](const block*) { return true; }));
  if (handles.size() < n) {
    const std::vector<std::uint64_t> more = supply_pages(a, others, n - handles.size());
    handles.insert(handles.end(), more.begin(), more.end());
  }
  // A mapping the driver had no memory for returned every page (map_pages): short too.
  const bool mapped = handles.empty() || map_pages(a, c, first, handles, 0, handles.size());
  if (!mapped || handles.size() < n) {
    // Memory is short: the slot waits, free, with the pages it got.
    s->free_epoch = ++a.frees;
    s->cached = true;
    a.live.insert(s->address, s);
    a.slots.push(s);
    return nullptr;
  }
  return hand_out(a, s, r.requested);
}

}  // namespace gpumem
