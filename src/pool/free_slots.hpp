// An arena's free slots (paged pools only; Note [Slots for large requests] in
// src/vmm/page_slots.cpp): large blocks that keep their address range and size
// for life, kept free by exact size, the most recently freed first. Sizes are
// looked up in a small direct-mapped table, and in a map when two sizes share
// an entry. Like the quick cache, a free slot stays in the arena's live map,
// marked cached, so a second free of it is caught.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <unordered_map>

#include "pool/block.hpp"

namespace gpumem::detail {

class free_slots {
 public:
  // The most recently freed slot of exactly `size` bytes, or null.
  block* pop(std::size_t size) noexcept {
    list* l = find(size);
    if (l == nullptr || l->head == nullptr) return nullptr;
    block* b = l->head;
    l->head = b->next_free;
    b->next_free = nullptr;
    --count_;
    bytes_ -= size;
    return b;
  }

  // What pop(size) would return, left in place.
  block* peek(std::size_t size) noexcept {
    list* l = find(size);
    return l == nullptr ? nullptr : l->head;
  }

  void push(block* b) {
    list& l = find_or_make(b->size);
    b->next_free = l.head;
    l.head = b;
    ++count_;
    bytes_ += b->size;
  }

  // Removes `b`, a free slot of this cache. Linear in the free slots of its size.
  void remove(block* b) noexcept {
    list* l = find(b->size);
    for (block** at = &l->head; *at != nullptr; at = &(*at)->next_free) {
      if (*at == b) {
        *at = b->next_free;
        b->next_free = nullptr;
        --count_;
        bytes_ -= b->size;
        return;
      }
    }
  }

  // Calls f(slot) on every free slot until it returns true.
  template <class F>
  void for_each_until(F&& f) const {
    for (const entry& e : direct_) {
      for (block* b = e.l.head; b != nullptr; b = b->next_free) {
        if (f(b)) return;
      }
    }
    for (const auto& [size, l] : overflow_) {
      for (block* b = l.head; b != nullptr; b = b->next_free) {
        if (f(b)) return;
      }
    }
  }

  std::size_t count() const noexcept { return count_; }
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  struct list {
    block* head = nullptr;  // linked through block::next_free
  };
  struct entry {
    std::size_t size = 0;
    list l;
  };
  static constexpr unsigned slot_bits = 6;
  entry& direct(std::size_t size) noexcept {
    return direct_[((size >> 8) * 0x9E3779B97F4A7C15ULL) >> (64 - slot_bits)];
  }
  list* find(std::size_t size) noexcept {
    entry& e = direct(size);
    if (e.size == size) return &e.l;
    if (overflow_.empty()) return nullptr;
    auto it = overflow_.find(size);
    return it != overflow_.end() ? &it->second : nullptr;
  }
  // A size keeps one list: in the table, or, while another size holds its entry
  // there, in the map. An entry whose list is empty goes to the next size.
  list& find_or_make(std::size_t size) {
    entry& e = direct(size);
    if (e.size == size) return e.l;
    if (e.l.head == nullptr && overflow_.find(size) == overflow_.end()) {
      e.size = size;
      return e.l;
    }
    return overflow_[size];
  }

  std::array<entry, std::size_t{1} << slot_bits> direct_{};
  std::unordered_map<std::size_t, list> overflow_;
  std::size_t count_ = 0;
  std::size_t bytes_ = 0;
};

}  // namespace gpumem::detail
