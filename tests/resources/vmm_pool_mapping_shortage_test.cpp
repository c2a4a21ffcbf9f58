// vmm_pool_resource when the driver has no memory for a mapping (Note [A mapping
// the driver has no memory for]): cuMemMap or cuMemSetAccess failing with
// out-of-memory is a shortage. The pages the request was given go back where they
// came from, the live blocks keep their data, and the pool serves the next request.
// The failures are the simulator's (gpumem::sim::fail_nth_mapping).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "gpumem/backend.hpp"
#include "gpumem/error.hpp"
#include "gpumem/sim.hpp"
#include "gpumem/stream.hpp"
#include "gpumem/vmm_pool_resource.hpp"
#include "support/touch.hpp"

namespace gpumem::test {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

// A big block written and read back, then freed; false when the pool said out_of_memory.
bool big_block_round_trip(vmm_pool_resource& pool, stream& s, std::size_t bytes) {
  void* big = nullptr;
  try {
    big = pool.allocate(bytes, s);
  } catch (const out_of_memory&) {
    return false;
  }
  device_fill(big, bytes, 0x77, s);
  EXPECT_EQ(device_count_mismatches(big, bytes, 0x77, s), 0U);
  pool.deallocate(big, bytes, s);
  return true;
}

TEST(VmmPoolMappingShortage, MovedAndNewPagesGoBackAndThePoolStaysWhole) {
  if (current_backend() != backend_kind::sim) GTEST_SKIP() << "needs the simulator's fail_nth_mapping";
  // Every failing call in turn: each page's cuMemMap and each run's cuMemSetAccess.
  for (std::uint64_t n = 1; n <= 16; ++n) {
    vmm_pool_resource pool(0);
    stream s(0);
    // Scattered free pages: 16 blocks of two pages, every other one freed.
    std::vector<void*> held;
    for (int i = 0; i < 16; ++i) {
      held.push_back(pool.allocate(4 * MiB, s));
      device_fill(held.back(), 4 * MiB, static_cast<std::uint8_t>(i + 1), s);
    }
    for (int i = 0; i < 16; i += 2) {
      pool.deallocate(held[static_cast<std::size_t>(i)], 4 * MiB, s);
      held[static_cast<std::size_t>(i)] = nullptr;
    }
    s.synchronize();
    // 24 MiB: the 16 MiB of free pages move, the rest is new.
    sim::fail_nth_mapping(n);
    const std::uint64_t failures_before = sim::injected_failures();
    const bool served = big_block_round_trip(pool, s, 24 * MiB);
    const bool injected = sim::injected_failures() > failures_before;
    sim::fail_nth_mapping(0);
    EXPECT_TRUE(served || injected) << "call " << n << ": out_of_memory without a failed mapping";
    for (int i = 1; i < 16; i += 2) {
      EXPECT_EQ(device_count_mismatches(held[static_cast<std::size_t>(i)], 4 * MiB, static_cast<std::uint8_t>(i + 1), s),
                0U)
          << "call " << n << ", block " << i;
    }
    EXPECT_TRUE(big_block_round_trip(pool, s, 24 * MiB)) << "call " << n;
    for (void* p : held) {
      if (p != nullptr) pool.deallocate(p, 4 * MiB, s);
    }
    s.synchronize();
    EXPECT_EQ(pool.statistics().used_bytes, 0U) << "call " << n;
    EXPECT_EQ(pool.statistics().allocations, 0U) << "call " << n;
    EXPECT_TRUE(big_block_round_trip(pool, s, 48 * MiB)) << "call " << n;
  }
}

}  // namespace
}  // namespace gpumem::test
