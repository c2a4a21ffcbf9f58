// vmm_pool_resource: which pages are busy (Note [Busy pages are the ones no free
// block covers], src/pool/block_operations.cpp). A page's state changes only
// where a carve takes from a free block that covered it whole or where a merge
// makes one; the inspector recomputes every page's state from the blocks, and
// release() gives back exactly the pages that no block which is not free touches.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gpumem/stream.hpp"
#include "gpumem/vmm/virtual_memory.hpp"
#include "gpumem/vmm_pool_resource.hpp"
#include "pool/pool_inspector.hpp"

namespace gpumem::test {
namespace {

class VmmPoolPages : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!vmm::supported(0)) GTEST_SKIP() << "no virtual memory management on device 0";
  }
  static std::uintptr_t at(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }
  // Blocks only: every request is carved from the segments, none is a slot.
  static vmm_pool_options blocks_only() {
    vmm_pool_options o;
    o.slot_min_bytes = SIZE_MAX;
    return o;
  }
  // The inspector finds no page whose state disagrees with the blocks.
  static void check(vmm_pool_resource& pool, const char* step) {
    EXPECT_EQ(detail::pool_inspector::violations(pool), "") << step;
  }
};

TEST_F(VmmPoolPages, APageIsFreeOnceOneFreeBlockCoversItWhole) {
  vmm_pool_resource pool(0, blocks_only());
  const std::size_t g = pool.page_bytes();
  stream s(0);
  // a [0, g/2), b [g/2, 3g/2), c [3g/2, 2g): two pages, each shared by two blocks.
  void* a = pool.allocate(g / 2, s);
  void* b = pool.allocate(g, s);
  void* c = pool.allocate(g / 2, s);
  ASSERT_EQ(at(a) % g, 0U) << "a fresh segment starts on a page";
  ASSERT_EQ(at(b), at(a) + g / 2);
  ASSERT_EQ(at(c), at(b) + g);
  check(pool, "three blocks over two pages");
  EXPECT_EQ(pool.statistics().pages, 2U);

  pool.deallocate(b, g, s);
  check(pool, "the middle block freed");
  EXPECT_EQ(pool.release(), 0U) << "both pages are still touched by a live block";
  check(pool, "after a release that gave nothing back");

  pool.deallocate(a, g / 2, s);
  check(pool, "the first block freed: merged over the first page");
  EXPECT_EQ(pool.release(), g) << "the first page alone is free";
  EXPECT_EQ(pool.statistics().pages, 1U);

  pool.deallocate(c, g / 2, s);
  check(pool, "the last block freed: one free block over both pages");
  EXPECT_EQ(pool.release(), g);
  EXPECT_EQ(pool.statistics().pages, 0U);
  check(pool, "everything given back");
}

TEST_F(VmmPoolPages, ACarveMakesBusyOnlyThePagesItTakesFromAWholeFreeCover) {
  vmm_pool_resource pool(0, blocks_only());
  const std::size_t g = pool.page_bytes();
  stream s(0);
  void* d = pool.allocate(g / 4, s);
  ASSERT_EQ(at(d) % g, 0U);
  // Aligned to the next page: the front [g/4, g) stays free, and only the
  // second page becomes busy.
  void* e = pool.allocate(g / 4, s, g);
  ASSERT_EQ(at(e), at(d) + g);
  check(pool, "a page-aligned block after a misaligned front");
  // A block that spans the front and nothing else keeps the first page busy.
  void* f = pool.allocate(g / 2, s);
  ASSERT_EQ(at(f), at(d) + g / 4);
  check(pool, "the front carved");
  for (void* p : {d, f}) pool.deallocate(p, p == d ? g / 4 : g / 2, s);
  check(pool, "the first page's blocks freed");
  EXPECT_EQ(pool.release(), g) << "the first page is free, the second is e's";
  pool.deallocate(e, g / 4, s);
  check(pool, "all freed");
  EXPECT_EQ(pool.release(), g);
}

TEST_F(VmmPoolPages, RandomCarvesAndMergesKeepEveryPagesStateRight) {
  vmm_pool_resource pool(0, blocks_only());
  const std::size_t g = pool.page_bytes();
  stream s(0);
  struct live_block {
    void* p;
    std::size_t bytes;
    std::size_t alignment;
  };
  std::vector<live_block> live;
  std::mt19937_64 rng(16);
  for (int step = 0; step < 1500; ++step) {
    if (live.empty() || (live.size() < 48 && rng() % 2 == 0)) {
      const std::size_t bytes = 1 + rng() % (3 * g);
      const std::size_t alignment = std::size_t{256} << (rng() % 4 == 0 ? rng() % 14 : 0);
      live.push_back({pool.allocate(bytes, s, alignment), bytes, alignment});
    } else {
      const std::size_t k = rng() % live.size();
      pool.deallocate(live[k].p, live[k].bytes, s, live[k].alignment);
      live[k] = live.back();
      live.pop_back();
    }
    if (step % 100 == 99) pool.release();  // flushes the quick cache: cached blocks merge
    const std::string v = detail::pool_inspector::violations(pool);
    ASSERT_EQ(v, "") << "after step " << step;
  }
  for (const live_block& b : live) pool.deallocate(b.p, b.bytes, s, b.alignment);
  pool.release();
  EXPECT_EQ(detail::pool_inspector::violations(pool), "");
  EXPECT_EQ(pool.statistics().pages, 0U) << "every page came back";
}

}  // namespace
}  // namespace gpumem::test
