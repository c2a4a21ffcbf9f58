// vmm_pool_resource: where a stream's pages come from when other streams hold
// free ones (Note [Pages, frugal first]): a busy stream keeps what it freed
// while the device has memory, an idle stream's settled pages go first, any
// stream's free pages move once the budget is reached; and the time budget for
// moves (Note [A time budget for moves]).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "driver/driver.hpp"
#include "gpumem/backend.hpp"
#include "gpumem/sim.hpp"
#include "gpumem/stream.hpp"
#include "gpumem/vmm/virtual_memory.hpp"
#include "gpumem/vmm_pool_resource.hpp"
#include "pool/pool_inspector.hpp"
#include "support/touch.hpp"
#include "support/worker.hpp"
#include "vmm/move_budget.hpp"

namespace gpumem::test {
namespace {

class VmmPoolStreams : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!vmm::supported(0)) GTEST_SKIP() << "no virtual memory management on device 0";
  }
  static vmm_pool_options every_free_fenced() {
    vmm_pool_options o;
    o.fence_interval = 1;
    return o;
  }
  // Writes `value` over [p, p + bytes) on s and reads it back there.
  static void expect_written(void* p, std::size_t bytes, std::uint8_t value, stream& s) {
    device_fill(p, bytes, value, s);
    EXPECT_EQ(device_count_mismatches(p, bytes, value, s), 0U);
  }
  // Lets both streams finish; the pool's invariants hold then.
  static void expect_consistent_after(vmm_pool_resource& pool, stream& a, stream& b) {
    a.synchronize();
    b.synchronize();
    EXPECT_EQ(detail::pool_inspector::violations(pool), "");
  }
};

TEST_F(VmmPoolStreams, ABusyStreamOfAnotherThreadKeepsWhatItFreedWhileTheDeviceHasMemory) {
  vmm_pool_options o;
  o.fence_interval = 1;  // every free fenced while the pool serves several streams
  vmm_pool_resource pool(0, o);
  const std::size_t g = pool.page_bytes();
  stream a(0), b(0);
  worker on_a, on_b;  // each stream driven by a thread of its own
  void* first = on_b.run([&] { return pool.allocate(g, b); });  // b first: a's frees are fenced, and settled once a is synchronised
  void* p = on_a.run([&] {
    void* x = pool.allocate(8 * g, a);
    pool.deallocate(x, 8 * g, a);
    a.synchronize();
    return x;
  });
  const vmm_pool_statistics before = pool.statistics();
  void* q = on_b.run([&] { return pool.allocate(8 * g, b); });
  const vmm_pool_statistics after = pool.statistics();
  EXPECT_EQ(after.pages_created - before.pages_created, 8U) << "b got new pages";
  EXPECT_EQ(after.pages_moved, before.pages_moved) << "a's pages stayed where a will want them";
  // a's next request of the size finds its slot with its pages: no driver call.
  void* again = on_a.run([&] { return pool.allocate(8 * g, a); });
  EXPECT_EQ(again, p);
  const vmm_pool_statistics last = pool.statistics();
  EXPECT_EQ(last.pages_created, after.pages_created);
  EXPECT_EQ(last.pages_moved, after.pages_moved);
  device_fill(q, 8 * g, 0x21, b);
  device_fill(again, 8 * g, 0x22, a);
  EXPECT_EQ(device_count_mismatches(q, 8 * g, 0x21, b), 0U);
  EXPECT_EQ(device_count_mismatches(again, 8 * g, 0x22, a), 0U);
  on_b.run([&] {
    pool.deallocate(q, 8 * g, b);
    pool.deallocate(first, g, b);
  });
  on_a.run([&] { pool.deallocate(again, 8 * g, a); });
  expect_consistent_after(pool, a, b);
}

TEST_F(VmmPoolStreams, AnIdleStreamsSettledPagesGoBeforeNewOnes) {
  vmm_pool_options o;
  o.fence_interval = 1;  // every free fenced while the pool serves several streams
  o.idle_stream_ms = 20;
  vmm_pool_resource pool(0, o);
  const std::size_t g = pool.page_bytes();
  stream a(0), b(0);
  worker on_a, on_b;  // each stream driven by a thread of its own
  void* first = on_b.run([&] { return pool.allocate(g, b); });  // b first: a's frees are then fenced
  on_a.run([&] {
    void* p = pool.allocate(8 * g, a);
    pool.deallocate(p, 8 * g, a);
    a.synchronize();
  });
  // b's next request looks at a, which has just freed (busy), and gets new pages.
  void* second = on_b.run([&] { return pool.allocate(2 * g, b); });
  // a frees nothing for longer than the pool's idle time (idle_stream_ms).
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  const vmm_pool_statistics before = pool.statistics();
  void* q = on_b.run([&] { return pool.allocate(8 * g, b); });
  const vmm_pool_statistics after = pool.statistics();
  EXPECT_EQ(after.pages_created, before.pages_created) << "b took idle a's pages";
  EXPECT_EQ(after.pages_moved - before.pages_moved, 8U);
  EXPECT_EQ(after.mapped_bytes, 11 * g);
  expect_written(q, 8 * g, 0x23, b);
  on_b.run([&] {
    pool.deallocate(q, 8 * g, b);
    pool.deallocate(second, 2 * g, b);
    pool.deallocate(first, g, b);
  });
  b.synchronize();
}

// Note [Streams that take turns]: the streams one thread drives share their
// fenced free pages before the device is asked, and take them back by
// swapping (Note [Swaps across streams]) once the pages are mapped in both.
TEST_F(VmmPoolStreams, StreamsOfOneThreadShareTheirFreePagesAndSwapThemBack) {
  vmm_pool_resource pool(0, every_free_fenced());
  const std::size_t g = pool.page_bytes();
  stream a(0), b(0);
  void* first = pool.allocate(g, b);  // b first: a's frees are fenced
  void* p = pool.allocate(8 * g, a);
  pool.deallocate(p, 8 * g, a);
  const vmm_pool_statistics before = pool.statistics();
  void* q = pool.allocate(8 * g, b);
  const vmm_pool_statistics took = pool.statistics();
  EXPECT_EQ(took.pages_created, before.pages_created) << "b took a's free pages, not the device's";
  EXPECT_EQ(took.pages_moved - before.pages_moved, 8U);
  EXPECT_EQ(took.mapped_bytes, 9 * g);
  device_fill(q, 8 * g, 0x31, b);
  pool.deallocate(q, 8 * g, b);
  // a's slot still has those pages mapped, as aliases: it takes them back by
  // swapping (b's free is fenced; a waits for it on the device), no driver call
  // to map, and the same for b after a frees again.
  void* again = pool.allocate(8 * g, a);
  EXPECT_EQ(again, p);
  expect_written(again, 8 * g, 0x32, a);
  pool.deallocate(again, 8 * g, a);
  void* q2 = pool.allocate(8 * g, b);
  EXPECT_EQ(q2, q);
  const vmm_pool_statistics swapped = pool.statistics();
  EXPECT_EQ(swapped.pages_created, took.pages_created);
  EXPECT_EQ(swapped.pages_moved, took.pages_moved) << "swaps, not moves";
  EXPECT_EQ(swapped.pages_revived - took.pages_revived, 16U);
  EXPECT_EQ(swapped.mapped_bytes, 9 * g);
  expect_written(q2, 8 * g, 0x33, b);
  EXPECT_EQ(detail::pool_inspector::violations(pool), "");
  pool.deallocate(q2, 8 * g, b);
  pool.deallocate(first, g, b);
  expect_consistent_after(pool, a, b);
}

// The swap above, driven from a thread with no current context: a's stream
// waits for b's fence once for the slot (one event, whose latest record covers
// every page), not once a page, and a wait on a created stream makes no
// context current (the driver takes the stream's). The counts are the
// simulator's; on the GPU the test checks that such a wait works.
TEST_F(VmmPoolStreams, TakingBackAnotherStreamsPagesWaitsOnceWithoutAContextSwitch) {
  vmm_pool_resource pool(0, every_free_fenced());
  const std::size_t g = pool.page_bytes();
  stream a(0), b(0);
  const bool counted = current_backend() == backend_kind::sim;
  auto calls = [&](const char* entry_point) { return counted ? sim::driver_calls(entry_point) : 0; };
  void* first = nullptr;
  void* p = nullptr;
  void* again = nullptr;
  std::uint64_t waits = 0, switches = 0;
  std::thread bare([&] {  // drives both streams, so they take turns (Note [Streams that take turns])
    CUcontext current = nullptr;
    ASSERT_EQ(detail::driver().cuCtxGetCurrent(&current), CUDA_SUCCESS);
    ASSERT_EQ(current, nullptr) << "a new thread has no current context";
    first = pool.allocate(g, b);
    p = pool.allocate(8 * g, a);
    pool.deallocate(p, 8 * g, a);
    void* q = pool.allocate(8 * g, b);  // a's pages, moved
    // b still runs when a asks: its fence is not complete, so a must wait on the device.
    held_check hold(q, 8 * g, 0x3C, std::chrono::milliseconds(200), b);
    pool.deallocate(q, 8 * g, b);
    const std::uint64_t waits_before = calls("cuStreamWaitEvent");
    const std::uint64_t switches_before = calls("cuCtxSetCurrent");
    again = pool.allocate(8 * g, a);
    waits = calls("cuStreamWaitEvent") - waits_before;
    switches = calls("cuCtxSetCurrent") - switches_before;
    device_fill(again, 8 * g, 0x52, a);
    EXPECT_EQ(hold.mismatches(), 0U) << "a's work ran after b's, which still used the pages";
  });
  bare.join();
  ASSERT_EQ(again, p) << "a takes its slot back by swapping";
  if (counted) {
    EXPECT_EQ(waits, 1U) << "one wait for b's fence, not one a page";
    EXPECT_EQ(switches, 0U) << "no context made current for a wait on a created stream";
  }
  expect_written(again, 8 * g, 0x52, a);
  EXPECT_EQ(detail::pool_inspector::violations(pool), "");
  pool.deallocate(again, 8 * g, a);
  pool.deallocate(first, g, b);
  expect_consistent_after(pool, a, b);
}

// A slot whose pages went to two other streams of its thread takes them back
// from both arenas in one look, holding one other arena's lock at a time, and
// its stream waits once for each of their fences.
TEST_F(VmmPoolStreams, ASlotTakesBackItsPagesFromTwoOtherStreamsOfItsThread) {
  vmm_pool_resource pool(0, every_free_fenced());
  const std::size_t g = pool.page_bytes();
  stream a(0), b(0), c(0);
  const bool counted = current_backend() == backend_kind::sim;
  void* first = pool.allocate(g, b);  // b and c first: a's frees are fenced
  void* second = pool.allocate(g, c);
  void* p = pool.allocate(8 * g, a);
  pool.deallocate(p, 8 * g, a);
  const vmm_pool_statistics before = pool.statistics();
  void* q = pool.allocate(4 * g, b);  // half of a's pages, moved
  void* r = pool.allocate(4 * g, c);  // the other half
  const vmm_pool_statistics took = pool.statistics();
  ASSERT_EQ(took.pages_created, before.pages_created) << "b and c took a's free pages";
  ASSERT_EQ(took.pages_moved - before.pages_moved, 8U);
  expect_written(q, 4 * g, 0x61, b);
  expect_written(r, 4 * g, 0x62, c);
  pool.deallocate(q, 4 * g, b);
  pool.deallocate(r, 4 * g, c);
  const std::uint64_t waits_before = counted ? sim::driver_calls("cuStreamWaitEvent") : 0;
  void* again = pool.allocate(8 * g, a);
  const std::uint64_t waits = counted ? sim::driver_calls("cuStreamWaitEvent") - waits_before : 0;
  const vmm_pool_statistics swapped = pool.statistics();
  EXPECT_EQ(again, p) << "a takes its slot back by swapping";
  EXPECT_EQ(swapped.pages_created, took.pages_created);
  EXPECT_EQ(swapped.pages_moved, took.pages_moved) << "swaps, not moves";
  EXPECT_EQ(swapped.pages_revived - took.pages_revived, 8U);
  if (counted) {
    EXPECT_EQ(waits, 2U) << "one wait for b's fence and one for c's";
  }
  expect_written(again, 8 * g, 0x63, a);
  EXPECT_EQ(detail::pool_inspector::violations(pool), "");
  pool.deallocate(again, 8 * g, a);
  pool.deallocate(first, g, b);
  pool.deallocate(second, g, c);
  c.synchronize();
  expect_consistent_after(pool, a, b);
}

// A slot that stream a frees for stream b (deallocate on a) is free for a at
// once, before b has absorbed it: a's own stream ordered the free.
TEST_F(VmmPoolStreams, AStreamTakesBackPagesOfASlotItFreedForAnotherStreamOfItsThread) {
  vmm_pool_resource pool(0, every_free_fenced());
  const std::size_t g = pool.page_bytes();
  stream a(0), b(0);
  void* first = pool.allocate(g, b);
  void* p = pool.allocate(8 * g, a);
  pool.deallocate(p, 8 * g, a);
  void* q = pool.allocate(8 * g, b);  // a's pages, moved (as in the test above)
  device_fill(q, 8 * g, 0x41, b);
  b.synchronize();                    // b's use ends before the free on a, as a program must order it
  pool.deallocate(q, 8 * g, a);       // freed on a: pending in b's arena
  const vmm_pool_statistics before = pool.statistics();
  void* again = pool.allocate(8 * g, a);
  const vmm_pool_statistics after = pool.statistics();
  EXPECT_EQ(again, p);
  EXPECT_EQ(after.pages_created, before.pages_created);
  EXPECT_EQ(after.pages_moved, before.pages_moved);
  EXPECT_EQ(after.pages_revived - before.pages_revived, 8U);
  expect_written(again, 8 * g, 0x42, a);
  EXPECT_EQ(detail::pool_inspector::violations(pool), "") << "a pending slot may have given its pages";
  pool.deallocate(again, 8 * g, a);
  // b absorbs its slot (its pages now aliases) and takes them back in turn.
  void* q2 = pool.allocate(8 * g, b);
  EXPECT_EQ(q2, q);
  expect_written(q2, 8 * g, 0x43, b);
  EXPECT_EQ(pool.statistics().pages_moved, after.pages_moved);
  pool.deallocate(q2, 8 * g, b);
  pool.deallocate(first, g, b);
  expect_consistent_after(pool, a, b);
}

// A pending slot that gave its pages away is looked at when its arena absorbs it
// (Note [A slot's ready mark], src/pool/free_slots.hpp). Found by the random
// programs: the absorbed slot kept a ready mark, and the hot path handed it out
// over pages that a live slot of another stream held, so two live allocations
// shared memory. The streams wait between the steps so that every free is
// settled and the program takes the same path each time.
TEST_F(VmmPoolStreams, APendingSlotThatGaveItsPagesAwayIsNotHandedOutOverThem) {
  vmm_pool_resource pool(0);
  const std::size_t g = pool.page_bytes();
  stream a(0), b(0), c(0);
  auto settle = [&] {
    a.synchronize();
    b.synchronize();
    c.synchronize();
  };
  void* small = pool.allocate(2 * g, b);
  void* other = pool.allocate(5 * g, c);
  pool.deallocate(small, 2 * g, a);  // b's slot freed on a: pending in b's arena
  settle();
  void* large = pool.allocate(9 * g, a);  // takes the pending slot's pages (a ordered that free)
  pool.deallocate(large, 9 * g, b);       // a's slot freed on b: pending in a's arena
  settle();
  void* kept = pool.allocate(2 * g, b);  // b's slot again: its pages back from the pending one
  settle();
  pool.deallocate(other, 5 * g, b);
  settle();
  void* block = pool.allocate(g / 3, a, 1024);  // a absorbs its pending slot
  void* reused = pool.allocate(9 * g, a);        // and must not hand it out over kept's pages
  EXPECT_EQ(detail::pool_inspector::violations(pool), "");
  device_fill(kept, 2 * g, 0xAA, b);
  b.synchronize();
  expect_written(reused, 9 * g, 0x55, a);
  a.synchronize();
  EXPECT_EQ(device_count_mismatches(kept, 2 * g, 0xAA, b), 0U) << "the two live slots share memory";
  pool.deallocate(kept, 2 * g, b);
  pool.deallocate(reused, 9 * g, a);
  pool.deallocate(block, g / 3, a, 1024);
  expect_consistent_after(pool, a, b);
}

// Threads that each drive a loader stream and a compute stream, as a data
// pipeline does, at once: each thread's streams pass pages to each other (swaps
// across streams, some under the shared growth mutex with the other arena's
// lock only tried) while the other threads do the same. Every allocation holds
// what was written to it, and every invariant holds at the end.
TEST_F(VmmPoolStreams, ThreadsThatEachDriveALoaderAndAComputeStreamShareSafely) {
  vmm_pool_resource pool(0);
  const std::size_t g = pool.page_bytes();
  constexpr int threads = 4;
  std::vector<std::thread> team;
  for (int t = 0; t < threads; ++t) {
    team.emplace_back([&, t] {
      stream load(0), compute(0);
      std::uint64_t seed = 0xC0FFEEULL + static_cast<std::uint64_t>(t);
      auto next = [&](std::uint64_t n) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        return (seed >> 33) % n;
      };
      for (int step = 0; step < 24; ++step) {
        seed = 0xC0FFEEULL + static_cast<std::uint64_t>(t) + static_cast<std::uint64_t>(step % 4);  // steps repeat
        const std::size_t batch = (2 + next(3)) * g + next(2) * g / 2;
        void* in = pool.allocate(batch, load);
        const auto value = static_cast<std::uint8_t>(step + 16 * t);
        device_fill(in, batch, value, load);
        EXPECT_EQ(device_count_mismatches(in, batch, value, load), 0U) << "thread " << t << " step " << step;
        load.synchronize();  // the compute stream's work on `in` follows the load
        const std::size_t work = (4 + next(4)) * g;
        void* tmp = pool.allocate(work, compute);
        device_fill(tmp, work, static_cast<std::uint8_t>(value + 1), compute);
        EXPECT_EQ(device_count_mismatches(in, batch, value, compute), 0U) << "thread " << t << " step " << step;
        pool.deallocate(in, batch, compute);  // the loader's buffer freed on the compute stream
        EXPECT_EQ(device_count_mismatches(tmp, work, static_cast<std::uint8_t>(value + 1), compute), 0U);
        pool.deallocate(tmp, work, compute);
      }
      compute.synchronize();
      load.synchronize();
    });
  }
  for (std::thread& th : team) th.join();
  EXPECT_EQ(detail::pool_inspector::violations(pool), "");
  EXPECT_GT(pool.statistics().pages_revived, 0U);
}

TEST_F(VmmPoolStreams, AnotherStreamsFreePagesMoveWhenTheBudgetIsReached) {
  vmm_pool_options o;
  o.fence_interval = 1;  // every free fenced: a's frees are settled once a is synchronised
  vmm_pool_resource probe(0);
  const std::size_t g = probe.page_bytes();
  o.maximum_bytes = 8 * g;
  vmm_pool_resource pool(0, o);
  stream a(0), b(0);
  void* p = pool.allocate(8 * g, a);
  pool.deallocate(p, 8 * g, a);
  a.synchronize();
  const vmm_pool_statistics before = pool.statistics();
  void* q = pool.allocate(8 * g, b);
  const vmm_pool_statistics after = pool.statistics();
  EXPECT_EQ(after.pages_created, before.pages_created) << "b took a's free pages";
  EXPECT_EQ(after.pages_moved - before.pages_moved, 8U);
  EXPECT_EQ(after.mapped_bytes, 8 * g);
  expect_written(q, 8 * g, 0x17, b);
  pool.deallocate(q, 8 * g, b);
  b.synchronize();
}

TEST(MoveBudget, MovesOverOnePercentOfTheTimeBuySlackUpToAQuarterOfThePeak) {
  constexpr std::size_t peak = 1600;  // steps of 100
  constexpr std::int64_t ms = 1'000'000;
  // 10 moves of 20 us in 10 ms: 2% of the window.
  std::size_t extra = detail::budgeted_slack(0, peak, 10, 20'000, 10 * ms);
  EXPECT_EQ(extra, 100U);
  extra = detail::budgeted_slack(extra, peak, 10, 20'000, 10 * ms);
  extra = detail::budgeted_slack(extra, peak, 10, 20'000, 10 * ms);
  EXPECT_EQ(extra, 300U) << "1/16 + 3/16 = 1/4 of the peak in all";
  EXPECT_EQ(detail::budgeted_slack(extra, peak, 10, 20'000, 10 * ms), 300U) << "no further";
}

TEST(MoveBudget, CheapMovesLeaveTheSlackAndRareOnesGiveItBack) {
  constexpr std::size_t peak = 1600;
  constexpr std::int64_t ms = 1'000'000;
  // 0.5% of the window: between the bounds, unchanged.
  EXPECT_EQ(detail::budgeted_slack(200, peak, 5, 10'000, 10 * ms), 200U);
  // Exactly 1%: not over it.
  EXPECT_EQ(detail::budgeted_slack(200, peak, 10, 10'000, 10 * ms), 200U);
  // 0.05%: one step back, never below none.
  EXPECT_EQ(detail::budgeted_slack(200, peak, 1, 5'000, 10 * ms), 100U);
  EXPECT_EQ(detail::budgeted_slack(50, peak, 1, 5'000, 10 * ms), 0U);
  EXPECT_EQ(detail::budgeted_slack(0, peak, 0, 5'000, 10 * ms), 0U);
}

}  // namespace
}  // namespace gpumem::test
