// An arena's free slots (paged pools only; Note [Slots for large requests] in
// src/vmm/page_slots.cpp): large blocks that keep their address range and size
// for life, kept free by exact size, the lowest address first (the stable
// choice that lets a loop settle: Note [Slots for large requests]). Sizes are
// looked up in a small direct-mapped table, and in a map when two sizes share
// an entry. Like the quick cache, a free slot stays in the arena's live map,
// marked cached, so a second free of it is caught.
//
// Note [Slots known to wait]
// A size's lowest free slots are often ones whose pages are in use elsewhere
// (stitched into a later slot), and every request of the size would pass them
// one by one, a load of their recorded wait each. Instead each row remembers
// the key (Note [Free slots in bitmaps]) below which every slot was seen
// waiting (waiting_below) and skips those slots without a look, for as long as
// none of their waits can have ended; a slot freed below that key lowers it.
// A wait ends only when its word changes (block::wait_seen): the busy mark of
// a page in use falls back, or a live slot is freed (and holds again when that
// slot is taken again over the same pages: Note [A slot's use word across its
// frees], src/vmm/page_slots.cpp). The wait's recorder marks the word
// (waited_on); the change that ends it (a page's busy bit set or cleared, a
// marked slot's free in cache_slot) calls wake(), and a row that has seen a
// wake since it looked forgets what it learned. The words are the arena's own
// (usable() records none of another arena's), so a wake is under the same lock
// as the rows.
// Skipping never changes the choice: a slot skipped is one that waiting()
// would pass.
//
// Note [A lone free slot]
// A size with one free slot is the common case of a loop that frees a large
// buffer and asks for it again (W1's large column): the row would be searched
// to hold the slot, then searched again to give it back. So the
// last slot pushed into an empty row waits beside it instead (lone_), counted
// and visited as a slot of that row; the next push settles it into its row
// first, and so do the paths that search rows (pop_lowest_accepted, peek). The
// hot path's take (pop_first_ready) takes it without the row: it is the
// lowest, and the only, free slot of its size. Every answer is the one the row
// would give.
//
// A slot records one wait, not one per page that cannot be used: the first
// it found, which is enough to know that the slot cannot be used while it
// holds. When it ends, usable() looks at the slot again (and stops at the
// next page that cannot be used). A wait stays true while it holds, whatever
// else moved: its word is the busy mark of the page in use that holds the
// handle, or the use word of the live slot there, and a handle in use does not
// move; a page without a handle gets one only in a repair, which takes the
// slot out of the cache, and a freed slot's wait is cleared.
//
// Note [A slot's ready mark]
// The hot path hands out a free slot only when every page under it is ready
// (its handle's primary place is there), and looking costs the slot's page
// range in the chunk's ready bits, a measurable part of W1's large pair. Most often
// nothing has moved since the slot was freed. So each chunk counts the times
// one of its pages lost its ready bit (chunk::unready_marks; chunk::set_ready is
// the only way a bit is cleared), and a slot freed with every page its own
// keeps that count (block::ready_mark, which cache_slot passes to push). While
// the count is the same, no page of the chunk became unready since, and the
// slot's pages are still all ready; once it differs, the pages are looked at.
// A slot freed on its own stream (free_live) has every page its own: it was live
// until then, handed out only with every page ready, and a page under a block
// that is not free never moves or swaps (Note [Pages under the blocks]). A slot
// freed on another stream is pending until its arena absorbs it, and a pending
// slot may give its pages to the stream that freed it (Note [Swaps across
// streams]), so the absorb (release_block) gives it a mark only when a look at
// its ready bits finds them all set. (It once gave the mark unlooked: the random
// programs found the hot path handing such a slot out over pages that a live slot
// of the other stream held, two live allocations on one memory.) Every other way
// into the cache (a slot that waits with what pages memory allowed, one whose
// swaps another stream took first) leaves no_ready_mark, so those are looked at.
// The count and the mark are read and written under the lock of the chunk's
// arena, as the ready bits are.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "pool/block.hpp"

namespace gpumem::detail {

class free_slots {
 public:
  // The free slot of exactly `size` bytes at the lowest address past those
  // known to wait (Note [Slots known to wait]), left in place, or null.
  block* peek(std::size_t size) {
    settle_lone();
    row* r = find(size);
    if (r == nullptr) return nullptr;
    const cursor c = first_from(*r, known_waiting(*r));
    return c.valid() ? c.slot() : nullptr;
  }

  // `ready_mark`: the owner chunk's unready_marks when every page of `b` is its
  // own, else no_ready_mark, and its pages are looked at (Note [A slot's ready mark]).
  void push(block* b, std::uint64_t ready_mark = no_ready_mark) {
    b->wait_seen = {};  // what kept it waiting before it was last handed out is gone
    b->ready_mark = ready_mark;
    settle_lone();      // first: its row is then not empty, and keeps its entry
    row& r = find_or_make(b->size);
    ++count_;
    bytes_ += b->size;
    if (r.count == 0) {
      lone_ = b;  // Note [A lone free slot]
      lone_row_ = &r;
      return;
    }
    place(r, b);
  }

  // Removes `b`, a free slot of this cache.
  void remove(block* b) noexcept {
    if (b == lone_) {
      lone_ = nullptr;
      --count_;
      bytes_ -= b->size;
      return;
    }
    row* r = find(b->size);
    if (r == nullptr) return;
    const std::uintptr_t k = key(*r, b);
    const std::size_t at = leaf_position(*r, k >> leaf_shift);
    if (at == r->leaves.size() || r->leaves[at].index != k >> leaf_shift) return;
    if ((r->leaves[at].bits & bit(k)) == 0 || r->at[at][k & leaf_mask] != b) return;
    take(*r, at, k);
  }

  // Removes and returns the free slot of exactly `size` bytes at the lowest
  // address that `accept` takes, or null. Visits in address order, past the
  // slots that still wait (waiting), until one is taken; the others stay.
  template <class F>
  block* pop_lowest_accepted(std::size_t size, F&& accept) {
    settle_lone();
    row* r = find(size);
    if (r == nullptr) return nullptr;
    bool all_wait = true;  // every slot below the one visited waits
    for (cursor c = first_from(*r, known_waiting(*r)); c.valid(); c = next_of(*r, c)) {
      block* const b = c.slot();
      if (!waiting(b)) {
        if (accept(b)) return take(*r, c.at, c.k);
        // accept recorded why not (usable): known to wait when a wait holds.
        all_wait = all_wait && waiting(b);
      }
      if (all_wait) r->waiting_below = c.k + 1;
    }
    return nullptr;
  }

  // Removes and returns the free slot of exactly `size` bytes at the lowest
  // address past the slots that still wait, when `ready` takes it; else null
  // (the hot path's slot cache hit).
  template <class F>
  [[gnu::always_inline]] block* pop_first_ready(std::size_t size, F&& ready) {
    if (lone_ != nullptr && lone_->size == size) {
      // The only free slot of its size (Note [A lone free slot]); one that
      // waits goes to its row, to be counted among the known waiters there.
      if (!lone_->wait_seen.holds()) {
        if (!ready(lone_)) return nullptr;
        block* b = lone_;
        lone_ = nullptr;
        --count_;
        bytes_ -= b->size;
        return b;
      }
      settle_lone();
    }
    row* r = find(size);
    if (r == nullptr) return nullptr;
    for (cursor c = first_from(*r, known_waiting(*r)); c.valid(); c = next_of(*r, c)) {
      block* const b = c.slot();
      if (waiting(b)) {
        r->waiting_below = c.k + 1;
        continue;
      }
      return ready(b) ? take(*r, c.at, c.k) : nullptr;
    }
    return nullptr;
  }

  // A wait of a slot here may have ended (Note [Slots known to wait]).
  void wake() noexcept { ++wakes_; }

  // How many free slots of exactly `size` bytes there are.
  std::size_t count_of(std::size_t size) noexcept {
    const std::size_t lone = lone_ != nullptr && lone_->size == size ? 1 : 0;
    row* r = find(size);
    return (r == nullptr ? 0 : r->count) + lone;
  }

  // Calls f(slot) on every free slot until it returns true.
  template <class F>
  void for_each_until(F&& f) const {
    // The lone slot where its row is (Note [A lone free slot]), so the order is the rows'.
    for (const entry& e : direct_) {
      if (&e.r == lone_row_ && lone_ != nullptr && f(lone_)) return;
      if (each_highest_first(e.r, f)) return;
    }
    for (const auto& [size, r] : overflow_) {
      if (&r == lone_row_ && lone_ != nullptr && f(lone_)) return;
      if (each_highest_first(r, f)) return;
    }
  }

  // Calls f(slot) on every free slot of exactly `size` bytes, highest address first.
  template <class F>
  void for_each_of(std::size_t size, F&& f) {
    if (lone_ != nullptr && lone_->size == size) f(lone_);  // its row is empty
    row* r = find(size);
    if (r == nullptr) return;
    each_highest_first(*r, [&](block* b) {
      f(b);
      return false;
    });
  }

  std::size_t count() const noexcept { return count_; }
  std::size_t bytes() const noexcept { return bytes_; }
  // Leaves held by every row, empty ones included (Note [Free slots in bitmaps]).
  std::size_t leaves_held() const noexcept {
    std::size_t n = 0;
    for (const entry& e : direct_) n += e.r.leaves.size();
    for (const auto& [size, r] : overflow_) n += r.leaves.size();
    return n;
  }

 private:
  // Note [Free slots in bitmaps]
  // A size's free slots are a set of keys, key = address >> shift with shift =
  // floor(log2(size)): slots never overlap (each holds its pages for life), so
  // the addresses of a size's slots lie at least `size` >= 2^shift apart and
  // the keys are distinct and in address order. The keys sit in leaves of 64
  // (a bit each, and the slot beside it), the leaves highest first, so the
  // lowest slot is at the back: a free places its slot with a search over
  // leaves (few: a leaf spans 64 slots' worth of addresses) and a bit, where a
  // sorted array of slots moved half its items on every free of W2's random
  // order (docs/benchmarks.md, "Where gpumem loses, and why"). Keys below
  // waiting_below were all seen waiting, with no wake since wakes_seen (Note
  // [Slots known to wait]).
  static constexpr unsigned leaf_shift = 6;
  static constexpr std::uintptr_t leaf_mask = (std::uintptr_t{1} << leaf_shift) - 1;
  struct leaf {
    std::uintptr_t index = 0;  // key >> leaf_shift
    std::uint64_t bits = 0;    // bit j: a free slot with key index * 64 + j
  };
  using leaf_slots = std::array<block*, std::size_t{1} << leaf_shift>;
  struct row {
    // Highest index first, each with its slots beside it (at[i] for leaves[i]).
    // A leaf stays when its last slot leaves: the addresses of a size's slots
    // are reused, and a leaf made and dropped on every turn cost more than it
    // holds. Empty leaves go when a new leaf is needed and they are as many as
    // the others (plus a few), so a row holds O(its free slots) leaves however
    // far its slots' addresses wander; and all go with an entry that another
    // size takes.
    std::vector<leaf> leaves;
    std::vector<leaf_slots> at;
    std::size_t low_end = 0;  // 1 + the position of the lowest leaf with a slot; 0: none
    std::size_t count = 0;
    unsigned shift = 0;
    std::uintptr_t waiting_below = 0;
    std::uint64_t wakes_seen = 0;
  };
  // A free slot of a row, and the way to the next: its leaf's position, its
  // key, and the leaf's slots from it on (a visit of the next is a bit
  // operation while the leaf has more).
  struct cursor {
    const row* r = nullptr;
    std::size_t at = 0;
    std::uintptr_t k = 0;
    std::uint64_t rest = 0;  // bits of leaf `at` from k's on
    bool valid() const noexcept { return r != nullptr; }
    block* slot() const noexcept { return r->at[at][k & leaf_mask]; }
  };
  static std::uint64_t bit(std::uintptr_t k) noexcept { return std::uint64_t{1} << (k & leaf_mask); }
  static std::uintptr_t key(const row& r, const block* b) noexcept { return b->address >> r.shift; }
  // How many of r's leaves lie above leaf `index`: where leaf `index` is, or goes.
  // A search without branches on the data (the order of frees is random to the
  // branch predictor).
  static std::size_t leaf_position(const row& r, std::uintptr_t index) noexcept {
    std::size_t n = r.leaves.size();
    if (n == 0) return 0;
    const leaf* base = r.leaves.data();
    while (n > 1) {
      const std::size_t half = n / 2;
      base += half & (std::size_t{0} - static_cast<std::size_t>(base[half - 1].index > index));
      n -= half;
    }
    return static_cast<std::size_t>(base - r.leaves.data()) + (base->index > index ? 1 : 0);
  }
  // The lowest free slot of r with a key of at least `from`, or none.
  static cursor first_from(const row& r, std::uintptr_t from) noexcept {
    for (std::size_t at = r.low_end; at-- > 0;) {
      const leaf& l = r.leaves[at];
      if (((l.index + 1) << leaf_shift) <= from) continue;  // wholly below
      std::uint64_t bits = l.bits;
      if ((from >> leaf_shift) == l.index) bits &= ~std::uint64_t{0} << (from & leaf_mask);
      if (bits != 0) return at_lowest(r, at, bits);
    }
    return {};
  }
  static cursor at_lowest(const row& r, std::size_t at, std::uint64_t bits) noexcept {
    return {&r, at, (r.leaves[at].index << leaf_shift) | static_cast<std::uintptr_t>(std::countr_zero(bits)), bits};
  }
  // The free slot after c's in address order, or none.
  static cursor next_of(const row& r, const cursor& c) noexcept {
    if (const std::uint64_t more = c.rest & (c.rest - 1); more != 0) return at_lowest(r, c.at, more);
    for (std::size_t at = c.at; at-- > 0;) {
      if (r.leaves[at].bits != 0) return at_lowest(r, at, r.leaves[at].bits);
    }
    return {};
  }
  template <class F>
  static bool each_highest_first(const row& r, F&& f) {
    for (std::size_t i = 0; i < r.leaves.size(); ++i) {
      for (std::uint64_t bits = r.leaves[i].bits; bits != 0;) {
        const unsigned j = 63U - static_cast<unsigned>(std::countl_zero(bits));
        bits &= ~(std::uint64_t{1} << j);
        if (f(r.at[i][j])) return true;
      }
    }
    return false;
  }
  std::uintptr_t known_waiting(row& r) const noexcept {
    if (r.wakes_seen != wakes_) {
      r.wakes_seen = wakes_;
      r.waiting_below = 0;
    }
    return r.waiting_below;
  }
  // Puts b into r (out of line: the hot paths that call it stay small enough
  // to be inlined where the lone slot serves).
  [[gnu::noinline]] void place(row& r, block* b) {
    const std::uintptr_t k = key(r, b);
    // Slots below the new one that were known to wait still are.
    r.waiting_below = std::min(r.waiting_below, k);
    std::size_t at = leaf_position(r, k >> leaf_shift);
    if (at == r.leaves.size() || r.leaves[at].index != k >> leaf_shift) {
      if (r.leaves.size() >= 8 && r.leaves.size() >= 2 * occupied_leaves(r) + 8) {
        drop_empty_leaves(r);
        at = leaf_position(r, k >> leaf_shift);
      }
      r.leaves.insert(r.leaves.begin() + static_cast<std::ptrdiff_t>(at), leaf{.index = k >> leaf_shift});
      r.at.insert(r.at.begin() + static_cast<std::ptrdiff_t>(at), leaf_slots{});
      if (at < r.low_end) ++r.low_end;  // the lowest leaf with a slot moved back by one
    }
    r.low_end = std::max(r.low_end, at + 1);
    r.leaves[at].bits |= bit(k);
    r.at[at][k & leaf_mask] = b;
    ++r.count;
  }
  static std::size_t occupied_leaves(const row& r) noexcept {
    return static_cast<std::size_t>(
        std::count_if(r.leaves.begin(), r.leaves.end(), [](const leaf& l) { return l.bits != 0; }));
  }
  static void drop_empty_leaves(row& r) noexcept {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < r.leaves.size(); ++i) {
      if (r.leaves[i].bits == 0) continue;
      r.leaves[kept] = r.leaves[i];
      r.at[kept] = r.at[i];
      ++kept;
    }
    r.leaves.resize(kept);
    r.at.resize(kept);
    r.low_end = kept;  // every leaf left has a slot
  }
  // The lone slot into its row (Note [A lone free slot]).
  void settle_lone() {
    if (lone_ == nullptr) return;
    place(*lone_row_, lone_);
    lone_ = nullptr;
  }
  // Whether the slot still cannot be used, as far as its recorded wait tells.
  static bool waiting(const block* b) noexcept { return b->wait_seen.holds(); }
  block* take(row& r, std::size_t at, std::uintptr_t k) noexcept {
    block* b = r.at[at][k & leaf_mask];
    r.leaves[at].bits &= ~bit(k);
    if (at + 1 == r.low_end) {
      while (r.low_end > 0 && r.leaves[r.low_end - 1].bits == 0) --r.low_end;
    }
    --r.count;
    --count_;
    bytes_ -= b->size;
    return b;
  }
  struct entry {
    std::size_t size = 0;
    row r;
  };
  static constexpr unsigned slot_bits = 6;
  entry& direct(std::size_t size) noexcept {
    return direct_[((size >> 8) * 0x9E3779B97F4A7C15ULL) >> (64 - slot_bits)];
  }
  row* find(std::size_t size) noexcept {
    entry& e = direct(size);
    if (e.size == size) return &e.r;
    if (overflow_.empty()) return nullptr;
    auto it = overflow_.find(size);
    return it != overflow_.end() ? &it->second : nullptr;
  }
  static unsigned shift_of(std::size_t size) noexcept { return 63U - static_cast<unsigned>(std::countl_zero(size)); }
  // A size keeps one row: in the table, or, while another size holds its entry
  // there, in the map. An entry whose row is empty goes to the next size.
  row& find_or_make(std::size_t size) {
    entry& e = direct(size);
    if (e.size == size) return e.r;
    if (e.r.count == 0 && overflow_.find(size) == overflow_.end()) {
      e.size = size;
      e.r.leaves.clear();  // another size's: its keys mean other addresses
      e.r.at.clear();
      e.r.low_end = 0;
      e.r.shift = shift_of(size);
      e.r.waiting_below = 0;
      return e.r;
    }
    row& r = overflow_[size];
    r.shift = shift_of(size);
    return r;
  }

  std::array<entry, std::size_t{1} << slot_bits> direct_{};
  std::unordered_map<std::size_t, row> overflow_;
  std::size_t count_ = 0;
  std::size_t bytes_ = 0;
  std::uint64_t wakes_ = 0;
  // The last slot pushed into an empty row, and that row (Note [A lone free slot]).
  block* lone_ = nullptr;
  row* lone_row_ = nullptr;
};

}  // namespace gpumem::detail
