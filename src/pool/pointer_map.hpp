// Address -> value maps for the pools' live allocations: open addressing with
// linear probing and backward-shift deletion (no tombstones), so lookups stay
// short however long a pool runs. Keys are 256-byte-aligned addresses, never 0.
// Not thread-safe: the owner's lock guards it.
//   pointer_map     address -> block of every live allocation of one arena (pool_resource)
//   address_map<V>  the same machinery for any value (vmm_pool_resource's fronts)
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "pool/block.hpp"

namespace gpumem::detail {

template <class Value>
class address_map {
 public:
  address_map() : slots_(64) {}

  void insert(std::uintptr_t key, const Value& value) {
    if ((size_ + 1) * 2 > slots_.size()) grow();  // at most half full: short probe runs
    place(key, value);
    ++size_;
  }

  // The value stored for key, or null.
  const Value* find(std::uintptr_t key) const noexcept {
    for (std::size_t i = home(key);; i = next(i)) {
      const entry& e = slots_[i];
      if (e.key == key) return &e.value;
      if (e.key == 0) return nullptr;
    }
  }
  Value* find(std::uintptr_t key) noexcept {
    return const_cast<Value*>(static_cast<const address_map&>(*this).find(key));
  }

  // Removes key, its value into *out when given; false when absent.
  bool erase(std::uintptr_t key, Value* out = nullptr) noexcept {
    std::size_t i = home(key);
    for (;; i = next(i)) {
      if (slots_[i].key == key) break;
      if (slots_[i].key == 0) return false;
    }
    if (out != nullptr) *out = slots_[i].value;
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
    return true;
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
    Value value{};
  };
  std::size_t home(std::uintptr_t key) const noexcept {
    // Allocations are 256-byte aligned: drop the zero bits, then mix.
    return static_cast<std::size_t>(((key >> 8) * 0x9E3779B97F4A7C15ULL) >> shift_);
  }
  std::size_t next(std::size_t i) const noexcept { return (i + 1) & (slots_.size() - 1); }
  void place(std::uintptr_t key, const Value& value) noexcept {
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

// pool_resource's arena map: lookups and removals hand back the block itself.
class pointer_map {
 public:
  void insert(std::uintptr_t key, block* value) { map_.insert(key, value); }
  block* find(std::uintptr_t key) const noexcept {
    block* const* v = map_.find(key);
    return v != nullptr ? *v : nullptr;
  }
  // Removes key; returns its block or null when absent.
  block* erase(std::uintptr_t key) noexcept {
    block* found = nullptr;
    map_.erase(key, &found);
    return found;
  }
  std::size_t size() const noexcept { return map_.size(); }
  template <class F>
  void for_each(F&& f) const {
    map_.for_each(f);
  }

 private:
  address_map<block*> map_;
};

}  // namespace gpumem::detail
