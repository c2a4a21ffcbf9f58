// W2's op sequence and its replay, shared by W2 and W3 (random_ops.hpp).
#include "workloads/random_ops.hpp"

#include <random>

namespace gpumem::bench {

// Drawn with plain arithmetic on mt19937_64 rather than std::*_distribution,
// whose output differs between standard libraries, so that every build agrees.
std::vector<random_op> make_random_ops(std::size_t count, std::size_t max_bytes,
                                       std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<random_op> ops;
  ops.reserve(count);
  std::size_t live = 0;
  for (std::size_t k = 0; k < count; ++k) {
    const bool allocate = live == 0 || (live < random_max_live && (rng() >> 63) == 0);
    if (allocate) {
      ops.push_back({static_cast<std::uint32_t>(1 + rng() % max_bytes), 0});
      ++live;
    } else {
      ops.push_back({0, static_cast<std::uint32_t>(rng() % live)});
      --live;
    }
  }
  return ops;
}

void replay_random_ops(memory_resource& mr, stream_view st, std::span<const random_op> ops,
                       live_allocations& live) {
  try {
    for (const random_op& o : ops) {
      if (o.bytes != 0) {
        live.emplace_back(mr.allocate(o.bytes, st), o.bytes);
      } else {
        mr.deallocate(live[o.index].first, live[o.index].second, st);
        live[o.index] = live.back();
        live.pop_back();
      }
    }
    while (!live.empty()) {
      mr.deallocate(live.back().first, live.back().second, st);
      live.pop_back();
    }
    st.synchronize();
  } catch (...) {
    // Leave the resource empty before it is destroyed; the first error is the one reported.
    while (!live.empty()) {
      const auto [p, bytes] = live.back();
      live.pop_back();
      try {
        mr.deallocate(p, bytes, st);
      } catch (...) {
      }
    }
    throw;
  }
}

}  // namespace gpumem::bench
