// Host-side records of the pool's device memory: chunks (what the upstream
// gave) and blocks (pieces of a chunk, free or handed out). Device memory holds
// no headers, so these live on the host and point at it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace gpumem::detail {

struct arena;
struct chunk;

struct block {
  std::uintptr_t address = 0;
  std::size_t size = 0;             // multiple of the pool granule
  std::size_t requested_bytes = 0;  // as the caller asked; checked on deallocate
  block* prev_in_chunk = nullptr;   // physical neighbours, address order
  block* next_in_chunk = nullptr;
  block* prev_free = nullptr;       // free-list links (free blocks only)
  block* next_free = nullptr;
  chunk* owner = nullptr;
  // The owning arena's free counter when the block last became free; the block
  // is safe for other streams once the arena's fence covers this count.
  std::uint64_t free_epoch = 0;
  bool free = false;    // in the free index
  bool cached = false;  // freed into the arena's quick cache (not free, not live)
  // Paged pools only (Note [Pages under the blocks], src/vmm/page_blocks.cpp):
  // free addresses without physical memory, in the arena's `unmapped` index; or
  // an alias, the old mapping of pages moved elsewhere, kept so that the range
  // can take them back without a driver call (neither free nor live).
  bool unmapped = false;
  bool alias = false;
};

struct chunk {
  std::uintptr_t base = 0;
  std::size_t size = 0;
  arena* owner = nullptr;
  block* first = nullptr;
  // Paged pools only: the physical handle mapped at each page of the chunk (0:
  // none). Guarded by the owner arena's lock.
  std::vector<std::uint64_t> pages;
};

// Allocates block records without touching the heap on the hot path.
class block_slab {
 public:
  block* make() {
    if (free_ == nullptr) refill();
    block* b = free_;
    free_ = b->next_free;
    *b = block{};
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
