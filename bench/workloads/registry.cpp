// The workloads in run order (bench.hpp: all_workloads).
#include "workloads/registry.hpp"

namespace gpumem::bench {

std::span<const workload* const> all_workloads() {
  static const workload* const list[] = {&w1_pair(), &w2_random(), &w3_threads(),
                                         &w4_fragmentation(), &w5_replay(), &w6_grow(),
                                         &w8_free_sync(), &w9_peer()};
  return list;
}

}  // namespace gpumem::bench
