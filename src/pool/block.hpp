// Host-side records of the pool's device memory: chunks (what the upstream
// gave) and blocks (pieces of a chunk, free or handed out). Device memory holds
// no headers, so these live on the host and point at it.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "pool/zeroed_array.hpp"

namespace gpumem::detail {

struct arena;
struct chunk;
struct page_home;  // vmm_pool_resource's record of a handle (src/vmm/vmm_pool_impl.hpp)

// A word and the value it had: while the word keeps that value, what it
// stands for has not changed (block::wait_seen).
struct page_wait {
  const std::uint64_t* word = nullptr;
  std::uint64_t mark = 0;
  bool holds() const noexcept { return word != nullptr && *word == mark; }
};

struct block {
  std::uintptr_t address = 0;
  std::size_t size = 0;             // multiple of the pool granule
  std::size_t requested_bytes = 0;  // as the caller asked; checked on deallocate
  block* prev_in_chunk = nullptr;   // physical neighbours, address order
  block* next_in_chunk = nullptr;
  // Free-list links (free blocks only): the link that points here (a list's head
  // or the previous block's next_free), and the next block.
  block** free_link = nullptr;
  block* next_free = nullptr;
  chunk* owner = nullptr;
  // The owning arena's free counter when the block last became free; the block
  // is safe for other streams once the arena's fence covers this count.
  std::uint64_t free_epoch = 0;
  bool free = false;    // in the free index
  bool cached = false;  // freed into the arena's quick cache or slot cache (not free, not live)
  // Paged pools only (Note [Slots for large requests], src/vmm/page_slots.cpp):
  // a slot, a large block that keeps its address range and size for life; or
  // vacant addresses of a segment of slots (in no index, never handed out).
  bool slot = false;
  bool vacant = false;
  // Freed on another stream and not yet absorbed by its arena (arena::pending).
  bool pending = false;
  // Freed under a capture, held for its graph (graph_holds): in no map or index.
  bool held = false;
  // Slots only: the slot's use word (a page_wait's word): the arena's count of
  // slot hand-outs when it was first handed out over its current pages (unique
  // in the arena, so a record reused for another slot never repeats it), with
  // slot_freed set while it is free (Note [A slot's use word across its frees],
  // src/vmm/page_slots.cpp); 0 before its first hand-out.
  std::uint64_t uses = 0;
  // Free slots only: what keeps one of its pages' handles from it, as usable()
  // last found it (src/vmm/page_slots.cpp): while the word keeps its value the
  // slot cannot be used, and the slot cache passes it with one load
  // (free_slots). Cleared when the slot is freed: its pages are its own then.
  page_wait wait_seen{};
  // Slots only: the arena whose stream last freed it (its own, or another
  // through deallocate_foreign). That stream ordered the end of its last use,
  // so it may take the slot's free pages with no wait (Note [Swaps across
  // streams], src/vmm/swaps_across_streams.cpp). Compared, never followed.
  const arena* freed_by = nullptr;
  // Free slots only: the owner chunk's unready_marks when the slot was freed
  // with every page its own, or no_ready_mark (Note [A slot's ready mark]).
  std::uint64_t ready_mark = 0;
};

static_assert(std::is_trivially_copyable_v<block>, "block_slab::make copies an empty record");

inline constexpr std::uint64_t slot_freed = std::uint64_t{1} << 63;
// A ready mark no chunk's count reaches: the slot's pages must be looked at.
inline constexpr std::uint64_t no_ready_mark = ~std::uint64_t{0};
// Set in a busy mark or a slot's use word while a free slot's recorded wait
// reads it: the change that clears it wakes the arena's free slots (Note
// [Slots known to wait], src/pool/free_slots.hpp).
inline constexpr std::uint64_t waited_on = std::uint64_t{1} << 62;

struct chunk {
  std::uintptr_t base = 0;
  std::size_t size = 0;
  arena* owner = nullptr;
  block* first = nullptr;
  // Paged pools only (Note [Pages under the blocks], src/vmm/page_blocks.cpp),
  // one entry per page of the chunk, guarded by the owner arena's lock:
  //   pages  the physical handle mapped there (0: none);
  //   ready  bit set where that handle's primary place is here (a block may use it);
  //   busy   bit set where a block that is not free (live, quick-cached,
  //          pending) touches the page: where no single free block covers it
  //          whole (Note [Busy pages are the ones no free block covers],
  //          block_operations.cpp); `uses` records when it last changed.
  //          In a segment of slots, where a page is a slot's alone,
  //          kept per slot instead (slot_at), so that taking and freeing a
  //          slot touches no per-page record (W1's large column). Read it
  //          with page_busy(i).
  //   Every such array is zero until written (Note [Page records on demand],
  //   zeroed_array.hpp): a segment's records cost host memory where its pages are used.
  zeroed_array<std::uint64_t> pages;
  zeroed_array<page_home*> home_at;  // the record of the handle in `pages` (null: none)
  zeroed_array<std::uint64_t> ready;
  zeroed_array<std::uint64_t> mapped;  // bit set where `pages` holds a handle (set_page)
  // How many times a page here lost its ready bit (set_ready(i, false), the
  // only way one does): Note [A slot's ready mark].
  std::uint64_t unready_marks = 0;
  zeroed_array<std::uint64_t> busy;  // not kept in segments of slots
  // What changes when a page's busy bit does.
  struct page_uses {
    // A page_wait's word: changes when the page becomes busy or free while a
    // wait reads it (waited_on set), so that the wait ends.
    std::uint64_t busy_mark = 0;
    std::uint64_t freed_at = 0;  // the owner's free count when the page last became free
  };
  zeroed_array<page_uses> uses;  // not kept in segments of slots
  zeroed_array<block*> slot_at;  // segments of slots: the slot over each page (null: vacant)
  // The word of a free slot's wait (block::wait_seen) when one of its pages has
  // no handle: only a repair, which takes the slot out of the cache, maps one.
  static constexpr std::uint64_t never_changes = 1;
  bool for_slots = false;                // a segment of slots and vacant addresses

  bool is_ready(std::size_t i) const noexcept { return bit(ready, i); }
  bool is_mapped(std::size_t i) const noexcept { return bit(mapped, i); }
  // Whether a block that is not free (live, pending) touches page i. A slot is
  // such a block unless it waits in the slot cache.
  bool page_busy(std::size_t i) const noexcept {
    if (for_slots) {
      const block* s = slot_at[i];
      return s != nullptr && !s->cached;
    }
    return bit(busy, i);
  }
  // Whether every page in [from, to] is ready: a word of the bitmap at a time
  // (every allocation asks; most ranges lie within one word).
  bool all_ready(std::size_t from, std::size_t to) const noexcept {
    const std::size_t from_word = from >> 6, to_word = to >> 6;
    const std::uint64_t head = ~std::uint64_t{0} << (from & 63);
    const std::uint64_t tail = ~std::uint64_t{0} >> (63 - (to & 63));
    if (from_word == to_word) return (ready[from_word] & (head & tail)) == (head & tail);
    if ((ready[from_word] & head) != head) return false;
    for (std::size_t w = from_word + 1; w < to_word; ++w) {
      if (ready[w] != ~std::uint64_t{0}) return false;
    }
    return (ready[to_word] & tail) == tail;
  }
  // How many pages in [from, to) are ready: a word of the bitmap at a time.
  std::size_t count_ready(std::size_t from, std::size_t to) const noexcept {
    std::size_t n = 0;
    for (std::size_t i = from; i < to;) {
      const std::size_t stop = std::min(to, (i | 63) + 1);
      n += static_cast<std::size_t>(std::popcount(ready_run(i, stop)));
      i = stop;
    }
    return n;
  }
  // Calls f(i) on every page i in [from, to) that is not ready, in order, until
  // f returns false; returns whether it ran to the end. A word of the bitmap at
  // a time, so a slot with few pages elsewhere costs few steps. f may change
  // the ready bit of i itself (a swap), not that of a later page in the range.
  template <class F>
  bool for_each_unready(std::size_t from, std::size_t to, F&& f) const {
    return for_each_where(from, to, [&](std::size_t w) { return ~ready[w]; }, f);
  }
  void set_ready(std::size_t i, bool on) noexcept {
    set_bit(ready, i, on);
    if (!on) ++unready_marks;
  }
  void set_busy(std::size_t i, bool on) noexcept { set_bit(busy, i, on); }
  // Records the handle mapped at page i (0: none) and its bit in `mapped`:
  // the only way `pages` changes once the segment is made.
  void set_page(std::size_t i, std::uint64_t handle) noexcept {
    pages[i] = handle;
    set_bit(mapped, i, handle != 0);
  }
  // Calls f(i) on every page i in [from, to) whose bit is set in bits(w), the
  // w-th word of a bitmap the caller forms (ready, mapped, mapped & ~ready), in
  // order, until f returns false; returns whether it ran to the end. A word at
  // a time: a segment's unused tail costs a load a word, not one a page. Each
  // word is read before its pages are visited, so f may change page i's own
  // bits, not a later page's.
  template <class Bits, class F>
  bool for_each_where(std::size_t from, std::size_t to, Bits&& bits, F&& f) const {
    for (std::size_t i = from; i < to;) {
      const std::size_t stop = std::min(to, (i | 63) + 1);
      std::uint64_t word = (bits(i >> 6) >> (i & 63)) & run_mask(stop - i);
      for (; word != 0; word &= word - 1) {
        if (!f(i + static_cast<std::size_t>(std::countr_zero(word)))) return false;
      }
      i = stop;
    }
    return true;
  }

 private:
  // Page i's bit in a bitmap of 64-bit words (ready, busy).
  static bool bit(const zeroed_array<std::uint64_t>& words, std::size_t i) noexcept {
    return (words[i >> 6] >> (i & 63)) & 1U;
  }
  static void set_bit(zeroed_array<std::uint64_t>& words, std::size_t i, bool on) noexcept {
    if (on) words[i >> 6] |= std::uint64_t{1} << (i & 63);
    else words[i >> 6] &= ~(std::uint64_t{1} << (i & 63));
  }
  // The n low bits set (1 <= n <= 64).
  static std::uint64_t run_mask(std::size_t n) noexcept {
    return n == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << n) - 1;
  }
  // The ready bits of pages [from, stop), one word's run (stop <= the word's
  // end), bit k for page from + k.
  std::uint64_t ready_run(std::size_t from, std::size_t stop) const noexcept {
    return (ready[from >> 6] >> (from & 63)) & run_mask(stop - from);
  }
};

// Allocates block records without touching the heap on the hot path.
class block_slab {
 public:
  block* make() {
    if (free_ == nullptr) refill();
    block* b = free_;
    free_ = b->next_free;
    // Copied from an empty record, not assigned `block{}`: GCC makes that a
    // `rep stos`, whose start-up on every carve that splits cost more than the
    // record's few vector stores (docs/benchmarks.md, "Where gpumem loses, and why").
    static constexpr block empty{};
    std::memcpy(static_cast<void*>(b), &empty, sizeof(block));
    return b;
  }
  void recycle(block* b) noexcept {
    b->next_free = free_;
    free_ = b;
  }

 private:
  static constexpr std::size_t page_blocks = 512;
  void refill() {
    pages_.push_back(std::make_unique<block[]>(page_blocks));
    block* page = pages_.back().get();
    for (std::size_t i = 0; i < page_blocks; ++i) recycle(&page[i]);
  }
  std::vector<std::unique_ptr<block[]>> pages_;
  block* free_ = nullptr;
};

}  // namespace gpumem::detail
