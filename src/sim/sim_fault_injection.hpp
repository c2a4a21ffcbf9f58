// Fault injection for device allocations: fail the nth allocation, or each one
// with a probability from a seeded generator; and the nth mapping (gpumem::sim controls and
// GPUMEM_SIM_FAIL_ALLOC / GPUMEM_SIM_FAIL_RANDOM / GPUMEM_SIM_SEED).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <random>

namespace gpumem::detail::simulator {

class fault_injector {
 public:
  // The nth allocation from now on (1 = the next) fails; 0 turns it off.
  void fail_nth(std::uint64_t n);
  // Each allocation fails with `probability`, drawn from a generator seeded
  // with `seed`, so a run with the same seed fails the same allocations.
  void fail_at_random(double probability, std::uint64_t seed);
  // Called once per allocation attempt that passed argument checks: true means
  // "report out of memory". Counts the failures it decides.
  bool should_fail_allocation();
  std::uint64_t injected_failures() const { return injected_.load(std::memory_order_relaxed); }

  // The nth cuMemMap or cuMemSetAccess from now on fails with out-of-memory (the
  // driver's own memory for a mapping, on a full device); 0 turns it off.
  void fail_nth_mapping(std::uint64_t n) { mapping_countdown_.store(n, std::memory_order_relaxed); }
  bool should_fail_mapping();

 private:
  std::mutex mutex_;
  std::uint64_t countdown_ = 0;  // allocations until the nth one; 0 = off
  double probability_ = 0.0;
  std::mt19937_64 generator_{1};
  std::atomic<std::uint64_t> injected_{0};
  std::atomic<std::uint64_t> mapping_countdown_{0};
};

}  // namespace gpumem::detail::simulator
