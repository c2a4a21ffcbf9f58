// The workloads of gpumem-bench, one file each under workloads/ (W1..W9 of
// docs/benchmarks-method.md). A new workload declares its accessor here and is listed in
// registry.cpp.
#pragma once

#include "bench.hpp"

namespace gpumem::bench {

const workload& w1_pair();
const workload& w2_random();
const workload& w3_threads();
const workload& w4_fragmentation();
const workload& w5_replay();
const workload& w6_grow();
const workload& w8_free_sync();
const workload& w9_peer();

}  // namespace gpumem::bench
