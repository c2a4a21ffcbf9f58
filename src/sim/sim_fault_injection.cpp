// Fault injection for device allocations (see sim_fault_injection.hpp).
#include "sim/sim_fault_injection.hpp"

namespace gpumem::detail::simulator {

void fault_injector::fail_nth(std::uint64_t n) {
  std::lock_guard lock(mutex_);
  countdown_ = n;
}

void fault_injector::fail_at_random(double probability, std::uint64_t seed) {
  std::lock_guard lock(mutex_);
  probability_ = probability;
  generator_.seed(seed);
}

bool fault_injector::should_fail_allocation() {
  std::lock_guard lock(mutex_);
  bool fail = false;
  if (countdown_ != 0 && --countdown_ == 0) fail = true;
  if (probability_ > 0.0) {
    // Draw even when the nth-failure already decided, so the random sequence
    // depends only on the number of allocations, not on the other mode.
    const bool random_failure = std::bernoulli_distribution(probability_)(generator_);
    fail = fail || random_failure;
  }
  if (fail) injected_.fetch_add(1, std::memory_order_relaxed);
  return fail;
}

bool fault_injector::should_fail_mapping() {
  std::uint64_t n = mapping_countdown_.load(std::memory_order_relaxed);
  while (n != 0) {
    if (mapping_countdown_.compare_exchange_weak(n, n - 1, std::memory_order_relaxed)) {
      if (n != 1) return false;
      injected_.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
  }
  return false;
}

}  // namespace gpumem::detail::simulator
