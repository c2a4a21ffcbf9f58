// vmm_pool_resource: slots, the blocks of large requests (Note [Slots for large
// requests]). A loop whose steps vary settles: once its steps repeat, it makes
// no new slot and moves no page, and it holds no more memory for it.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "gpumem/stream.hpp"
#include "gpumem/vmm/virtual_memory.hpp"
#include "gpumem/vmm_pool_resource.hpp"
#include "pool/pool_inspector.hpp"
#include "support/touch.hpp"

namespace gpumem::test {
namespace {

class VmmPoolSlots : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!vmm::supported(0)) GTEST_SKIP() << "no virtual memory management on device 0";
  }
  stream s{0};
};

struct held {
  void* p;
  std::size_t bytes;
};

// One training step whose activations scale with `length` (in pages): the
// forward pass keeps an activation per layer and frees a temporary after the
// next layer's; the backward pass frees the activations in reverse, each after
// a gradient of its size has come and gone. Returns the peak of the live bytes.
std::size_t training_step(vmm_pool_resource& pool, std::size_t g, std::size_t length, stream& s) {
  constexpr std::size_t layers = 6;
  std::vector<held> activations;
  held temporary{nullptr, 0};
  std::size_t live = 0;
  std::size_t peak = 0;
  auto take = [&](std::size_t bytes) {
    held h{pool.allocate(bytes, s), bytes};
    live += bytes;
    peak = std::max(peak, live);
    return h;
  };
  auto give = [&](held h) {
    pool.deallocate(h.p, h.bytes, s);
    live -= h.bytes;
  };
  for (std::size_t layer = 0; layer < layers; ++layer) {
    activations.push_back(take(length * g * (1 + layer % 3)));
    held next = take(length * g / 2 + g);
    if (temporary.p != nullptr) give(temporary);
    temporary = next;
  }
  give(temporary);
  for (std::size_t layer = layers; layer-- > 0;) {
    give(take(activations[layer].bytes));
    give(activations[layer]);
  }
  return peak;
}

// A step of a program whose large requests come in a few sizes and live for
// varied spans, the same at every call (a fixed seed): which free slot of a size
// serves a request matters here, as several of each size are free at once.
std::size_t mixed_step(vmm_pool_resource& pool, std::size_t g, stream& s, std::uint64_t seed = 0x9E3779B97F4A7C15ULL,
                       bool check_memory = false) {
  auto next = [&](std::uint64_t n) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return (seed >> 33) % n;
  };
  constexpr std::size_t pages[] = {2, 3, 4, 6, 8};
  std::vector<held> live_now;
  std::size_t live = 0;
  std::size_t peak = 0;
  for (int op = 0; op < 400; ++op) {
    if (!live_now.empty() && (live_now.size() > 12 || next(3) == 0)) {
      const std::size_t k = next(live_now.size());
      pool.deallocate(live_now[k].p, live_now[k].bytes, s);
      live -= live_now[k].bytes;
      live_now.erase(live_now.begin() + static_cast<std::ptrdiff_t>(k));
    } else {
      const std::size_t bytes = pages[next(5)] * g - next(2) * g / 2;
      live_now.push_back({pool.allocate(bytes, s), bytes});
      if (check_memory && op % 16 == 0) {
        const auto value = static_cast<std::uint8_t>(op);
        device_fill(live_now.back().p, bytes, value, s);
        EXPECT_EQ(device_count_mismatches(live_now.back().p, bytes, value, s), 0U) << "op " << op;
      }
      live += bytes;
      peak = std::max(peak, live);
    }
  }
  for (const held& h : live_now) pool.deallocate(h.p, h.bytes, s);
  return peak;
}

TEST_F(VmmPoolSlots, AProgramThatRepeatsSettles) {
  vmm_pool_resource pool(0);
  const std::size_t g = pool.page_bytes();
  std::size_t peak_live = 0;
  std::vector<vmm_pool_statistics> after;
  for (int cycle = 0; cycle < 6; ++cycle) {
    peak_live = std::max(peak_live, mixed_step(pool, g, s));
    after.push_back(pool.statistics());
  }
  for (std::size_t k = 2; k < after.size(); ++k) {
    EXPECT_EQ(after[k].pages_moved, after[1].pages_moved) << "cycle " << k << " moved pages";
    EXPECT_EQ(after[k].pages_created, after[1].pages_created) << "cycle " << k << " made pages";
  }
  EXPECT_LE(after.back().peak_mapped_bytes, peak_live + peak_live / 8);
  s.synchronize();
}

TEST_F(VmmPoolSlots, ThreadsOfTheirOwnStreamsReuseSlotsAtOnce) {
  // Note [Reusing a slot on the hot path]: slots that need swaps within their
  // arena only are taken under its lock alone, by several threads at once; new
  // slots and moves hold the growth mutex. Every allocation holds what was
  // written to it, and every invariant holds at the end.
  vmm_pool_resource pool(0);
  const std::size_t g = pool.page_bytes();
  constexpr int threads = 4;
  std::vector<std::thread> team;
  for (int t = 0; t < threads; ++t) {
    team.emplace_back([&, t] {
      stream mine(0);
      for (int cycle = 0; cycle < 3; ++cycle) mixed_step(pool, g, mine, 0x51ED + t, cycle == 2);
      mine.synchronize();
    });
  }
  for (std::thread& th : team) th.join();
  EXPECT_EQ(detail::pool_inspector::violations(pool), "");
  EXPECT_GT(pool.statistics().pages_revived, 0U) << "some slots were taken by swapping";
}

TEST_F(VmmPoolSlots, SwapsOnTheHotPathMeetGrowthAndTrimSafely) {
  // Swaps within an arena take no growth mutex (Note [Reusing a slot on the hot
  // path]): threads swap while others grow, move pages between arenas, and a
  // thread trims, reads the statistics and checks every invariant, all at once
  // (TSan runs this). Memory handed out twice would show in the fills.
  vmm_pool_resource pool(0);
  const std::size_t g = pool.page_bytes();
  constexpr int threads = 3;
  std::atomic<bool> done{false};
  std::vector<std::string> seen;
  std::thread checker([&] {
    while (!done.load()) {
      pool.trim();
      (void)pool.statistics();
      if (std::string v = detail::pool_inspector::violations(pool); !v.empty()) seen.push_back(v);
      std::this_thread::sleep_for(std::chrono::microseconds(300));  // a trim now and then, not all the time
    }
  });
  std::vector<std::thread> team;
  for (int t = 0; t < threads; ++t) {
    team.emplace_back([&, t] {
      stream mine(0);
      for (int cycle = 0; cycle < 4; ++cycle) mixed_step(pool, g, mine, 0xC0FFEE + t, true);
      mine.synchronize();
    });
  }
  for (std::thread& th : team) th.join();
  done = true;
  checker.join();
  EXPECT_TRUE(seen.empty()) << seen.front();
  EXPECT_EQ(detail::pool_inspector::violations(pool), "");
  EXPECT_GT(pool.statistics().pages_revived, 0U) << "some slots were taken by swapping";
}

TEST_F(VmmPoolSlots, ASlotWhosePagesSwapBackIsServedWithoutWaiting) {
  // A budget of four pages: the two-page slot is stitched from the free
  // four-page one, which then needs two swaps. They are the hot path's own
  // case (Note [Reusing a slot on the hot path]), so try_allocate_now serves it.
  vmm_pool_options o;
  const std::size_t g = vmm_pool_resource(0).page_bytes();
  o.maximum_bytes = 4 * g;
  vmm_pool_resource pool(0, o);
  void* p = pool.allocate(4 * g, s);
  pool.deallocate(p, 4 * g, s);
  void* q = pool.allocate(2 * g, s);
  pool.deallocate(q, 2 * g, s);
  const vmm_pool_statistics before = pool.statistics();
  EXPECT_EQ(before.pages_created, 4U) << "the two-page slot made no page";
  void* r = pool.try_allocate_now(4 * g, s);
  EXPECT_EQ(r, p);
  EXPECT_EQ(pool.statistics().pages_revived, before.pages_revived + 2);
  EXPECT_EQ(pool.statistics().pages_moved, before.pages_moved) << "swaps only";
  device_fill(r, 4 * g, 0x3C, s);
  EXPECT_EQ(device_count_mismatches(r, 4 * g, 0x3C, s), 0U);
  pool.deallocate(r, 4 * g, s);
  s.synchronize();
  EXPECT_EQ(detail::pool_inspector::violations(pool), "");
}

TEST_F(VmmPoolSlots, ASlotWaitingOnALiveSlotIsPassedWhenThatSlotIsTakenAgain) {
  // Note [A slot's use word across its frees]: y's pages are aliases of handles
  // that x, live, holds, so y waits on x's use word. x freed and taken again over
  // the same pages holds them again, and y's wait holds again: the next request
  // of y's size passes y without a look at its pages and takes y2.
  vmm_pool_resource pool(0);
  const std::size_t g = pool.page_bytes();
  void* x = pool.allocate(2 * g, s);
  pool.deallocate(x, 2 * g, s);
  void* y = pool.allocate(3 * g, s);  // stitched from x's pages
  pool.deallocate(y, 3 * g, s);
  ASSERT_EQ(pool.allocate(2 * g, s), x) << "x takes its pages back from y";
  void* y2 = pool.allocate(3 * g, s);  // y waits on x: a new slot
  ASSERT_NE(y2, y);
  pool.deallocate(y2, 3 * g, s);
  pool.deallocate(x, 2 * g, s);
  ASSERT_EQ(pool.allocate(2 * g, s), x) << "x again, its pages its own";
  const std::size_t looks = detail::pool_inspector::slot_looks(pool);
  void* y3 = pool.allocate(3 * g, s);
  EXPECT_EQ(y3, y2) << "y still waits on x";
  EXPECT_EQ(detail::pool_inspector::slot_looks(pool), looks) << "y was passed without a look at its pages";
  device_fill(y3, 3 * g, 0x5A, s);
  device_fill(x, 2 * g, 0x5B, s);
  EXPECT_EQ(device_count_mismatches(y3, 3 * g, 0x5A, s), 0U);
  EXPECT_EQ(device_count_mismatches(x, 2 * g, 0x5B, s), 0U);
  pool.deallocate(y3, 3 * g, s);
  pool.deallocate(x, 2 * g, s);
  ASSERT_EQ(pool.allocate(3 * g, s), y) << "x free: y is the lowest slot of its size that can be used";
  pool.deallocate(y, 3 * g, s);
  s.synchronize();
  EXPECT_EQ(detail::pool_inspector::violations(pool), "");
}

TEST_F(VmmPoolSlots, ALoopWhoseStepsVarySettles) {
  vmm_pool_resource pool(0);
  const std::size_t g = pool.page_bytes();
  const std::vector<std::size_t> lengths = {3, 5, 4, 7, 2, 6, 5, 3};
  std::size_t peak_live = 0;
  std::vector<vmm_pool_statistics> after;
  for (int cycle = 0; cycle < 6; ++cycle) {
    for (std::size_t n : lengths) peak_live = std::max(peak_live, training_step(pool, g, n, s));
    after.push_back(pool.statistics());
  }
  for (std::size_t k = 2; k < after.size(); ++k) {
    EXPECT_EQ(after[k].pages_moved, after[1].pages_moved) << "cycle " << k << " moved pages";
    EXPECT_EQ(after[k].pages_created, after[1].pages_created) << "cycle " << k << " made pages";
    EXPECT_EQ(after[k].address_bytes, after[1].address_bytes) << "cycle " << k << " made slots";
  }
  EXPECT_LE(after.back().peak_mapped_bytes, peak_live + peak_live / 8)
      << "the pages of requests never live at once are shared";
  EXPECT_GT(after.back().pages_revived, after[1].pages_revived) << "later cycles swap places only";
  // The memory is sound after all that sharing.
  void* p = pool.allocate(7 * g, s);
  void* q = pool.allocate(7 * g + g / 2, s);
  device_fill(p, 7 * g, 0x5A, s);
  device_fill(q, 7 * g + g / 2, 0xA5, s);
  EXPECT_EQ(device_count_mismatches(p, 7 * g, 0x5A, s), 0U);
  EXPECT_EQ(device_count_mismatches(q, 7 * g + g / 2, 0xA5, s), 0U);
  pool.deallocate(q, 7 * g + g / 2, s);
  pool.deallocate(p, 7 * g, s);
  s.synchronize();
}

TEST_F(VmmPoolSlots, ALargeRequestAlignedPastAPageIsABlockAndIsFreedAsOne) {
  // A free of slot_min_bytes or more reads whether the block is a slot (Note [A
  // free tells a slot by its size first]): one aligned past a page is a block,
  // and goes back to the blocks; the slot of the same size to the slots.
  vmm_pool_resource pool(0);
  const std::size_t g = pool.page_bytes();
  void* slot = pool.allocate(3 * g, s);
  void* block = pool.allocate(3 * g, s, 4 * g);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(block) % (4 * g), 0U);
  EXPECT_EQ(detail::pool_inspector::violations(pool), "");
  pool.deallocate(block, 3 * g, s, 4 * g);
  pool.deallocate(slot, 3 * g, s);
  EXPECT_EQ(detail::pool_inspector::violations(pool), "");
  EXPECT_EQ(pool.statistics().used_bytes, 0U);
  // Each is served again from where it went: the slot from the slot cache.
  void* slot_again = pool.allocate(3 * g, s);
  void* block_again = pool.allocate(3 * g, s, 4 * g);
  EXPECT_EQ(slot_again, slot);
  EXPECT_NE(block_again, slot);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(block_again) % (4 * g), 0U);
  device_fill(block_again, 3 * g, 0x5A, s);
  EXPECT_EQ(device_count_mismatches(block_again, 3 * g, 0x5A, s), 0U);
  EXPECT_EQ(detail::pool_inspector::violations(pool), "");
  pool.deallocate(block_again, 3 * g, s, 4 * g);
  pool.deallocate(slot_again, 3 * g, s);
  s.synchronize();
  EXPECT_EQ(detail::pool_inspector::violations(pool), "");
  EXPECT_EQ(pool.statistics().used_bytes, 0U);
}

}  // namespace
}  // namespace gpumem::test
