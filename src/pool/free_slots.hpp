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
// how many of its lowest slots were all seen waiting (known_waiting) and skips
// them without a look, for as long as none of their waits can have ended.
// A wait ends only when its word changes (block::wait_seen): the busy mark of
// a page in use falls back, or a live slot is freed. The wait's recorder marks
// the word (waited_on); the change that clears the mark (a page's busy bit set
// or cleared, cache_slot) calls wake(), and a row that has seen a wake since it
// counted forgets its count. The words are the arena's own (usable() records
// none of another arena's), so a wake is under the same lock as the rows.
// Skipping never changes the choice: a slot skipped is one that waiting()
// would pass.
//
// Note [A lone free slot]
// A size with one free slot is the common case of a loop that frees a large
// buffer and asks for it again (W1's large column): the row would be searched
// and grown to hold the slot, then searched and shrunk to give it back. So the
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
#pragma once

#include <algorithm>
#include <array>
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
    const std::size_t skip = known_waiting(*r);
    return skip < r->items.size() ? r->items[r->items.size() - 1 - skip].b : nullptr;
  }

  void push(block* b) {
    b->wait_seen = {};  // what kept it waiting before it was last handed out is gone
    settle_lone();      // first: its row is then not empty, and keeps its entry
    row& r = find_or_make(b->size);
    ++count_;
    bytes_ += b->size;
    if (r.items.empty()) {
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
    const auto it = r->items.begin() + static_cast<std::ptrdiff_t>(higher_count(*r, b->address));
    if (it == r->items.end() || it->b != b) return;
    take(*r, it);
  }

  // Removes and returns the free slot of exactly `size` bytes at the lowest
  // address that `accept` takes, or null. Visits in address order, past the
  // slots that still wait (waiting), until one is taken; the others stay.
  template <class F>
  block* pop_lowest_accepted(std::size_t size, F&& accept) {
    settle_lone();
    row* r = find(size);
    if (r == nullptr) return nullptr;
    bool all_wait = true;  // every slot below `it` waits
    for (auto it = r->items.rbegin() + static_cast<std::ptrdiff_t>(known_waiting(*r)); it != r->items.rend(); ++it) {
      if (!waiting(*it)) {
        if (accept(it->b)) return take(*r, std::next(it).base());
        // accept recorded why not (usable): known to wait when a wait holds.
        all_wait = all_wait && waiting(*it);
      }
      r->known_waiting += all_wait;
    }
    return nullptr;
  }

  // Removes and returns the free slot of exactly `size` bytes at the lowest
  // address past the slots that still wait, when `ready` takes it; else null
  // (the hot path's slot cache hit).
  template <class F>
  block* pop_first_ready(std::size_t size, F&& ready) {
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
    for (auto it = r->items.rbegin() + static_cast<std::ptrdiff_t>(known_waiting(*r)); it != r->items.rend(); ++it) {
      if (waiting(*it)) {
        ++r->known_waiting;
        continue;
      }
      return ready(it->b) ? take(*r, std::next(it).base()) : nullptr;
    }
    return nullptr;
  }

  // A wait of a slot here may have ended (Note [Slots known to wait]).
  void wake() noexcept { ++wakes_; }

  // How many free slots of exactly `size` bytes there are.
  std::size_t count_of(std::size_t size) noexcept {
    const std::size_t lone = lone_ != nullptr && lone_->size == size ? 1 : 0;
    row* r = find(size);
    return (r == nullptr ? 0 : r->items.size()) + lone;
  }

  // Calls f(slot) on every free slot until it returns true.
  template <class F>
  void for_each_until(F&& f) const {
    // The lone slot where its row is (Note [A lone free slot]), so the order is the rows'.
    for (const entry& e : direct_) {
      if (&e.r == lone_row_ && lone_ != nullptr && f(lone_)) return;
      for (const item& x : e.r.items) {
        if (f(x.b)) return;
      }
    }
    for (const auto& [size, r] : overflow_) {
      if (&r == lone_row_ && lone_ != nullptr && f(lone_)) return;
      for (const item& x : r.items) {
        if (f(x.b)) return;
      }
    }
  }

  // Calls f(slot) on every free slot of exactly `size` bytes, highest address first.
  template <class F>
  void for_each_of(std::size_t size, F&& f) {
    if (lone_ != nullptr && lone_->size == size) f(lone_);  // its row is empty
    row* r = find(size);
    if (r == nullptr) return;
    for (const item& x : r->items) f(x.b);
  }

  std::size_t count() const noexcept { return count_; }
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  // A size's free slots, highest address first, each with its address beside it
  // (ordering them reads no block; 16 bytes, so that a search and an insert
  // touch few cache lines). The lowest is taken from the end and mostly put
  // back there; a slot freed is placed by a binary search. The last
  // known_waiting items were all seen waiting, with no wake since wakes_seen
  // (Note [Slots known to wait]).
  struct item {
    std::uintptr_t address;
    block* b;
  };
  struct row {
    std::vector<item> items;
    std::size_t known_waiting = 0;
    std::uint64_t wakes_seen = 0;
  };
  // How many of r's slots lie above `address`: where a slot there goes. A
  // search without branches on the data (a row's order is random to the
  // branch predictor, whose misses cost a slot's free more than the rest of it).
  static std::size_t higher_count(const row& r, std::uintptr_t address) noexcept {
    std::size_t n = r.items.size();
    if (n == 0) return 0;
    const item* base = r.items.data();
    while (n > 1) {
      const std::size_t half = n / 2;
      // A mask, not a conditional, which compilers turn into a branch.
      base += half & (std::size_t{0} - static_cast<std::size_t>(base[half - 1].address > address));
      n -= half;
    }
    return static_cast<std::size_t>(base - r.items.data()) + (base->address > address ? 1 : 0);
  }
  std::size_t known_waiting(row& r) const noexcept {
    if (r.wakes_seen != wakes_) {
      r.wakes_seen = wakes_;
      r.known_waiting = 0;
    }
    return r.known_waiting;
  }
  // Puts b into r in address order (out of line: the hot paths that call it
  // stay small enough to be inlined where the lone slot serves).
  [[gnu::noinline]] void place(row& r, block* b) {
    const auto at = r.items.begin() + static_cast<std::ptrdiff_t>(higher_count(r, b->address));
    // Slots below the new one that were known to wait still are.
    r.known_waiting = std::min(r.known_waiting, static_cast<std::size_t>(r.items.end() - at));
    r.items.insert(at, item{b->address, b});
  }
  // The lone slot into its row (Note [A lone free slot]).
  void settle_lone() {
    if (lone_ == nullptr) return;
    place(*lone_row_, lone_);
    lone_ = nullptr;
  }
  // Whether the slot of `x` still cannot be used, as far as its recorded wait tells.
  static bool waiting(const item& x) noexcept { return x.b->wait_seen.holds(); }
  block* take(row& r, std::vector<item>::iterator at) noexcept {
    block* b = at->b;
    // One of the slots known to wait leaves: one fewer.
    if (static_cast<std::size_t>(r.items.end() - at) <= r.known_waiting) --r.known_waiting;
    r.items.erase(at);
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
  // A size keeps one row: in the table, or, while another size holds its entry
  // there, in the map. An entry whose row is empty goes to the next size.
  row& find_or_make(std::size_t size) {
    entry& e = direct(size);
    if (e.size == size) return e.r;
    if (e.r.items.empty() && overflow_.find(size) == overflow_.end()) {
      e.size = size;
      e.r.known_waiting = 0;
      return e.r;
    }
    return overflow_[size];
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
