// An arena's free slots (paged pools only; Note [Slots for large requests] in
// src/vmm/page_slots.cpp): large blocks that keep their address range and size
// for life, kept free by exact size, the lowest address first (the stable
// choice that lets a loop settle: Note [Slots for large requests]). Sizes are
// looked up in a small direct-mapped table, and in a map when two sizes share
// an entry. Like the quick cache, a free slot stays in the arena's live map,
// marked cached, so a second free of it is caught.
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
  // The free slot of exactly `size` bytes at the lowest address, or null.
  block* pop(std::size_t size) noexcept {
    row* r = find(size);
    if (r == nullptr || r->empty()) return nullptr;
    block* b = r->back().b;
    r->pop_back();
    --count_;
    bytes_ -= size;
    return b;
  }

  // What pop(size) would return, left in place.
  block* peek(std::size_t size) noexcept {
    row* r = find(size);
    return r == nullptr || r->empty() ? nullptr : r->back().b;
  }

  void push(block* b) {
    row& r = find_or_make(b->size);
    const item x{b->address, b, {}};
    r.insert(std::upper_bound(r.begin(), r.end(), x, higher_address), x);
    ++count_;
    bytes_ += b->size;
  }

  // Removes `b`, a free slot of this cache.
  void remove(block* b) noexcept {
    row* r = find(b->size);
    if (r == nullptr) return;
    auto it = std::lower_bound(r->begin(), r->end(), item{b->address, b, {}}, higher_address);
    if (it == r->end() || it->b != b) return;
    r->erase(it);
    --count_;
    bytes_ -= b->size;
  }

  // Removes and returns the free slot of exactly `size` bytes at the lowest
  // address that `accept` takes, or null. Visits in address order, past the
  // slots that still wait (waiting), until one is taken; the others stay.
  template <class F>
  block* pop_lowest_accepted(std::size_t size, unsigned page_shift, F&& accept) {
    row* r = find(size);
    if (r == nullptr) return nullptr;
    for (auto it = r->rbegin(); it != r->rend(); ++it) {
      if (waiting(*it, page_shift) || !accept(it->b)) continue;
      return take(*r, std::next(it).base());
    }
    return nullptr;
  }

  // Removes and returns the free slot of exactly `size` bytes at the lowest
  // address past the slots that still wait, when `ready` takes it; else null.
  template <class F>
  block* pop_first_ready(std::size_t size, unsigned page_shift, F&& ready) {
    row* r = find(size);
    if (r == nullptr) return nullptr;
    for (auto it = r->rbegin(); it != r->rend(); ++it) {
      if (waiting(*it, page_shift)) continue;
      return ready(it->b) ? take(*r, std::next(it).base()) : nullptr;
    }
    return nullptr;
  }

  // How many free slots of exactly `size` bytes there are.
  std::size_t count_of(std::size_t size) noexcept {
    row* r = find(size);
    return r == nullptr ? 0 : r->size();
  }

  // Calls f(slot) on every free slot until it returns true.
  template <class F>
  void for_each_until(F&& f) const {
    for (const entry& e : direct_) {
      for (const item& x : e.r) {
        if (f(x.b)) return;
      }
    }
    for (const auto& [size, r] : overflow_) {
      for (const item& x : r) {
        if (f(x.b)) return;
      }
    }
  }

  // Calls f(slot) on every free slot of exactly `size` bytes, highest address first.
  template <class F>
  void for_each_of(std::size_t size, F&& f) {
    row* r = find(size);
    if (r == nullptr) return;
    for (const item& x : *r) f(x.b);
  }

  std::size_t count() const noexcept { return count_; }
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  // A size's free slots, highest address first, each with its address beside it
  // (ordering them reads no block) and the wait of it last seen to hold (chunk::
  // page_wait), checked first: one load while it still holds. The lowest is
  // taken from the end and mostly put back there; a slot freed is placed by a
  // binary search.
  struct item {
    std::uintptr_t address;
    block* b;
    chunk::page_wait wait{};
  };
  using row = std::vector<item>;
  static bool higher_address(const item& x, const item& y) noexcept { return x.address > y.address; }
  // Whether the slot of `x` still cannot be used, as far as its recorded waits tell.
  static bool waiting(item& x, unsigned page_shift) noexcept {
    if (x.wait.holds()) return true;
    const chunk::page_wait* w = wait_that_holds(x.b, page_shift);
    x.wait = w != nullptr ? *w : chunk::page_wait{};
    return w != nullptr;
  }
  block* take(row& r, row::iterator at) noexcept {
    block* b = at->b;
    r.erase(at);
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
    if (e.r.empty() && overflow_.find(size) == overflow_.end()) {
      e.size = size;
      return e.r;
    }
    return overflow_[size];
  }

  std::array<entry, std::size_t{1} << slot_bits> direct_{};
  std::unordered_map<std::size_t, row> overflow_;
  std::size_t count_ = 0;
  std::size_t bytes_ = 0;
};

}  // namespace gpumem::detail
