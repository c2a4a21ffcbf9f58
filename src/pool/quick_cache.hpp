// An arena's quick cache: blocks freed on the arena's stream, kept whole by exact
// size (16 sizes, direct-mapped by a hash of the size; 16 blocks each) so that the next request of that size
// takes one at once, without splitting, coalescing or touching the free index.
// Programs allocate the same sizes over and over (W1, training steps), so this
// is the common case. The cache holds no memory back: every path that could
// grow the pool, give memory away or report it flushes the cache first, and a
// flushed block coalesces as if it had been freed just then (with the epoch of
// its real free, so fencing is unchanged).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "pool/block.hpp"

namespace gpumem::detail {

class quick_cache {
 public:
  static constexpr unsigned slot_bits = 4;  // 16 sizes, direct-mapped: one compare per call
  static constexpr unsigned depth = 16;

  // A cached block of exactly `size` bytes aligned to `alignment`, or null.
  block* pop(std::size_t size, std::size_t alignment) noexcept {
    slot& e = slot_of(size);
    block* b = e.head;
    if (e.size != size || b == nullptr || (b->address & (alignment - 1)) != 0) return nullptr;
    e.head = b->next_free;
    --e.count;
    bytes_ -= size;
    --count_;
    b->next_free = nullptr;
    return b;
  }

  // What pop(size, alignment) would return, left in place.
  block* peek(std::size_t size, std::size_t alignment) const noexcept {
    const slot& e = slots_[index_of(size)];
    block* b = e.head;
    if (e.size != size || b == nullptr || (b->address & (alignment - 1)) != 0) return nullptr;
    return b;
  }

  // Keeps `b` if its size's slot holds that size with room, or is empty; else false.
  bool push(block* b) noexcept {
    slot& e = slot_of(b->size);
    if (e.count == 0) {
      e.size = b->size;
    } else if (e.size != b->size || e.count >= depth) {
      return false;
    }
    put(e, b);
    return true;
  }

  // Removes every block, calling f on each.
  template <class F>
  void drain(F&& f) {
    for (slot& e : slots_) {
      while (e.head != nullptr) {
        block* b = e.head;
        e.head = b->next_free;
        b->next_free = nullptr;
        f(b);
      }
      e.count = 0;
    }
    bytes_ = 0;
    count_ = 0;
  }


  std::size_t bytes() const noexcept { return bytes_; }
  std::size_t count() const noexcept { return count_; }

 private:
  struct slot {
    std::size_t size = 0;
    unsigned count = 0;
    block* head = nullptr;  // linked through block::next_free
  };
  static std::size_t index_of(std::size_t size) noexcept {
    return ((size >> 8) * 0x9E3779B97F4A7C15ULL) >> (64 - slot_bits);
  }
  slot& slot_of(std::size_t size) noexcept { return slots_[index_of(size)]; }
  void put(slot& e, block* b) noexcept {
    b->next_free = e.head;
    e.head = b;
    ++e.count;
    bytes_ += b->size;
    ++count_;
  }

  std::array<slot, std::size_t{1} << slot_bits> slots_{};
  std::size_t bytes_ = 0;
  std::size_t count_ = 0;
};

}  // namespace gpumem::detail
