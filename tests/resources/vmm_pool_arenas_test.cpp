// vmm_pool_resource's arenas (docs/vmm.md, "Arenas"): small requests served by
// per-stream arenas over ranges the pool lends them; wrong frees across the
// two allocators refused without harm; the arenas' free ranges going back for
// a large request that needs their memory, and on trim and release.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/vmm/virtual_memory.hpp"
#include "gpumem/vmm_pool_resource.hpp"
#include "support/touch.hpp"

namespace gpumem::test {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

class VmmPoolArenas : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!vmm::supported(0)) GTEST_SKIP() << "no virtual memory management on device 0";
  }
  stream s{0};
};

TEST_F(VmmPoolArenas, SmallRequestsShareALentRange) {
  vmm_pool_resource pool(0);
  const std::size_t g = vmm::granularity(0);
  void* p = pool.allocate(1000, s);
  void* q = pool.allocate(3000, s);
  vmm_pool_statistics st = pool.statistics();
  EXPECT_EQ(st.allocations, 2U);
  EXPECT_EQ(st.used_bytes, 1024U + 3072U);
  EXPECT_EQ(st.handles, 1U) << "both in the one range lent to s's arena";
  EXPECT_EQ(st.mapped_bytes, g);
  for (void* x : {p, q}) {
    const auto pieces = pool.physical_pieces(x, 1000);
    ASSERT_EQ(pieces.size(), 1U);
    EXPECT_LE(pieces[0].address, reinterpret_cast<std::uintptr_t>(x));
    EXPECT_GE(pieces[0].address + pieces[0].bytes, reinterpret_cast<std::uintptr_t>(x) + 1000);
  }
  device_fill(p, 1000, 0x5A, s);
  device_fill(q, 3000, 0xA5, s);
  EXPECT_EQ(device_count_mismatches(p, 1000, 0x5A, s), 0U);
  EXPECT_EQ(device_count_mismatches(q, 3000, 0xA5, s), 0U);

  // Wrong sizes, on either side of arena_max_bytes, and double frees are refused
  // and change nothing.
  EXPECT_THROW(pool.deallocate(p, 999, s), logic_error);
  EXPECT_THROW(pool.deallocate(p, 64 * MiB, s), logic_error);
  EXPECT_EQ(pool.statistics().allocations, 2U);
  pool.deallocate(p, 1000, s);
  EXPECT_THROW(pool.deallocate(p, 1000, s), logic_error);
  EXPECT_THROW((void)pool.physical_pieces(p, 1000), logic_error) << "freed: not exportable";
  pool.deallocate(q, 3000, s);
  st = pool.statistics();
  EXPECT_EQ(st.allocations, 0U);
  EXPECT_EQ(st.used_bytes, 0U);

  // A block of the address-wide allocator freed with a small size.
  void* big = pool.allocate(8 * MiB, s);
  EXPECT_THROW(pool.deallocate(big, 1000, s), logic_error);
  EXPECT_EQ(pool.statistics().allocations, 1U);
  pool.deallocate(big, 8 * MiB, s);
  pool.release();
  EXPECT_EQ(pool.statistics().mapped_bytes, 0U) << "release() gives back the lent range too";
}

TEST_F(VmmPoolArenas, ALargeRequestTakesBackTheArenasFreeRanges) {
  vmm_pool_resource pool(0);
  const std::size_t available = device_memory_info(0).free_bytes;
  constexpr std::size_t block = 4 * MiB;  // arena_max_bytes: every block in an arena
  std::vector<void*> held;
  while ((held.size() + 1) * block <= available / 100 * 85) held.push_back(pool.allocate(block, s));
  for (void* p : held) pool.deallocate(p, block, s);  // not synchronised: the frees may be in flight
  const std::size_t want = available / 100 * 80 / MiB * MiB;
  void* big = pool.allocate(want, s);
  // Both ends and the middle are mapped and usable (all of it would be gigabytes
  // of host writes on the simulator, too many under ThreadSanitizer's shadow).
  auto* bytes = static_cast<char*>(big);
  for (std::size_t at : {std::size_t{0}, want / 2, want - 64 * MiB}) {
    device_fill(bytes + at, 64 * MiB, 0x3C, s);
    EXPECT_EQ(device_count_mismatches(bytes + at, 64 * MiB, 0x3C, s), 0U) << "at " << at;
  }
  EXPECT_EQ(pool.statistics().allocations, 1U);
  pool.deallocate(big, want, s);
  s.synchronize();
}

TEST_F(VmmPoolArenas, TrimGivesTheirFreeRangesBackOnceTheFreesComplete) {
  vmm_pool_resource pool(0);
  void* p = pool.allocate(MiB, s);
  device_fill(p, MiB, 0x11, s);
  pool.deallocate(p, MiB, s);
  s.synchronize();
  EXPECT_GT(pool.statistics().mapped_bytes, 0U);
  // trim(s) fences s's arena and hands the range back ordered after that fence;
  // trim never waits, so the memory goes back at a trim that finds it complete.
  pool.trim(s);
  for (int i = 0; i < 200 && pool.statistics().mapped_bytes != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    pool.trim();
  }
  EXPECT_EQ(pool.statistics().mapped_bytes, 0U);
}

TEST_F(VmmPoolArenas, AStreamsFreedBlockWaitsForItsWorkBeforeAnotherStreamWritesIt) {
  vmm_pool_resource pool(0);
  stream other(0);
  void* p = pool.allocate(MiB, s);
  held_check check(p, MiB, 0xA5, std::chrono::milliseconds(300), s);
  pool.deallocate(p, MiB, s);
  std::vector<void*> got;
  for (int i = 0; i < 64; ++i) {
    void* q = pool.allocate(MiB, other);
    device_fill(q, MiB, 0x22, other);
    got.push_back(q);
  }
  EXPECT_EQ(check.mismatches(), 0U) << "another stream wrote a block before its free on s completed";
  other.synchronize();
  for (void* q : got) pool.deallocate(q, MiB, other);
}

}  // namespace
}  // namespace gpumem::test
