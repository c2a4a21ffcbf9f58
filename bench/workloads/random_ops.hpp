// The random allocate/free sequence of W2, shared with W3 (each of whose
// threads runs W2's max 4 MiB variant with its own seed): up to 1000 live
// allocations; each op allocates (p = 1/2, while fewer than 1000 are live) or
// frees a uniformly random live one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "gpumem/memory_resource.hpp"

namespace gpumem::bench {

inline constexpr std::size_t random_max_live = 1000;

// bytes > 0: allocate that many. bytes == 0: free live allocation number `index`
// (the live set is a vector; a free moves the last entry into the hole).
struct random_op {
  std::uint32_t bytes;
  std::uint32_t index;
};

// `count` ops with sizes uniform in [1, max_bytes], computed before any timing
// from std::mt19937_64 seeded with `seed`: the same sequence for every row.
std::vector<random_op> make_random_ops(std::size_t count, std::size_t max_bytes,
                                       std::uint64_t seed);

// What the live set holds: pointer and size, as deallocate wants them.
using live_allocations = std::vector<std::pair<void*, std::size_t>>;

// Runs `ops` on `mr` and `st`, frees everything still live and synchronizes
// `st`: one timed repetition. `live` is scratch space, reserved by the caller
// (random_max_live) so that no repetition grows it; it is empty again on return,
// also when a call throws (the first error propagates, the rest is freed).
void replay_random_ops(memory_resource& mr, stream_view st, std::span<const random_op> ops,
                       live_allocations& live);

}  // namespace gpumem::bench
