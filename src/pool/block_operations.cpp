// The engine's block operations (stream_ordered_pool.hpp), under the arena's
// lock: carving a request from a free block, freeing into the index with the
// free neighbours merged, the quick cache's flush, and for paged pools the pages
// whose state a carve or a merge changes.
#include <algorithm>
#include <cstdint>

#include "pool/stream_ordered_pool.hpp"

namespace gpumem::detail {

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
// on every one (docs/benchmarks-history-2026-11-28.md, "Measured in rounds").
// Paged segments are reserved page-aligned, so page numbers follow from
// addresses alone (add_chunk checks). pool_inspector recomputes the busy pages
// from the blocks.
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

}  // namespace gpumem::detail
