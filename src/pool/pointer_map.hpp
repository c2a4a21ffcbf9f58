// Address -> block of every live allocation of one arena: open addressing with
// linear probing and backward-shift deletion (no tombstones), so lookups stay
// short however long the pool runs. Not thread-safe; the arena's lock guards it.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "pool/block.hpp"

namespace gpumem::detail {

class pointer_map {
 public:
  pointer_map() : slots_(64) {}

  void insert(std::uintptr_t key, block* value) {
    if ((size_ + 1) * 2 > slots_.size()) grow();  // at most half full: short probe runs
    place(key, value);
    ++size_;
  }

  block* find(std::uintptr_t key) const noexcept {
    for (std::size_t i = home(key);; i = next(i)) {
      const entry& e = slots_[i];
      if (e.key == key) return e.value;
      if (e.key == 0) return nullptr;
    }
  }

  // Removes key; returns its block or null when absent.
  block* erase(std::uintptr_t key) noexcept {
    std::size_t i = home(key);
    for (;; i = next(i)) {
      if (slots_[i].key == key) break;
      if (slots_[i].key == 0) return nullptr;
    }
    block* found = slots_[i].value;
    // Shift later entries of the probe run back so no lookup stops early.
    for (std::size_t j = next(i);; j = next(j)) {
      if (slots_[j].key == 0) break;
      const std::size_t h = home(slots_[j].key);
      const bool movable = i <= j ? (h <= i || h > j) : (h <= i && h > j);
      if (movable) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = entry{};
    --size_;
    return found;
  }

  std::size_t size() const noexcept { return size_; }

  template <class F>
  void for_each(F&& f) const {
    for (const entry& e : slots_) {
      if (e.key != 0) f(e.key, e.value);
    }
  }

 private:
  struct entry {
    std::uintptr_t key = 0;
    block* value = nullptr;
  };
  std::size_t home(std::uintptr_t key) const noexcept {
    // Allocations are 256-byte aligned: drop the zero bits, then mix.
    return static_cast<std::size_t>(((key >> 8) * 0x9E3779B97F4A7C15ULL) >> shift_);
  }
  std::size_t next(std::size_t i) const noexcept { return (i + 1) & (slots_.size() - 1); }
  void place(std::uintptr_t key, block* value) noexcept {
    std::size_t i = home(key);
    while (slots_[i].key != 0) i = next(i);
    slots_[i] = entry{key, value};
  }
  void grow() {
    std::vector<entry> old(slots_.size() * 2);
    old.swap(slots_);
    shift_ = 64 - static_cast<unsigned>(std::countr_zero(slots_.size()));
    for (const entry& e : old) {
      if (e.key != 0) place(e.key, e.value);
    }
  }

  std::vector<entry> slots_;
  unsigned shift_ = 64 - 6;  // log2(64) bits of hash
  std::size_t size_ = 0;
};

}  // namespace gpumem::detail
