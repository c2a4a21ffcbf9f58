// Two-level segregated fit (TLSF) index of free blocks: O(1) insert, remove and
// good-fit search with two bitmaps. A request is rounded up to the next class
// boundary so that any block found in a class at or above it fits.
//
// Classes: sizes below 16 granules get one class per granule; above, each power
// of two is split into 16 classes (so a found block wastes at most 1/16).
//
// Intrusive over any Node with `size`, `free_link` and `next_free`: the blocks of
// both pools (free_index).
//
// Note [Free lists without branches on their ends]
// Each list is singly linked forward (next_free) and each block keeps the address
// of the link that points to it (free_link: the list's head, or the previous
// block's next_free), so a removal unlinks the block with one store whether or not
// it is first, and the bitmaps follow whether the list is now empty by arithmetic.
// The one end left, the next block's back link, is written through a select
// between that block and a scratch node. Whether a block is first in its list, or
// last, or alone, is what the random sizes of W2 and of real programs make
// unpredictable, and as branches those were mispredicted often (docs/benchmarks.md,
// "Where gpumem loses, and why"). The index must not move (links point into
// heads_): an arena holds it in place. pool_inspector checks every free block's link.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "pool/block.hpp"

namespace gpumem::detail {

template <class Node>
class basic_free_index {
 public:
  static constexpr unsigned granule_shift = 8;  // 256-byte granule
  static constexpr unsigned sl_bits = 4;
  static constexpr unsigned sl_count = 1U << sl_bits;
  static constexpr unsigned fl_count = 64 - granule_shift - sl_bits + 1;

  basic_free_index() = default;
  basic_free_index(const basic_free_index&) = delete;  // links point into heads_
  basic_free_index& operator=(const basic_free_index&) = delete;

  void insert(Node* b) noexcept {
    auto [fl, sl] = class_of(b->size);
    Node*& head = heads_[fl][sl];
    Node* const next = head;
    b->next_free = next;
    b->free_link = &head;
    back_of(next)->free_link = &b->next_free;
    head = b;
    fl_map_ |= std::uint64_t{1} << fl;
    sl_map_[fl] |= 1U << sl;
    ++count_;
    bytes_ += b->size;
  }

  void remove(Node* b) noexcept {
    auto [fl, sl] = class_of(b->size);
    Node* const next = b->next_free;
    *b->free_link = next;
    back_of(next)->free_link = b->free_link;
    // The list's bits go when it is empty now (Note [Free lists without branches on their ends]).
    const std::uint32_t list_empty = heads_[fl][sl] == nullptr ? 1U : 0U;
    sl_map_[fl] &= ~(list_empty << sl);
    fl_map_ &= ~(std::uint64_t{sl_map_[fl] == 0 ? 1U : 0U} << fl);
    b->free_link = nullptr;
    b->next_free = nullptr;
    --count_;
    bytes_ -= b->size;
  }

  // Sets an indexed block's size. It moves between lists only when its class
  // changes: a block that grows by a neighbour or shrinks by a request mostly stays.
  void resize(Node* b, std::size_t new_size) noexcept {
    const slot from = class_of(b->size);
    const slot to = class_of(new_size);
    if (from.fl == to.fl && from.sl == to.sl) {
      bytes_ = bytes_ - b->size + new_size;
      b->size = new_size;
      return;
    }
    remove(b);
    b->size = new_size;
    insert(b);
  }

  // A free block of at least `size` bytes (a granule multiple), or null. Not removed.
  // Good fit in O(1); when only the request's own class could hold a fit (a block
  // of exactly the size asked, say), that one class is scanned.
  Node* find(std::size_t size) const noexcept {
    if (Node* b = find_in_larger_class(size)) return b;
    auto [fl, sl] = class_of(size);
    for (Node* b = heads_[fl][sl]; b != nullptr; b = b->next_free) {
      if (b->size >= size) return b;
    }
    return nullptr;
  }

 private:
  Node* find_in_larger_class(std::size_t size) const noexcept {
    auto [fl, sl] = class_of(round_up_to_class(size));
    if (fl >= fl_count) return nullptr;
    std::uint32_t sl_map = sl_map_[fl] & (~0U << sl);
    if (sl_map == 0) {
      const std::uint64_t fl_map = fl + 1 < 64 ? fl_map_ & (~std::uint64_t{0} << (fl + 1)) : 0;
      if (fl_map == 0) return nullptr;
      fl = static_cast<unsigned>(std::countr_zero(fl_map));
      sl_map = sl_map_[fl];
    }
    return heads_[fl][std::countr_zero(sl_map)];
  }

 public:

  // Every free block in classes that may hold blocks of `size` or more, for the
  // rare searches that need a property besides size. Visits until f returns true.
  template <class F>
  Node* find_if(std::size_t size, F&& accept) const {
    auto [fl0, sl0] = class_of(size);
    for (unsigned fl = fl0; fl < fl_count; ++fl) {
      if ((fl_map_ >> fl & 1U) == 0) continue;
      for (unsigned sl = fl == fl0 ? sl0 : 0; sl < sl_count; ++sl) {
        for (Node* b = heads_[fl][sl]; b != nullptr; b = b->next_free) {
          if (b->size >= size && accept(b)) return b;
        }
      }
    }
    return nullptr;
  }

  // The good-fit head when accept() takes it (O(1)), else as find_if: for searches
  // where most blocks are acceptable but some are not (vmm_pool_resource's stream rules).
  template <class F>
  Node* find_accepted(std::size_t size, F&& accept) const {
    if (Node* b = find_in_larger_class(size); b != nullptr && accept(b)) return b;
    return find_if(size, accept);
  }

  // The largest free block (exact: scans only the top non-empty class).
  std::size_t largest() const noexcept {
    if (fl_map_ == 0) return 0;
    const unsigned fl = 63U - static_cast<unsigned>(std::countl_zero(fl_map_));
    const unsigned sl = 31U - static_cast<unsigned>(std::countl_zero(sl_map_[fl]));
    std::size_t best = 0;
    for (Node* b = heads_[fl][sl]; b != nullptr; b = b->next_free) best = b->size > best ? b->size : best;
    return best;
  }

  std::size_t count() const noexcept { return count_; }
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  struct slot {
    unsigned fl;
    unsigned sl;
  };
  static slot class_of(std::size_t size) noexcept {
    const std::size_t granules = size >> granule_shift;
    if (granules < sl_count) return {0, static_cast<unsigned>(granules)};
    const unsigned msb = 63U - static_cast<unsigned>(std::countl_zero(granules));
    const unsigned sl = static_cast<unsigned>(granules >> (msb - sl_bits)) ^ sl_count;
    return {msb - sl_bits + 1, sl};
  }
  static std::size_t round_up_to_class(std::size_t size) noexcept {
    const std::size_t granules = size >> granule_shift;
    if (granules < sl_count) return size;
    const unsigned msb = 63U - static_cast<unsigned>(std::countl_zero(granules));
    const std::size_t step = std::size_t{1} << (msb - sl_bits + granule_shift);
    const std::size_t rounded = (size + step - 1) & ~(step - 1);
    return rounded < size ? size : rounded;  // overflow: the search then finds nothing larger
  }

  // The node whose back link a list's end writes: the next block, or the scratch
  // node past the last one (a select, not a branch).
  Node* back_of(Node* next) noexcept { return next != nullptr ? next : &scratch_; }

  std::uint64_t fl_map_ = 0;
  std::array<std::uint32_t, fl_count> sl_map_{};
  Node scratch_{};
  std::array<std::array<Node*, sl_count>, fl_count> heads_{};
  std::size_t count_ = 0;
  std::size_t bytes_ = 0;
};

using free_index = basic_free_index<block>;

}  // namespace gpumem::detail
