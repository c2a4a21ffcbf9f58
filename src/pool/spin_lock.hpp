// The lock of the pools' per-stream state (pool_resource's arenas,
// vmm_pool_resource's fronts).
#pragma once

#include <atomic>
#include <thread>

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

}  // namespace gpumem::detail
