// One stream's share of a pool: its free blocks, its live allocations, the
// upstream chunks it owns, and the fence that orders its frees for other streams.
//
// Note [Fencing frees in batches]
// A block freed on stream S may be reused on S at once: S runs in order. Another
// stream T may reuse it only after S's work queued before the free, so T must
// wait (on the device) for an event recorded on S after the free. RMM records an
// event on every free, which costs more than the rest of a free. An arena
// instead counts its frees (`frees`) and records its `fence` event on S once
// every `fence_interval` frees (or `fence_bytes` bytes) while the pool serves
// more than one stream, at the next free after another stream asked for one, and
// on every slow path that runs on S. A pool used by one stream never fences. A block carries the count at which it became free
// (block::free_epoch); it is fenced, safe for T after cuStreamWaitEvent(T, fence),
// once `fenced_frees` >= that count. The event is recorded only on the stream of
// the call being served, so gpumem never records on a stream that may have been
// destroyed. Unfenced blocks are reused by S alone, until the next fence or, when
// the device is out of memory, a device synchronisation makes every free complete.
//
// Every block of a chunk is managed by the chunk's owning arena, so splitting and
// coalescing need only that arena's lock. A block freed on another stream U goes
// to its owner's `pending` list with U's fence recorded; the owner absorbs it
// after waiting on U's fence (on the device), when its own free blocks fall short.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include <cuda.h>

#include "pool/block.hpp"
#include "pool/free_index.hpp"
#include "pool/pointer_map.hpp"
#include "pool/quick_cache.hpp"

namespace gpumem::detail {

// Held for tens of nanoseconds by the threads of one stream: a spin lock beats
// a mutex's system call path, and yields if the holder was descheduled.
class spin_lock {
 public:
  void lock() noexcept {
    for (unsigned spins = 0; locked_.exchange(true, std::memory_order_acquire); ++spins) {
      while (locked_.load(std::memory_order_relaxed)) {
        if (++spins > 64) std::this_thread::yield();
      }
    }
  }
  bool try_lock() noexcept { return !locked_.exchange(true, std::memory_order_acquire); }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

struct arena;

struct pending_free {
  block* freed = nullptr;
  arena* freed_on = nullptr;  // whose fence orders the free
  std::uint64_t sequence = 0;
};

// Own cache lines: arenas are written by different threads on every operation.
struct alignas(64) arena {
  explicit arena(CUstream s) : stream(s) {}

  spin_lock lock;
  CUstream stream;  // the stream every call through this arena is ordered on

  free_index free;
  quick_cache quick;  // freed blocks kept whole by size (quick_cache.hpp)
  pointer_map live;   // live and quick-cached blocks by address
  block_slab slab;
  std::vector<chunk*> chunks;
  std::vector<pending_free> pending;
  std::uint64_t pending_sequence = 0;

  CUevent fence = nullptr;  // created at first record
  std::uint64_t frees = 0;
  std::uint64_t fenced_frees = 0;
  unsigned unfenced_count = 0;
  std::size_t unfenced_bytes = 0;
  // Set by a stream that found no fenced memory to take: fence at the next free.
  std::atomic<bool> fence_requested{false};

  std::size_t used_bytes = 0;
  std::size_t reserved_bytes = 0;

  bool is_fenced(const block* b) const noexcept { return b->free_epoch <= fenced_frees; }
};

}  // namespace gpumem::detail
