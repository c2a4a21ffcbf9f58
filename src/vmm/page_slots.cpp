// vmm_pool_resource: slots, the blocks of large requests. The growth mutex and
// the arena's lock are held throughout (vmm_pool_impl.hpp).
#include <algorithm>
#include <limits>
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

detail::page_ref vmm_pool_resource::impl::take_back(chunk& c, std::size_t i) {
  page_home& h = *c.home_at[i];
  const page_ref there = h.primary.load();
  there.c->set_ready(there.index, false);
  h.primary.store({&c, i});
  c.set_ready(i, true);
  return there;
}

// Note [Take-backs remembered]
// A loop that has settled (Note [Slots for large requests]) takes its free
// slots back by swaps, and the same slot is taken back the same way at the
// same point of every step: the same pages of it are aliases, and their
// handles' primary places are the same pages elsewhere. take_usable() looking
// and swapping page by page reads every such page's handle record (a cache
// miss each), and on data-pipeline that was the largest part of the default's
// time (docs/vmm.md, "Where the pool is slow"). So a slot remembers its last
// slot_memo_set::ways different take-backs (block::memos, kept in its chunk),
// each as at most slot_memo::max_runs runs: pages [at, at + n) of the slot
// whose primaries were pages from, from + step, ... of the same segment, under
// one slot there. Only take-backs whose every page came from the slot's own
// segment are remembered.
//
// A memo is trusted only as far as it is checked, from the chunk's bitmaps and
// the source slots' records, never from the handle records:
//  - the pages of the segment hold the handles they held when it was made: the
//    chunk forgets every memo when a page there gets or loses a handle
//    (set_page) or a slot is made or vacated there (set_slot_over), and a
//    set serves the slot whose first page it names (a record reused for a new
//    slot starts with none);
//  - so, page by page, a run's source page and its target hold one handle, and
//    the source is that handle's primary exactly where its ready bit is set;
//  - the check: the slot's unready pages number what the memo covers, every
//    run's source pages are ready, and the slot over them is free (page_busy,
//    one slot per run). A handle has one primary place, so a target whose
//    source is ready is not: the slot's unready pages are exactly the memo's,
//    each one's handle is primary at a free page of this arena, and usable()
//    would have said yes. The choice of slot is the one made without memos,
//    and so is every page's new place.
// take_back_runs() then stores each page's primary and flips the ready bits a
// word at a time. A memo that fails its check costs a few words of bitmaps,
// and the slot is looked at as before.

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
  s->memos = 0;
  chunk& c = *s->owner;
  c.set_slot_over(page_index(c, s->address), s->size / page, s);
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
  // same choice). Its aliases take their handles back: swaps, no driver call,
  // a run at a time when the slot remembers the way (Note [Take-backs remembered]).
  const detail::slot_memo* remembered = nullptr;  // the accepted slot's, when it has one
  block* s = a.slots.pop_lowest_accepted(size, [&](block* y) {
    remembered = valid_memo(a, y);
    return remembered != nullptr || usable(a, y);
  });
  if (s == nullptr) return nullptr;
  chunk& c = *s->owner;
  if (remembered != nullptr) {
    a.pages_revived += take_back_runs(c, *remembered);
    ++a.remembered_take_backs;
    return s;
  }
  const auto [first, end] = pages_of(s);
  std::size_t swaps = 0;
  detail::slot_memo m;
  bool keep = true;  // every page so far came from this segment, in runs that fit
  const block* last_source = nullptr;
  c.for_each_unready(first, end, [&](std::size_t i) {
    const page_ref there = take_back(c, i);
    ++swaps;
    if (keep) {
      const block* source = there.c == &c ? c.slot_at[there.index] : nullptr;
      keep = source != nullptr && m.extend(i, there.index, source == last_source);
      last_source = source;
    }
    return true;
  });
  if (keep && swaps != 0) remember(c, s, first, m);
  a.pages_revived += swaps;
  return s;
}

namespace {
// The take-backs slot s remembers, when its chunk still has them.
detail::slot_memo_set* memos_of(detail::chunk& c, const detail::block* s, std::size_t first) {
  if (s->memos == 0 || s->memos > c.memos.size()) return nullptr;
  detail::slot_memo_set* set = &c.memos[s->memos - 1U];
  return set->first_page == first ? set : nullptr;
}
}  // namespace

const detail::slot_memo* vmm_pool_resource::impl::valid_memo(arena& a, const block* s) {
  chunk& c = *s->owner;
  const auto [first, end] = pages_of(s);
  const detail::slot_memo_set* set = memos_of(c, s, first);
  if (set == nullptr) return nullptr;
  const std::size_t unready = (end - first) - c.count_ready(first, end);
  if (unready == 0) return nullptr;  // nothing to take back: usable() says so at once
  for (std::size_t w = 0; w < detail::slot_memo_set::ways; ++w) {
    if (set->keys[w] != unready) continue;
    const detail::slot_memo& m = set->memos[w];
    bool holds = true;
    for (std::uint32_t k = 0; k < m.count && holds; ++k) {
      const detail::memo_run& r = m.runs[k];
      holds = c.all_ready(r.source_begin(), r.source_end() - 1) && !c.page_busy(r.source_begin());
    }
    if (holds) {
      ++a.slot_looks;
      return &m;
    }
  }
  return nullptr;
}

std::size_t vmm_pool_resource::impl::take_back_runs(chunk& c, const detail::slot_memo& m) {
  for (std::uint32_t k = 0; k < m.count; ++k) {
    const detail::memo_run& r = m.runs[k];
    for (std::size_t i = r.at; i < std::size_t{r.at} + r.n; ++i) c.home_at[i]->primary.store({&c, i});
    c.set_ready_run(r.source_begin(), r.source_end(), false);
    c.set_ready_run(r.at, std::size_t{r.at} + r.n, true);
  }
  return m.pages;
}

void vmm_pool_resource::impl::remember(chunk& c, block* s, std::size_t first, const detail::slot_memo& m) {
  detail::slot_memo_set* set = memos_of(c, s, first);
  if (set == nullptr) {
    if (c.memos.size() >= std::numeric_limits<std::uint16_t>::max()) return;
    set = &c.memos.emplace_back();
    set->first_page = first;
    s->memos = static_cast<std::uint16_t>(c.memos.size());
  }
  set->remember(m);
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
