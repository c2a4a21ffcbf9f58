// vmm_pool_resource: whether a free slot can be used by swaps alone, and the
// swaps, a run of pages at a time. The arena's lock is held, as for every swap
// within an arena (Note [Reusing a slot on the hot path], page_slots.cpp).
#include <algorithm>

#include "vmm/vmm_pool_impl.hpp"

namespace gpumem {

// Note [Swaps a run at a time]
// A free slot whose pages' handles are primary elsewhere in its arena, on
// pages no block uses, takes them back by swaps (Note [Reusing a slot on the
// hot path]). Asked page by page, each page costs its handle's record and the
// place the record names, dependent loads at scattered addresses, and the swap
// read them again: tens of cycles a page, and a slot on W5's data-pipeline
// takes about a dozen back. But the pages come back in runs. A slot made from
// a free slot's pages takes them first to last (take_whole_slots), and a slot
// takes its own pages back in order, so a slot's pages [i, i + n) mostly hold
// the handles primary on n consecutive pages [j, j + n) of one other place.
// So usable() asks the record of the first page of a run only (swap_place,
// what the page-by-page look asked of every page), and extends the run while
//  - the next page here holds the handle that the next page there holds (the
//    two arrays of records, side by side, no record read),
//  - the page here is not ready and the page there is (a handle is ready
//    exactly where its primary place is, so its primary place is there),
//  - the page there is not busy: in a segment of slots, it lies in the same
//    free slot; elsewhere, its busy bit is clear.
// A page that ends the run starts the next, with its own record. Every page
// is thus a swap exactly when the page-by-page look would say so, and the
// first that is not is asked as it would have been, so the slot chosen and the
// wait recorded are the same. The swaps then write each handle's new primary
// place (as take_back) and the ready bits a word at a time. A slot with more
// runs than usable() keeps is still judged whole, and swapped page by page.

vmm_pool_resource::impl::page_ref vmm_pool_resource::impl::swap_place(arena& a, block* s, std::size_t i) {
  // What keeps the page's handle from this slot, when the arena's lock alone
  // can tell that it still does: a busy page or a live slot of this arena, or
  // no handle at all. The first found is the slot's wait (Note [Slots known to
  // wait]). A handle in another arena or on its way is not known: the look
  // stops there too, without a wait (looking on for one cost more pages looked
  // at than the waits it found saved).
  const chunk& c = *s->owner;
  const page_home* h = c.home_at[i];  // null exactly where no handle is mapped
  if (h == nullptr) {
    s->wait_seen = {&chunk::never_changes, chunk::never_changes};
    return {};
  }
  const page_ref there = h->primary.load();
  if (there.c == nullptr || there.c->owner != &a) return {};
  if (!there.c->page_busy(there.index)) return there;
  std::uint64_t* word =
      there.c->for_slots ? &there.c->slot_at[there.index]->uses : &there.c->uses[there.index].busy_mark;
  *word |= detail::waited_on;  // its change wakes the free slots (Note [Slots known to wait])
  s->wait_seen = {word, *word};
  return {};
}

bool vmm_pool_resource::impl::usable(arena& a, block* s, slot_runs& runs) {
  const chunk& c = *s->owner;
  const auto [first, end] = pages_of(s);
  runs.count = 0;
  runs.complete = true;
  for (std::size_t i = c.first_ready(first, end, false); i < end; i = c.first_ready(i, end, false)) {
    const page_ref there = swap_place(a, s, i);
    if (there.c == nullptr) return false;
    chunk& t = *there.c;
    const std::size_t j = there.index;
    // How far the run may reach there: the free slot's end, or the segment's.
    std::size_t limit = std::min(end - i, t.pages.size() - j);
    if (t.for_slots) {
      const block* y = t.slot_at[j];
      limit = y == nullptr ? 1 : std::min(limit, page_index(t, y->address) + (y->size >> std::countr_zero(page)) - j);
    }
    std::size_t n = 1;
    while (n < limit && c.home_at[i + n] == t.home_at[j + n]) ++n;
    n = std::min(c.first_ready(i, i + n, true), t.first_ready(j, j + n, false) - j + i) - i;
    if (!t.for_slots) n = t.first_busy(j, j + n) - j;
    if (runs.count < runs.runs.size()) {
      runs.runs[runs.count++] = {&t, i, j, n};
    } else {
      runs.complete = false;
    }
    i += n;
  }
  return true;
}

std::size_t vmm_pool_resource::impl::swap_runs(arena& a, block* s, const slot_runs& runs) {
  chunk& c = *s->owner;
  std::size_t pages = 0;
  for (std::size_t k = 0; k < runs.count; ++k) {
    const slot_runs::run& r = runs.runs[k];
    for (std::size_t m = 0; m < r.n; ++m) c.home_at[r.here + m]->primary.store({&c, r.here + m});
    r.at->set_ready_run(r.there, r.there + r.n, false);
    c.set_ready_run(r.here, r.here + r.n, true);
    pages += r.n;
  }
  a.pages_revived_in_runs += pages;
  return pages;
}

}  // namespace gpumem
