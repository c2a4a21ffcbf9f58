// vmm_pool_resource: the pages under an arena's blocks. Making a carved block's
// pages ready, taking whole free pages, aliases, and giving pages back. The
// growth mutex and the arena's lock are held where vmm_pool_impl.hpp says.
#include <algorithm>
#include <bit>
#include <chrono>

#include "driver/capture_interaction.hpp"
#include "driver/driver.hpp"
#include "gpumem/error.hpp"
#include "vmm/virtual_memory.hpp"
#include "vmm/vmm_pool_impl.hpp"

namespace gpumem {
namespace vm = detail::vmm;

// Note [Pages under the blocks]
// Each stream's arena owns segments: address ranges reserved once (a chunk of
// the engine each, a device's memory long by default) and carved into blocks
// exactly as pool_resource carves upstream chunks, by the same engine and hot
// path. Physical memory comes in pages of `page` bytes, one handle each, mapped
// at page-aligned addresses of segments. Per page the chunk records the handle
// mapped there (`pages`, 0: none), whether that handle's primary place is there
// (`ready`), and whether a block that is not free touches it (`busy`: live,
// quick-cached, pending; Note [Quick-cached blocks keep their pages]; Note
// [Busy pages are the ones no free block covers], block_operations.cpp). A handle
// has one primary place and may have aliases: older places where it is still
// mapped (`homes`).
//
// Invariants:
//  - a page that a block which is not free touches is ready (busy implies
//    ready): what the program holds always has memory of its own;
//  - free blocks merge whatever their pages hold, so where the next request
//    lands depends on the sizes and the order of the requests and frees only,
//    never on where memory happens to be mapped. A loop that asks for the same
//    sizes in the same order gets the same addresses every step;
//  - a page no block touches (not busy) may hold its handle (ready: free memory
//    that can move), an alias of a handle that lives elsewhere, or nothing.
//
// A request whose block lands on pages that are not all ready goes to
// make_ready() (off the hot path, the growth mutex held), page by page:
//  1. an alias whose handle's primary place is a free page (not busy) of the same
//     arena takes it back: primary and alias swap places, no driver call;
//  2. any other alias is unmapped (its last use ended at the free of the range
//     the block was carved from: that free must be settled, else the block goes
//     back and the request is served from new addresses);
//  3. a page without memory gets a handle (Note [Pages, frugal first],
//     page_backing.cpp), mapped there; its old place, if it had one, becomes
//     an alias.
// Because addresses repeat from step to step, so do the moves of step 1: after
// the first steps a loop's pages are shared between the blocks that are never
// live at once, and taking a block swaps bookkeeping only. The pool then holds
// about the peak of the live bytes, rounded out to whole pages, and a step makes
// no driver call.
//
// Stream order. A page that moves (steps 1 and 3) is used next by the taker's
// stream, after the work queued before the frees that made it free:
//  - a page freed on the taker's own stream (or absorbed into its arena after a
//    device-side wait on the freeing stream): stream order gives it;
//  - another stream's page: only when the host has seen that stream's fence
//    covering the free complete (settled: nothing to wait for), or, when the
//    device refuses more, when the fence covers it (the taker's stream then
//    waits for the fence on the device, cuStreamWaitEvent; never the host).
// cuMemUnmap does not wait for work in flight, so an alias or a page is
// unmapped only once the frees that ended its last use are settled. An alias
// is never handed out (a block landing on it makes it ready first), so no
// address is handed out twice; a use after free through an old address reaches
// the page's new user instead of faulting, as with any allocator that reuses
// memory. Aliases are kept for step 1; trim() and release() unmap the settled
// ones before giving pages back.
//
// Settled: arena::settled_frees is the free count of the arena's last fence
// record that cuEventQuery found complete (or everything before a device
// synchronisation). A free block is settled when its free_epoch is at or below.

void vmm_pool_resource::impl::settle(arena& a) {
  if (a.fence == nullptr || a.fenced_frees <= a.settled_frees) return;
  detail::relaxed_capture_interaction relaxed;  // Note [Calls a capture elsewhere forbids]
  const CUresult r = detail::driver().cuEventQuery(a.fence);
  if (r == CUDA_SUCCESS) {
    a.settled_frees = a.fenced_frees;
  } else if (r != CUDA_ERROR_NOT_READY) {
    detail::check(r, "cuEventQuery", __FILE__, __LINE__);
  }
}

void vmm_pool_resource::impl::note_peak(arena& a, const std::vector<arena*>& others) {
  a.peak_used_bytes = std::max(a.peak_used_bytes, a.used_bytes);
  std::size_t used = a.used_bytes;
  std::size_t peaks = 0;
  // The streams this thread drives count as one: what they use now
  // (Note [Streams that take turns]); a stream alone on its thread, its own peak.
  std::size_t turns_used = a.used_bytes;
  bool turns = false;
  const std::int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  for (arena* s : others) {
    std::lock_guard lock(s->lock);
    used += s->used_bytes;
    if (take_turns(a, *s)) {
      turns_used += s->used_bytes;
      turns = true;
    } else {
      peaks += is_busy(*s, now) ? s->peak_used_bytes : s->used_bytes;
    }
  }
  peaks += turns ? turns_used : a.peak_used_bytes;
  a.takes_turns = a.takes_turns || turns;
  peak_used = std::max(peak_used, used);
  busy_peaks = peaks;
}

bool vmm_pool_resource::impl::is_busy(arena& s, std::int64_t now) const {
  if (s.frees != s.frees_seen) {
    s.frees_seen = s.frees;
    s.frees_seen_ns = now;
  }
  return now - s.frees_seen_ns < idle_ns || s.growth_waiters.load(std::memory_order_relaxed) > 0;
}

void vmm_pool_resource::impl::wait_settled(arena& a, std::uint64_t epoch) {
  settle(a);
  if (is_settled(a, epoch)) return;
  if (a.fenced_frees < epoch) pool.record_fence(a);
  detail::device_context_guard guard(pool.device);
  detail::relaxed_capture_interaction relaxed;  // Note [Calls a capture elsewhere forbids]
  GPUMEM_CU(cuEventSynchronize, a.fence);
  a.settled_frees = a.fenced_frees;
}

namespace {

// The whole pages of a block: [first, end) in page indices of its chunk.
struct page_span {
  std::size_t first = 0;
  std::size_t end = 0;
};
page_span whole_pages(const detail::block* b, std::size_t page) {
  const std::uintptr_t lo = b->address - b->owner->base;
  return {(lo + page - 1) / page, (lo + b->size) / page};
}

}  // namespace

std::size_t vmm_pool_resource::impl::take_pages(arena& s, std::size_t count, std::vector<std::uint64_t>& out,
                                                const std::function<bool(const block*)>& accept) {
  // Every free page with its handle, in free blocks (quick-cached ones keep
  // theirs: Note [Quick-cached blocks keep their pages]).
  struct candidate {
    std::uint64_t freed_at;
    chunk* c;
    std::size_t i;
  };
  std::vector<candidate> found;
  auto gather = [&](const block* b) {
    if (!accept(b)) return;
    chunk& c = *b->owner;
    const page_span span = whole_pages(b, page);
    for (std::size_t i = span.first; i < span.end; ++i) {
      if (!c.is_ready(i)) {
        // Skip a word of pages without memory at once (the segments' long unused tails).
        if ((i & 63) == 0 && i + 64 <= span.end && c.ready[i >> 6] == 0) i += 63;
        continue;
      }
      found.push_back({c.uses[i].freed_at, &c, i});
    }
  };
  s.free.find_if(page, [&](const block* b) {
    gather(b);
    return false;
  });
  // The most recently freed first. A loop uses its blocks in the same order at
  // every step, so the page freed last is the one needed again last: taking it
  // leaves the pages needed sooner where they are (as MRU does for a cyclic access pattern).
  const std::size_t n = std::min(count, found.size());
  std::partial_sort(found.begin(), found.begin() + static_cast<std::ptrdiff_t>(n), found.end(),
                    [](const candidate& x, const candidate& y) { return x.freed_at > y.freed_at; });
  for (std::size_t k = 0; k < n; ++k) take_page(s, *found[k].c, found[k].i, out);
  return n;
}

void vmm_pool_resource::impl::take_page(arena& s, chunk& c, std::size_t i, std::vector<std::uint64_t>& out) {
  page_home& h = *c.home_at[i];
  // The place it leaves goes last (return_unplaced looks there).
  std::iter_swap(std::find(h.places.begin(), h.places.end(), page_ref{&c, i}), h.places.end() - 1);
  h.primary.store({});  // moving: map_pages gives it its new place
  c.set_ready(i, false);
  out.push_back(c.pages[i]);
  s.reserved_bytes -= page;
}

void vmm_pool_resource::impl::unmap_alias(chunk& c, std::size_t i) {
  vm::unmap(pool.device, c.base + i * page, page);
  auto& places = c.home_at[i]->places;
  places.erase(std::find(places.begin(), places.end(), page_ref{&c, i}));
  c.set_page(i, 0);
  c.home_at[i] = nullptr;
}

// Note [A mapping the driver has no memory for]
// Mapping a page and giving devices access to it take driver memory of their own
// (page tables, on the owner and on every peer with access), which a device
// filled to its last page may not have: cuMemMap or cuMemSetAccess then fails
// with CUDA_ERROR_OUT_OF_MEMORY. That is a shortage like too few pages: the run
// is undone, every page supply_pages gave goes back where it came from (a page
// moved from a free place becomes that place's page again; a new one goes back to
// the device), and the request is short, so the pool frees what it can and tries
// again before it throws out_of_memory. With every peer mapped
// (access_for_every_peer), the page tables of the peers count too: the largest
// allocation on a full device is a little smaller than with the owner alone.
void vmm_pool_resource::impl::return_unplaced(arena& a, const std::vector<std::uint64_t>& handles, std::size_t from,
                                              std::size_t n) {
  for (std::size_t k = from; k < from + n; ++k) {
    const std::uint64_t handle = handles[k];
    auto it = homes.find(handle);
    if (it != homes.end() && it->second.primary.load().c == nullptr && !it->second.places.empty()) {
      // Taken from a free place (take_page): that place becomes its home again.
      page_home& h = it->second;
      const page_ref old = h.places.back();
      h.primary.store(old);
      arena& s = *old.c->owner;
      if (&s != &a) s.lock.lock();
      old.c->set_ready(old.index, true);
      s.reserved_bytes += page;
      if (&s != &a) s.lock.unlock();
    } else {
      // Made for this request: back to the device.
      (void)detail::driver().cuMemRelease(handle);  // already failing; the first error is the one reported
      if (it != homes.end()) homes.erase(it);
      pool.reserved_bytes -= page;
    }
  }
}

bool vmm_pool_resource::impl::map_pages(arena& a, chunk& c, std::size_t first,
                                        const std::vector<std::uint64_t>& handles, std::size_t from, std::size_t n) {
  const std::uintptr_t at = c.base + first * page;
  std::size_t mapped = 0;
  const auto started = std::chrono::steady_clock::now();
  try {
    for (; mapped < n; ++mapped) vm::map(pool.device, at + mapped * page, page, handles[from + mapped]);
    vm::set_access(pool.device, at, n * page, access_devices);
    note_map_time(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started).count(), n);
  } catch (const cuda_error& e) {
    // Undone: the pages go back where they came from. Out of memory (the driver's
    // own memory for the mapping, on a full device) is a shortage like any other.
    if (mapped > 0) (void)detail::driver().cuMemUnmap(at, mapped * page);
    return_unplaced(a, handles, from, n);
    if (e.result() == CUDA_ERROR_OUT_OF_MEMORY) return false;
    throw;
  } catch (...) {
    if (mapped > 0) (void)detail::driver().cuMemUnmap(at, mapped * page);
    return_unplaced(a, handles, from, n);
    throw;
  }
  for (std::size_t k = 0; k < n; ++k) {
    c.set_page(first + k, handles[from + k]);
    c.set_ready(first + k, true);
    page_home& h = homes[handles[from + k]];
    c.home_at[first + k] = &h;
    if (h.rank == 0) h.rank = ++handles_made;
    h.primary.store({&c, first + k});
    h.places.push_back({&c, first + k});
  }
  a.reserved_bytes += n * page;
  return true;
}

bool vmm_pool_resource::impl::fill_pages(arena& a, const std::vector<arena*>& others, chunk& c,
                                         const std::vector<std::size_t>& missing) {
  note_peak(a, others);
  const std::vector<std::uint64_t> handles = supply_pages(a, others, missing.size());
  // Mapped run by run: one access call per run of adjacent pages. A run the
  // driver has no memory to map ends it: the rest of the pages go back, and the
  // request is short, as when too few pages were found.
  for (std::size_t k = 0; k < handles.size();) {
    std::size_t n = 1;
    while (k + n < handles.size() && missing[k + n] == missing[k] + n) ++n;
    try {
      if (!map_pages(a, c, missing[k], handles, k, n)) {
        return_unplaced(a, handles, k + n, handles.size() - k - n);
        return false;
      }
    } catch (...) {
      return_unplaced(a, handles, k + n, handles.size() - k - n);
      throw;
    }
    k += n;
  }
  return handles.size() == missing.size();
}

std::vector<std::size_t> vmm_pool_resource::impl::repair_pages(arena& a, chunk& c, std::size_t first, std::size_t end,
                                                               std::uint64_t epoch) {
  std::vector<std::size_t> missing;
  for (std::size_t i = first; i < end; ++i) {
    switch (use_of(a, c, i)) {
      case page_use::ready:
        continue;
      case page_use::swap:  // 1. The page comes back from a free place of this arena.
        take_back(c, i);
        ++a.pages_revived;
        continue;
      case page_use::conflict:
        // 2. The alias goes, once the free that ended its last use is settled: if
        //    it is not yet, this waits for the stream's own work up to that free
        //    (cuEventSynchronize on its fence; never the device), which only the
        //    first steps of a loop meet (Note [Pages under the blocks]).
        if (c.pages[i] != 0) {
          wait_settled(a, epoch);
          unmap_alias(c, i);
        }
        missing.push_back(i);
    }
  }
  return missing;
}

bool vmm_pool_resource::impl::make_ready(arena& a, block* b) {
  const std::vector<arena*> others = pool.arenas_except(&a);  // before any arena lock
  bool complete = true;
  {
    std::lock_guard lock(a.lock);
    chunk& c = *b->owner;
    // Every page the block touches, the partly covered ones at its ends too.
    const std::size_t first = page_index(c, b->address);
    const std::size_t end = page_index(c, b->address + b->size - 1) + 1;
    const std::vector<std::size_t> missing = repair_pages(a, c, first, end, b->free_epoch);
    // 3. Pages for the rest.
    if (!missing.empty()) complete = fill_pages(a, others, c, missing);
  }
  enforce_threshold();
  return complete;
}

template <class F>
void vmm_pool_resource::impl::for_each_settled_free(arena& s, F&& f) {
  // Free blocks, then free slots: none is busy, and each is settled when its
  // free is. (Quick-cached blocks keep their pages busy until flushed.)
  s.free.find_if(page, [&](const block* b) {
    if (is_settled(s, b->free_epoch)) f(b);
    return false;
  });
  s.slots.for_each_until([&](const block* b) {
    if (is_settled(s, b->free_epoch)) f(b);
    return false;
  });
}

void vmm_pool_resource::impl::reap_aliases(arena& s) {
  settle(s);
  for_each_settled_free(s, [&](const block* b) {
    chunk& c = *b->owner;
    const page_span span = whole_pages(b, page);
    // The aliases: mapped, not the handle's primary place.
    c.for_each_where(span.first, span.end, [&](std::size_t w) { return c.mapped[w] & ~c.ready[w]; },
                     [&](std::size_t i) {
                       unmap_alias(c, i);
                       return true;
                     });
  });
}

std::size_t vmm_pool_resource::impl::release_free_pages(arena& s, std::size_t at_most) {
  std::size_t released = 0;
  for_each_settled_free(s, [&](const block* b) {
    chunk& c = *b->owner;
    const page_span span = whole_pages(b, page);
    c.for_each_where(span.first, span.end, [&](std::size_t w) { return c.ready[w]; }, [&](std::size_t i) {
      if (released + page > at_most) return false;
      const std::uint64_t h = c.pages[i];
      if (c.home_at[i]->has_aliases()) return true;  // mapped elsewhere too: reap_aliases first
      vm::unmap(pool.device, c.base + i * page, page);
      vm::release(pool.device, h);
      homes.erase(h);
      c.set_page(i, 0);
      c.home_at[i] = nullptr;
      c.set_ready(i, false);
      s.reserved_bytes -= page;
      pool.reserved_bytes -= page;
      ++pages_released;
      released += page;
      return true;
    });
  });
  // Free slots left without any page become vacant addresses again.
  std::vector<block*> empty;
  s.slots.for_each_until([&](block* y) {
    const chunk& c = *y->owner;
    const auto [first, end] = pages_of(y);
    bool none = true;
    for (std::size_t i = first; i < end && none; ++i) none = c.pages[i] == 0;
    if (none) empty.push_back(y);
    return false;
  });
  for (block* y : empty) {
    s.slots.remove(y);
    s.live.erase(y->address);
    chunk& c = *y->owner;
    std::fill_n(c.slot_at.begin() + static_cast<std::ptrdiff_t>(page_index(c, y->address)), y->size / page, nullptr);
    y->slot = false;
    y->cached = false;
    y->vacant = true;
    y->uses = 0;
    if (block* prev = y->prev_in_chunk; prev != nullptr && prev->vacant) {
      prev->size += y->size;
      prev->next_in_chunk = y->next_in_chunk;
      if (y->next_in_chunk != nullptr) y->next_in_chunk->prev_in_chunk = prev;
      s.slab.recycle(y);
      y = prev;
    }
    if (block* next = y->next_in_chunk; next != nullptr && next->vacant) {
      y->size += next->size;
      y->next_in_chunk = next->next_in_chunk;
      if (next->next_in_chunk != nullptr) next->next_in_chunk->prev_in_chunk = y;
      s.slab.recycle(next);
    }
  }
  return released;
}

}  // namespace gpumem
