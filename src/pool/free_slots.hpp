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
    heap* h = find(size);
    if (h == nullptr || h->empty()) return nullptr;
    block* b = h->front();
    std::pop_heap(h->begin(), h->end(), higher_address);
    h->pop_back();
    --count_;
    bytes_ -= size;
    return b;
  }

  // What pop(size) would return, left in place.
  block* peek(std::size_t size) noexcept {
    heap* h = find(size);
    return h == nullptr || h->empty() ? nullptr : h->front();
  }

  void push(block* b) {
    heap& h = find_or_make(b->size);
    h.push_back(b);
    std::push_heap(h.begin(), h.end(), higher_address);
    ++count_;
    bytes_ += b->size;
  }

  // Removes `b`, a free slot of this cache. Linear in the free slots of its size.
  void remove(block* b) noexcept {
    heap* h = find(b->size);
    if (h == nullptr) return;
    auto it = std::find(h->begin(), h->end(), b);
    if (it == h->end()) return;
    *it = h->back();
    h->pop_back();
    std::make_heap(h->begin(), h->end(), higher_address);
    --count_;
    bytes_ -= b->size;
  }

  // How many free slots of exactly `size` bytes there are.
  std::size_t count_of(std::size_t size) noexcept {
    heap* h = find(size);
    return h == nullptr ? 0 : h->size();
  }

  // Calls f(slot) on every free slot until it returns true.
  template <class F>
  void for_each_until(F&& f) const {
    for (const entry& e : direct_) {
      for (block* b : e.h) {
        if (f(b)) return;
      }
    }
    for (const auto& [size, h] : overflow_) {
      for (block* b : h) {
        if (f(b)) return;
      }
    }
  }

  std::size_t count() const noexcept { return count_; }
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  // A size's free slots: a binary heap whose front is the lowest address.
  using heap = std::vector<block*>;
  static bool higher_address(const block* x, const block* y) noexcept { return x->address > y->address; }
  struct entry {
    std::size_t size = 0;
    heap h;
  };
  static constexpr unsigned slot_bits = 6;
  entry& direct(std::size_t size) noexcept {
    return direct_[((size >> 8) * 0x9E3779B97F4A7C15ULL) >> (64 - slot_bits)];
  }
  heap* find(std::size_t size) noexcept {
    entry& e = direct(size);
    if (e.size == size) return &e.h;
    if (overflow_.empty()) return nullptr;
    auto it = overflow_.find(size);
    return it != overflow_.end() ? &it->second : nullptr;
  }
  // A size keeps one heap: in the table, or, while another size holds its entry
  // there, in the map. An entry whose heap is empty goes to the next size.
  heap& find_or_make(std::size_t size) {
    entry& e = direct(size);
    if (e.size == size) return e.h;
    if (e.h.empty() && overflow_.find(size) == overflow_.end()) {
      e.size = size;
      return e.h;
    }
    return overflow_[size];
  }

  std::array<entry, std::size_t{1} << slot_bits> direct_{};
  std::unordered_map<std::size_t, heap> overflow_;
  std::size_t count_ = 0;
  std::size_t bytes_ = 0;
};

}  // namespace gpumem::detail
