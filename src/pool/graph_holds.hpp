// Blocks of a pool freed on a stream under capture, held for the graph being
// captured until the driver says that graph is gone (Note [A pool block freed
// under a capture], graph_holds.cpp).
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "driver/driver.hpp"

namespace gpumem::detail {

struct arena;
struct block;

class graph_holds {
 public:
  struct held {
    block* freed;  // never followed by the driver's thread: only the pool reads it
    arena* owner;
    std::size_t bytes;  // the block's size
  };

  graph_holds();
  ~graph_holds();
  graph_holds(const graph_holds&) = delete;
  graph_holds& operator=(const graph_holds&) = delete;

  // Ties `h` to `graph` (the graph being captured): take_released() hands it back
  // once the driver drops the graph's reference. cuda_error, with nothing held,
  // where the driver refuses.
  void hold(CUgraph graph, held h);
  // One load: whether take_released() has anything.
  bool any_released() const noexcept { return shared_->released_count.load(std::memory_order_acquire) != 0; }
  std::vector<held> take_released();
  // One of those taken is no longer held (its block freed, or gone with the pool).
  void returned(const held& h) noexcept {
    holding_.fetch_sub(1, std::memory_order_relaxed);
    holding_bytes_.fetch_sub(h.bytes, std::memory_order_relaxed);
  }
  // Held now, and their bytes: released ones not yet returned among them.
  std::size_t count() const noexcept { return holding_.load(std::memory_order_relaxed); }
  std::size_t bytes() const noexcept { return holding_bytes_.load(std::memory_order_relaxed); }

  // What the driver's thread and the pool share; outlives the pool while a
  // graph still holds a block of it.
  struct shared_state {
    std::mutex mutex;  // guards `released`
    std::vector<held> released;
    std::atomic<std::size_t> released_count{0};
  };

 private:
  std::shared_ptr<shared_state> shared_;
  std::atomic<std::size_t> holding_{0};
  std::atomic<std::size_t> holding_bytes_{0};
};

}  // namespace gpumem::detail
