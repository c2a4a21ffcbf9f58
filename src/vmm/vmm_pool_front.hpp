// vmm_pool_resource's per-stream front (docs/vmm.md, "The hot path"): the
// blocks a stream freed, kept whole by exact size and handed back to the same
// stream without the pool's lock, and the stream's fence state.
//
// Note [The per-stream front]
// Programs free and allocate the same sizes over and over on one stream (W1, a
// training step). A block freed on stream S may be reused on S at once (stream
// order), so S's front keeps it, by exact size, and the next request of that
// size on S takes it under S's lock only: no pool mutex, no std::map. To the
// pool the block stays allocated, owned by the front (blk::owner): nothing else
// carves it, moves its physical memory or gives it back. The front holds no
// memory back: every path that could grow the pool, move physical memory, give
// it back, serve another stream from a miss or report statistics first flushes
// every front, and a flushed block becomes free exactly as if it had been
// freed then, pending on S with the epoch of its real free, so another stream
// reuses it only after a device-side wait on S's fence (the fencing rules are
// unchanged). The blocks a front handed out are found by address in `live`, so
// the free of one is checked (size, double free) under S's lock too; the blocks it
// caches stay there, marked cached (as pool_resource's quick cache does), so a
// reuse and a free are one lookup each instead of an insert and an erase. A free on
// another stream than the one that cached the block goes through the pool's
// lock, which asks the owner front to forget the block.
#pragma once

#include <cuda.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "pool/pointer_map.hpp"
#include "pool/spin_lock.hpp"

namespace gpumem::detail::vmm {

// What a front remembers of a block it handed out (found by address in
// front::live, a detail::address_map).
struct front_live_entry {
  std::size_t size = 0;
  std::size_t requested = 0;
  bool cached = false;  // freed into the front's cache (kept here, so a reuse is a find, not an insert)
};

// Freed blocks by exact size: 64 direct slots for sizes up to 16 KiB (one per
// 256-byte granule count, so small sizes never collide) and 64 hashed slots for
// larger ones; 32 blocks per slot.
class front_cache {
 public:
  static constexpr unsigned depth = 32;
  struct item {
    std::uintptr_t address = 0;
    std::uint64_t epoch = 0;  // the stream's free count at the block's free
  };

  // A cached block of exactly `size` bytes at `alignment`, or address 0.
  item pop(std::size_t size, std::size_t alignment) noexcept {
    slot& e = slot_of(size);
    if (e.size != size || e.count == 0) return {};
    const item it = e.items[e.count - 1];
    if ((it.address & (alignment - 1)) != 0) return {};
    --e.count;
    --count_;
    return it;
  }

  bool push(std::uintptr_t address, std::size_t size, std::uint64_t epoch) noexcept {
    slot& e = slot_of(size);
    if (e.count == 0) {
      e.size = size;
    } else if (e.size != size || e.count >= depth) {
      return false;
    }
    e.items[e.count++] = item{address, epoch};
    ++count_;
    return true;
  }

  // Removes every block, calling f(address, size, epoch) on each.
  template <class F>
  void drain(F&& f) {
    if (count_ == 0) return;
    for (slot& e : slots_) {
      for (unsigned k = 0; k < e.count; ++k) f(e.items[k].address, e.size, e.items[k].epoch);
      e.count = 0;
    }
    count_ = 0;
  }

  std::size_t count() const noexcept { return count_; }

 private:
  struct slot {
    std::size_t size = 0;
    unsigned count = 0;
    std::array<item, depth> items{};
  };
  slot& slot_of(std::size_t size) noexcept {
    const std::size_t g = size >> 8;
    if (g < 64) return slots_[g];
    return slots_[64 + ((g * 0x9E3779B97F4A7C15ULL) >> 58)];
  }

  std::array<slot, 128> slots_{};
  std::size_t count_ = 0;
};

// One per stream the pool has seen; never destroyed before the pool.
struct stream_front {
  explicit stream_front(CUstream s, bool can_cache) : stream(s), cacheable(can_cache) {}

  const CUstream stream;
  // False for the per-thread default stream: one handle, a different stream on
  // every thread, so what one thread freed must not go to another at once.
  const bool cacheable;

  spin_lock lock;  // held for tens of nanoseconds by the stream's threads
  // ---- guarded by `lock` ----
  front_cache cache;
  detail::address_map<front_live_entry> live;  // handed out by this front, or cached in it (entry.cached)
  unsigned unfenced = 0;
  // ---- written under `lock`, read anywhere ----
  std::atomic<std::uint64_t> frees{0};   // frees on this stream so far
  std::atomic<bool> requested{false};    // another stream waits for a fence here
  // ---- guarded by the pool's mutex ----
  CUevent event = nullptr;
  std::uint64_t fenced = 0;     // frees before the last record of `event`
  std::uint64_t completed = 0;  // frees the host has seen complete
};

}  // namespace gpumem::detail::vmm
