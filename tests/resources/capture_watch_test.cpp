// The capture watch (include/gpumem/capture_watch.hpp): it counts captures as
// they begin and end (CUPTI on a GPU, the simulated driver on the simulator), and
// the pools that use it refuse a stream under capture without asking the driver
// on every call. Note [The capture watch word] in src/driver/capture_watch_state.hpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>

#include "driver/capture_watch_state.hpp"
#include "driver/driver.hpp"
#include "gpumem/backend.hpp"
#include "gpumem/capture_watch.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/sim.hpp"
#include "gpumem/stream.hpp"
#include "gpumem/vmm_pool_resource.hpp"
#include "support/capture.hpp"

namespace gpumem::test {
namespace {

std::uint64_t word() { return detail::capture_watch_word_now(); }
bool no_capture() { return word() == 0; }

class CaptureWatch : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!watch.active()) {
      // A GPU host without libcupti, or under a profiler: the pools ask the driver.
      GTEST_SKIP() << "the capture watch did not start here: " << watch.reason();
    }
  }
  capture_watch watch;
  cuda_resource upstream{0};
  stream s{0};
};

TEST_F(CaptureWatch, CountsCapturesAsTheyBeginAndEnd) {
  EXPECT_EQ(watch.source(), current_backend() == backend_kind::sim ? "simulator" : "CUPTI");
  EXPECT_TRUE(no_capture());
  stream other(0);
  begin_capture(s);
  EXPECT_EQ(word(), 1U);
  begin_capture(other);
  EXPECT_EQ(word(), 2U);
  end_capture(s);
  EXPECT_EQ(word(), 1U);
  end_capture(other);
  EXPECT_EQ(word(), 0U);
  EXPECT_TRUE(watch.active());
}

TEST_F(CaptureWatch, FailedBeginsAndEndsCountNothing) {
  // The legacy default stream cannot be captured; a stream cannot be captured twice.
  EXPECT_NE(detail::driver().cuStreamBeginCapture(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  EXPECT_EQ(word(), 0U);
  begin_capture(s);
  EXPECT_NE(detail::driver().cuStreamBeginCapture(s.handle(), CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  EXPECT_EQ(word(), 1U);
  end_capture(s);
  EXPECT_EQ(word(), 0U);
  // An end on a stream that is not capturing fails and leaves the count alone.
  CUgraph g = nullptr;
  EXPECT_NE(detail::driver().cuStreamEndCapture(s.handle(), &g), CUDA_SUCCESS);
  EXPECT_EQ(word(), 0U);
  EXPECT_TRUE(watch.active());
}

TEST_F(CaptureWatch, AWatchedPoolGivesAStreamUnderCaptureTheGraphsMemoryAndServesOthers) {
  pool_options o;
  o.watch_captures = true;
  pool_resource pool(upstream, o);
  expect_graph_memory_under_capture(pool, s, 1000);
}

TEST_F(CaptureWatch, AWatchedVmmPoolGivesAStreamUnderCaptureTheGraphsMemory) {
  vmm_pool_options o;
  o.watch_captures = true;
  vmm_pool_resource pool(0, o);
  expect_graph_memory_under_capture(pool, s, 1000);                   // its arenas' blocks
  expect_graph_memory_under_capture(pool, s, std::size_t{8} << 20);  // its slots
}

TEST_F(CaptureWatch, AStreamThatJoinsACaptureGetsTheGraphsMemory) {
  if (current_backend() == backend_kind::sim) GTEST_SKIP() << "the simulator has no cross-stream capture";
  pool_options o;
  o.watch_captures = true;
  pool_resource pool(upstream, o);
  set_current_device(0);  // the events below are made in the device's context
  stream joined(0);
  pool.deallocate(pool.allocate(1000, joined), 1000, joined);  // its arena exists before the capture
  stream other_stream(0);
  void* outside = pool.allocate(1000, other_stream);
  CUevent fork = nullptr;
  CUevent join = nullptr;
  GPUMEM_CU(cuEventCreate, &fork, CU_EVENT_DISABLE_TIMING);
  GPUMEM_CU(cuEventCreate, &join, CU_EVENT_DISABLE_TIMING);
  begin_capture(s);
  GPUMEM_CU(cuEventRecord, fork, s.handle());
  GPUMEM_CU(cuStreamWaitEvent, joined.handle(), fork, 0);  // `joined` is now part of the capture
  EXPECT_EQ(word(), 1U);
  void* in_graph = pool.allocate(1000, joined);
  EXPECT_EQ(pool.statistics().allocations, 1U) << "the graph's memory, not the pool's";
  pool.deallocate(in_graph, 1000, joined);  // a free node
  EXPECT_THROW(pool.deallocate(outside, 1000, joined), logic_error);
  GPUMEM_CU(cuEventRecord, join, joined.handle());
  GPUMEM_CU(cuStreamWaitEvent, s.handle(), join, 0);
  end_capture(s);
  EXPECT_EQ(word(), 0U);
  void* after = pool.allocate(1000, joined);
  pool.deallocate(after, 1000, joined);
  EXPECT_EQ(pool.statistics().allocations, 1U) << "the block whose free was refused";
  pool.deallocate(outside, 1000, other_stream);
  joined.synchronize();
  other_stream.synchronize();
  EXPECT_EQ(pool.statistics().allocations, 0U);
  GPUMEM_CU(cuEventDestroy, fork);
  GPUMEM_CU(cuEventDestroy, join);
}

TEST(CaptureWatchStart, ACaptureBegunBeforeTheWatchIsFoundAndThePoolsAskTheDriver) {
  cuda_resource upstream(0);
  stream s(0);
  begin_capture(s);
  {
    capture_watch watch;
    if (watch.source().empty()) {
      end_capture(s);
      GTEST_SKIP() << "the capture watch did not start here: " << watch.reason();
    }
    EXPECT_TRUE(no_capture()) << "a capture begun before the watch is not counted";
    pool_options o;
    o.watch_captures = true;
    pool_resource pool(upstream, o);
    // The pool's first use of `s` finds it capturing: the watch is distrusted and
    // the pool asks the driver, so the capture gets the graph's memory all the same.
    testing::internal::CaptureStderr();
    pool.deallocate(pool.allocate(1000, s), 1000, s);
    EXPECT_EQ(pool.statistics().allocations, 0U);
    const std::string said = testing::internal::GetCapturedStderr();
    EXPECT_NE(said.find("began before the capture watch started"), std::string::npos) << said;
    EXPECT_FALSE(watch.active());
    end_capture(s);  // an end the watch never saw begin keeps it distrusted
    EXPECT_FALSE(no_capture());
    begin_capture(s);
    void* known_stream = pool.allocate(1000, s);  // its arena exists now: asked all the same
    EXPECT_EQ(pool.statistics().allocations, 0U) << "the graph's memory, not the pool's";
    pool.deallocate(known_stream, 1000, s);
    end_capture(s);
    pool.deallocate(pool.allocate(1000, s), 1000, s);
    s.synchronize();
  }
  // A new watch starts afresh.
  capture_watch again;
  EXPECT_TRUE(again.active());
  EXPECT_TRUE(no_capture());
}

TEST(CaptureWatchStart, TheLastHolderStopsTheWatch) {
  EXPECT_FALSE(no_capture()) << "no watch is held between tests";
  {
    capture_watch first;
    if (first.source().empty()) GTEST_SKIP() << "the capture watch did not start here: " << first.reason();
    {
      capture_watch second;
      EXPECT_TRUE(second.active());
      EXPECT_EQ(second.source(), first.source());
    }
    EXPECT_TRUE(first.active()) << "the first holder still holds it";
  }
  EXPECT_FALSE(no_capture());
  // Without a watch, a pool that does not ask for one asks the driver.
  stream s(0);
  cuda_resource upstream(0);
  pool_resource pool(upstream);
  pool.deallocate(pool.allocate(1000, s), 1000, s);
  begin_capture(s);
  void* in_graph = pool.allocate(1000, s);
  EXPECT_EQ(pool.statistics().allocations, 0U) << "the graph's memory, not the pool's: the pool asked";
  pool.deallocate(in_graph, 1000, s);
  end_capture(s);
}

// A pool that asked for the watch where it cannot start (a profiler holds CUPTI:
// simulated) says so once, and finds a capture all the same, by asking the driver.
TEST(CaptureWatchStart, APoolWhoseWatchCannotStartSaysWhyAndAsksTheDriver) {
  if (current_backend() != backend_kind::sim) GTEST_SKIP() << "the simulator stands in for a profiler holding CUPTI";
  EXPECT_FALSE(no_capture()) << "no watch is held between tests";
  sim::set_capture_watch_available(false);
  struct available_again {
    ~available_again() { sim::set_capture_watch_available(true); }
  } restore;
  cuda_resource upstream(0);
  stream s(0);
  for (bool paged : {false, true}) {
    testing::internal::CaptureStderr();
    std::unique_ptr<memory_resource> pool;
    if (paged) {
      vmm_pool_options o;
      o.watch_captures = true;
      pool = std::make_unique<vmm_pool_resource>(0, o);
    } else {
      pool_options o;
      o.watch_captures = true;
      pool = std::make_unique<pool_resource>(upstream, o);
    }
    const std::string said = testing::internal::GetCapturedStderr();
    EXPECT_NE(said.find(paged ? "vmm_pool_resource on device 0: watch_captures was asked for, but the capture watch "
                                "did not start (CUPTI has another subscriber"
                              : "pool_resource on device 0: watch_captures was asked for"),
              std::string::npos)
        << said;
    EXPECT_NE(said.find("asks the driver"), std::string::npos) << said;
    EXPECT_FALSE(no_capture()) << "no watch started";
    pool->deallocate(pool->allocate(1000, s), 1000, s);
    begin_capture(s);
    const std::uint64_t graph_allocations = sim::driver_calls("cuMemAllocAsync");
    pool->deallocate(pool->allocate(1000, s), 1000, s);
    EXPECT_EQ(sim::driver_calls("cuMemAllocAsync"), graph_allocations + 1) << "the graph's memory";
    end_capture(s);
    s.synchronize();
  }
  sim::set_capture_watch_available(true);
  capture_watch again;
  EXPECT_TRUE(again.active()) << "available again: the next watch starts";
}

}  // namespace
}  // namespace gpumem::test
