// pool_resource beyond the shared contract: coalescing, statistics, growth and
// release, limits, cross-stream reuse and its ordering, frees on another stream,
// upstream failures. Threads, fences between streams and capture:
// pool_threads_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <latch>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "driver/driver.hpp"
#include "gpumem/backend.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/sim.hpp"
#include "sim/sim_event.hpp"
#include "resources/pool_fixture.hpp"
#include "support/capture.hpp"
#include "support/touch.hpp"

namespace gpumem::test {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

TEST_F(Pool, FreedNeighboursCoalesceIntoOneBlock) {
  pool_options o;
  o.min_chunk_bytes = 4 * MiB;
  o.max_chunk_bytes = 4 * MiB;
  pool_resource pool(upstream, o);
  std::vector<void*> blocks;
  for (int i = 0; i < 16; ++i) blocks.push_back(pool.allocate(256 << 10, s));  // 16 x 256 KiB = one chunk
  EXPECT_EQ(pool.statistics().chunks, 1U);
  // Free in an order that needs merging on both sides.
  for (int i = 0; i < 16; i += 2) pool.deallocate(blocks[i], 256 << 10, s);
  EXPECT_EQ(pool.statistics().free_blocks, 8U);
  for (int i = 1; i < 16; i += 2) pool.deallocate(blocks[i], 256 << 10, s);
  const pool_statistics st = pool.statistics();
  EXPECT_EQ(st.free_blocks, 1U);
  EXPECT_EQ(st.largest_free_block, 4 * MiB);
  EXPECT_EQ(st.used_bytes, 0U);
  EXPECT_EQ(st.free_bytes, st.reserved_bytes);
}

TEST_F(Pool, StatisticsAreExact) {
  pool_resource pool(upstream);
  void* a = pool.allocate(1, s);
  void* b = pool.allocate(300, s);
  void* c = pool.allocate(MiB, s);
  pool_statistics st = pool.statistics();
  EXPECT_EQ(st.used_bytes, 256U + 512U + MiB);
  EXPECT_EQ(st.allocations, 3U);
  EXPECT_EQ(st.reserved_bytes, upstream.allocated_bytes());
  EXPECT_EQ(st.used_bytes + st.free_bytes, st.reserved_bytes);
  EXPECT_EQ(st.streams, 1U);
  pool.deallocate(b, 300, s);
  pool.deallocate(a, 1, s);
  pool.deallocate(c, MiB, s);
  st = pool.statistics();
  EXPECT_EQ(st.used_bytes, 0U);
  EXPECT_EQ(st.allocations, 0U);
}

TEST_F(Pool, SmallRequestsShareOneChunkAndReuseMemory) {
  pool_resource pool(upstream);
  void* first = pool.allocate(1000, s);
  pool.deallocate(first, 1000, s);
  void* again = pool.allocate(1000, s);
  EXPECT_EQ(first, again) << "a block freed on a stream is reused on that stream at once";
  pool.deallocate(again, 1000, s);
  EXPECT_EQ(upstream.allocation_count(), 1U);
}

TEST_F(Pool, GrowsByDoublingAndReleasesFreeChunks) {
  pool_resource pool(upstream);
  std::vector<void*> held;
  for (int i = 0; i < 8; ++i) held.push_back(pool.allocate(2 * MiB, s));
  const pool_statistics grown = pool.statistics();
  EXPECT_GE(grown.reserved_bytes, 16 * MiB);
  EXPECT_LT(grown.chunks, 8U) << "chunks grow with the pool, not one per request";
  for (void* p : held) pool.deallocate(p, 2 * MiB, s);
  s.synchronize();
  const std::size_t released = pool.release();
  EXPECT_EQ(released, grown.reserved_bytes);
  EXPECT_EQ(pool.statistics().reserved_bytes, 0U);
  EXPECT_EQ(upstream.allocated_bytes(), 0U) << "every chunk went back upstream";
  void* p = pool.allocate(MiB, s);  // and the pool still works
  pool.deallocate(p, MiB, s);
}

TEST_F(Pool, PeakReservedOutlivesAReleaseUntilReset) {
  pool_resource pool(upstream);
  EXPECT_EQ(pool.statistics().peak_reserved_bytes, 0U);
  std::vector<void*> held;
  for (int i = 0; i < 8; ++i) held.push_back(pool.allocate(2 * MiB, s));
  const std::size_t grown = pool.statistics().reserved_bytes;
  EXPECT_EQ(pool.statistics().peak_reserved_bytes, grown);
  for (void* p : held) pool.deallocate(p, 2 * MiB, s);
  s.synchronize();
  pool.release();
  EXPECT_EQ(pool.statistics().reserved_bytes, 0U);
  EXPECT_EQ(pool.statistics().peak_reserved_bytes, grown) << "the peak stays after the memory went back";
  pool.reset_peak();
  EXPECT_EQ(pool.statistics().peak_reserved_bytes, 0U) << "reset: the peak is what is held now";
  void* p = pool.allocate(MiB, s);
  EXPECT_EQ(pool.statistics().peak_reserved_bytes, pool.statistics().reserved_bytes);
  pool.deallocate(p, MiB, s);
}

TEST_F(Pool, ReleaseKeepsChunksThatStillHoldAllocations) {
  pool_options o;
  o.min_chunk_bytes = o.max_chunk_bytes = 2 * MiB;
  pool_resource pool(upstream, o);
  void* a = pool.allocate(2 * MiB, s);
  void* b = pool.allocate(MiB, s);
  pool.deallocate(a, 2 * MiB, s);
  s.synchronize();
  EXPECT_EQ(pool.release(), 2 * MiB);
  EXPECT_EQ(pool.statistics().reserved_bytes, 2 * MiB);
  device_fill(b, MiB, 0x7E, s);
  EXPECT_EQ(device_count_mismatches(b, MiB, 0x7E, s), 0U);
  pool.deallocate(b, MiB, s);
}

TEST_F(Pool, TrimGivesBackFencedChunksWithoutWaiting) {
  pool_options o;
  o.min_chunk_bytes = o.max_chunk_bytes = 2 * MiB;
  o.fence_interval = 2;
  pool_resource pool(upstream, o);
  stream other(0);  // a second stream: fences matter now
  void* c = pool.allocate(256, other);
  void* a = pool.allocate(2 * MiB, s);
  void* b = pool.allocate(2 * MiB, s);
  pool.deallocate(a, 2 * MiB, s);
  EXPECT_EQ(pool.trim(), 0U) << "a's free is not fenced yet: trim must not take it";
  pool.deallocate(b, 2 * MiB, s);  // the second free records the fence
  EXPECT_EQ(pool.trim(), 4 * MiB);
  pool.deallocate(c, 256, other);
  EXPECT_EQ(pool.trim(other), 2 * MiB) << "trim(stream) fences that stream's frees first";
  s.synchronize();
  other.synchronize();
  EXPECT_EQ(upstream.allocated_bytes(), 0U);
}

TEST_F(Pool, ASingleStreamNeverFencesButTrimOnItsStreamWorks) {
  pool_options o;
  o.min_chunk_bytes = o.max_chunk_bytes = 2 * MiB;
  o.fence_interval = 1;
  pool_resource pool(upstream, o);
  void* a = pool.allocate(2 * MiB, s);
  pool.deallocate(a, 2 * MiB, s);
  EXPECT_EQ(pool.trim(), 0U) << "one stream: no fence was needed, so none was recorded";
  EXPECT_EQ(pool.trim(s), 2 * MiB);
}

TEST_F(Pool, InitialBytesAreReservedUpFront) {
  pool_options o;
  o.initial_bytes = 8 * MiB;
  pool_resource pool(upstream, o);
  EXPECT_EQ(pool.statistics().reserved_bytes, 8 * MiB);
  void* p = pool.allocate(4 * MiB, s);  // served from the initial chunk: no growth
  EXPECT_EQ(upstream.allocation_count(), 1U);
  pool.deallocate(p, 4 * MiB, s);
}

TEST_F(Pool, MaximumBytesIsAHardLimitWithAClearError) {
  pool_options o;
  o.maximum_bytes = 8 * MiB;
  o.min_chunk_bytes = o.max_chunk_bytes = 2 * MiB;
  pool_resource pool(upstream, o);
  std::vector<void*> held;
  for (int i = 0; i < 4; ++i) held.push_back(pool.allocate(2 * MiB, s));
  try {
    pool.allocate(MiB, s);
    ADD_FAILURE() << "allocated past maximum_bytes";
  } catch (const out_of_memory& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.requested_bytes(), MiB);
    EXPECT_NE(what.find("pool_resource"), std::string::npos) << what;
    EXPECT_NE(what.find("maximum_bytes 8388608"), std::string::npos) << what;
    EXPECT_NE(what.find("largest free block"), std::string::npos) << what;
  }
  EXPECT_LE(pool.statistics().reserved_bytes, 8 * MiB);
  pool.deallocate(held.back(), 2 * MiB, s);
  held.pop_back();
  void* p = pool.allocate(MiB, s);  // room again
  pool.deallocate(p, MiB, s);
  for (void* q : held) pool.deallocate(q, 2 * MiB, s);
}

TEST_F(Pool, FragmentationIsNamedInTheError) {
  pool_options o;
  o.maximum_bytes = 8 * MiB;
  o.min_chunk_bytes = o.max_chunk_bytes = 8 * MiB;
  pool_resource pool(upstream, o);
  std::vector<void*> held;
  for (int i = 0; i < 8; ++i) held.push_back(pool.allocate(MiB, s));
  for (int i = 0; i < 8; i += 2) pool.deallocate(held[i], MiB, s);  // 4 MiB free, in 1 MiB holes
  try {
    pool.allocate(2 * MiB, s);
    ADD_FAILURE() << "a 2 MiB block cannot exist";
  } catch (const out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find("fragmentation"), std::string::npos) << e.what();
  }
  for (int i = 1; i < 8; i += 2) pool.deallocate(held[i], MiB, s);
}

TEST_F(Pool, BadOptionsAreLogicErrors) {
  pool_options o;
  o.fence_interval = 0;
  EXPECT_THROW(pool_resource(upstream, o), logic_error);
  o = {};
  o.min_chunk_bytes = 8 * MiB;
  o.max_chunk_bytes = 4 * MiB;
  EXPECT_THROW(pool_resource(upstream, o), logic_error);
  o = {};
  o.initial_bytes = 4 * MiB;
  o.maximum_bytes = 2 * MiB;
  EXPECT_THROW(pool_resource(upstream, o), logic_error);
  EXPECT_THROW(pool_resource(std::shared_ptr<memory_resource>{}), logic_error);
}

TEST_F(Pool, AnotherStreamReusesFreedMemoryOnlyAfterTheFreeingWork) {
  // The first stream's arena owns all the memory there is; the second stream must
  // take it, and the pool must order that after the first stream's work.
  pool_options o;
  o.maximum_bytes = 4 * MiB;
  o.min_chunk_bytes = o.max_chunk_bytes = 4 * MiB;
  o.fence_interval = 1;
  pool_resource pool(upstream, o);
  stream a(0);
  stream b(0);
  void* p = pool.allocate(4 * MiB, a);
  held_check check(p, 4 * MiB, 0xA5, std::chrono::milliseconds(200), a);
  pool.deallocate(p, 4 * MiB, a);
  void* q = pool.allocate(4 * MiB, b);  // only possible by reusing p's memory
  EXPECT_EQ(q, p);
  device_fill(q, 4 * MiB, 0x5A, b);
  EXPECT_EQ(check.mismatches(), 0U) << "b overwrote the block while a still used it";
  EXPECT_EQ(device_count_mismatches(q, 4 * MiB, 0x5A, b), 0U);
  pool.deallocate(q, 4 * MiB, b);
}

TEST_F(Pool, FreeOnAnotherStreamIsOrderedBeforeReuse) {
  // Allocated on a, used and freed on b: a may reuse the block only after b's work.
  pool_options o;
  o.maximum_bytes = 2 * MiB;
  o.min_chunk_bytes = o.max_chunk_bytes = 2 * MiB;
  pool_resource pool(upstream, o);
  stream a(0);
  stream b(0);
  void* p = pool.allocate(2 * MiB, a);
  a.synchronize();
  held_check check(p, 2 * MiB, 0xB7, std::chrono::milliseconds(200), b);
  pool.deallocate(p, 2 * MiB, b);
  EXPECT_EQ(pool.statistics().used_bytes, 0U);
  void* q = pool.allocate(2 * MiB, a);
  EXPECT_EQ(q, p);
  device_fill(q, 2 * MiB, 0x11, a);
  EXPECT_EQ(check.mismatches(), 0U) << "a reused the block before b's work on it was done";
  pool.deallocate(q, 2 * MiB, a);
}

TEST_F(Pool, UnfencedFreesAreNotTakenByOtherStreamsUntilMemoryIsShort) {
  pool_options o;
  o.fence_interval = 1000;  // no fence from the free itself
  o.min_chunk_bytes = o.max_chunk_bytes = 2 * MiB;
  pool_resource pool(upstream, o);
  stream a(0);
  stream b(0);
  void* p = pool.allocate(2 * MiB, a);
  held_check check(p, 2 * MiB, 0xC3, std::chrono::milliseconds(200), a);
  pool.deallocate(p, 2 * MiB, a);
  void* q = pool.allocate(2 * MiB, b);  // must grow: p is not fenced yet
  EXPECT_NE(q, p);
  EXPECT_EQ(pool.statistics().chunks, 2U);
  device_fill(q, 2 * MiB, 0x3C, b);
  EXPECT_EQ(check.mismatches(), 0U);
  pool.deallocate(q, 2 * MiB, b);
}

TEST_F(Pool, WhenTheUpstreamIsFullFreeMemoryOfAnyStreamIsReclaimed) {
  // Unfenced frees on a dead-quiet stream still come back when memory runs out:
  // the pool synchronizes the device once and takes them.
  pool_options o;
  o.fence_interval = 1000;
  o.maximum_bytes = 4 * MiB;
  o.min_chunk_bytes = o.max_chunk_bytes = 2 * MiB;
  pool_resource pool(upstream, o);
  stream a(0);
  stream b(0);
  void* p1 = pool.allocate(2 * MiB, a);
  void* p2 = pool.allocate(2 * MiB, a);
  pool.deallocate(p1, 2 * MiB, a);
  pool.deallocate(p2, 2 * MiB, a);
  void* q1 = pool.allocate(2 * MiB, b);
  void* q2 = pool.allocate(2 * MiB, b);
  EXPECT_EQ(pool.statistics().reserved_bytes, 4 * MiB);
  pool.deallocate(q1, 2 * MiB, b);
  pool.deallocate(q2, 2 * MiB, b);
}

TEST_F(Pool, UpstreamFailuresLeaveThePoolConsistent) {
  if (current_backend() != backend_kind::sim) GTEST_SKIP() << "fault injection is the simulator's";
  pool_options o;
  o.min_chunk_bytes = o.max_chunk_bytes = MiB;
  pool_resource pool(upstream, o);
  const std::uint64_t injected_before = sim::injected_failures();
  sim::fail_allocations_at_random(0.7, 42);
  std::mt19937 rng(7);
  std::vector<std::pair<void*, std::size_t>> live;
  std::size_t failures = 0;
  for (int i = 0; i < 2000; ++i) {
    if (live.size() < 64 && (rng() & 1U)) {
      const std::size_t bytes = 1 + rng() % (3 * MiB / 2);
      try {
        live.emplace_back(pool.allocate(bytes, s), bytes);
      } catch (const out_of_memory&) {
        ++failures;
      }
    } else if (!live.empty()) {
      const std::size_t k = rng() % live.size();
      pool.deallocate(live[k].first, live[k].second, s);
      live[k] = live.back();
      live.pop_back();
    }
    const pool_statistics st = pool.statistics();
    ASSERT_EQ(st.used_bytes + st.free_bytes, st.reserved_bytes);
    ASSERT_EQ(st.allocations, live.size());
    ASSERT_EQ(st.reserved_bytes, upstream.allocated_bytes());
  }
  sim::fail_allocations_at_random(0, 0);
  EXPECT_GT(sim::injected_failures(), injected_before) << "the upstream never failed";
  EXPECT_GT(failures, 0U) << "no failure reached the caller";
  for (auto [p, n] : live) pool.deallocate(p, n, s);
  s.synchronize();
  pool.release();
  EXPECT_EQ(upstream.allocated_bytes(), 0U) << "nothing lost";
}

TEST_F(Pool, RandomOperationsMatchAReferenceModel) {
  // Differential test: every live allocation must lie inside a chunk the upstream
  // handed out, never overlap another, and keep its bytes.
  pool_resource pool(upstream);
  std::mt19937_64 rng(1);
  std::map<std::uintptr_t, std::size_t> model;  // address -> bytes
  std::vector<std::pair<void*, std::size_t>> live;
  std::size_t model_used = 0;
  const std::vector<std::size_t> alignments = {256, 256, 256, 512, 4096, 65536};
  for (int i = 0; i < 3000; ++i) {
    if (live.size() < 300 && (rng() % 3 != 0)) {
      const std::size_t bytes = 1 + rng() % ((rng() & 1U) ? 4096 : 4 * MiB);
      const std::size_t alignment = alignments[rng() % alignments.size()];
      void* p = pool.allocate(bytes, s, alignment);
      const auto a = reinterpret_cast<std::uintptr_t>(p);
      ASSERT_EQ(a % alignment, 0U);
      auto next = model.lower_bound(a);
      if (next != model.end()) {
        ASSERT_LE(a + bytes, next->first) << "overlaps the next allocation";
      }
      if (next != model.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second, a) << "overlaps the previous allocation";
      }
      model.emplace(a, bytes);
      model_used += (bytes + 255) / 256 * 256;
      live.emplace_back(p, bytes);
    } else if (!live.empty()) {
      const std::size_t k = rng() % live.size();
      model.erase(reinterpret_cast<std::uintptr_t>(live[k].first));
      model_used -= (live[k].second + 255) / 256 * 256;
      pool.deallocate(live[k].first, live[k].second, s, 256);
      live[k] = live.back();
      live.pop_back();
    }
    if (i % 100 == 0) {
      const pool_statistics st = pool.statistics();
      ASSERT_EQ(st.allocations, model.size());
      ASSERT_EQ(st.used_bytes, model_used);
      ASSERT_EQ(st.used_bytes + st.free_bytes, st.reserved_bytes);
    }
  }
  // Contents survive: fill each with its own byte, then check all.
  for (std::size_t k = 0; k < live.size(); ++k) device_fill(live[k].first, live[k].second, static_cast<std::uint8_t>(k), s);
  for (std::size_t k = 0; k < live.size(); ++k) {
    ASSERT_EQ(device_count_mismatches(live[k].first, live[k].second, static_cast<std::uint8_t>(k), s), 0U);
  }
  for (auto [p, n] : live) pool.deallocate(p, n, s);
  const pool_statistics st = pool.statistics();
  EXPECT_EQ(st.used_bytes, 0U);
  EXPECT_EQ(st.free_blocks, st.chunks) << "everything coalesced back into whole chunks";
}

}  // namespace
}  // namespace gpumem::test
