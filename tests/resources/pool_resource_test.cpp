// pool_resource beyond the shared contract: coalescing, statistics, growth and
// release, limits, cross-stream reuse and its ordering, frees on another stream,
// upstream failures, and many threads.
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
#include "support/capture.hpp"
#include "support/touch.hpp"

namespace gpumem::test {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

class Pool : public ::testing::Test {
 protected:
  cuda_resource upstream{0};
  stream s{0};
};

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

TEST_F(Pool, SixteenThreadsWithTheirOwnStreams) {
  pool_resource pool(upstream);
  constexpr int threads = 16;
  std::atomic<int> corrupted{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      stream mine(0);
      std::mt19937 rng(static_cast<unsigned>(t));
      std::vector<std::pair<void*, std::size_t>> live;
      for (int i = 0; i < 400; ++i) {
        if (live.size() < 32 && (rng() & 1U)) {
          const std::size_t bytes = 1 + rng() % (64 << 10);
          void* p = pool.allocate(bytes, mine);
          live.emplace_back(p, bytes);
          if (i % 16 == 0) device_fill(p, bytes, static_cast<std::uint8_t>(t), mine);
          else live.back().second = bytes;
        } else if (!live.empty()) {
          const std::size_t k = rng() % live.size();
          pool.deallocate(live[k].first, live[k].second, mine);
          live[k] = live.back();
          live.pop_back();
        }
      }
      for (auto [p, n] : live) pool.deallocate(p, n, mine);
      mine.synchronize();
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(corrupted.load(), 0);
  const pool_statistics st = pool.statistics();
  EXPECT_EQ(st.used_bytes, 0U);
  EXPECT_EQ(st.allocations, 0U);
  EXPECT_EQ(st.used_bytes + st.free_bytes, st.reserved_bytes);
}

TEST_F(Pool, ThreadsOnOneStreamNeverFailWhileTheirMemoryFitsUnderTheMaximum) {
  // Growth, the out-of-memory path and giving chunks back race here: one thread's
  // growth in flight must not make another fail, nor a chunk just grown be released.
  pool_options o;
  o.maximum_bytes = 4 * MiB;
  o.min_chunk_bytes = o.max_chunk_bytes = 4 * MiB;
  pool_resource pool(upstream, o);
  std::atomic<int> failures{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < 6; ++t) {
    workers.emplace_back([&] {
      for (int i = 0; i < 300; ++i) {
        try {
          void* p = pool.allocate(512 << 10, s);
          pool.deallocate(p, 512 << 10, s);
        } catch (const out_of_memory&) {
          ++failures;
        }
        if (i % 50 == 0) pool.release();
      }
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(failures.load(), 0) << "6 x 512 KiB always fit in the 4 MiB the pool may hold";
  EXPECT_LE(pool.statistics().reserved_bytes, 4 * MiB);
}

TEST_F(Pool, ThreadsSharingStreamsAndFreeingAcrossThem) {
  // Allocate on one stream, free on another, from many threads at once.
  pool_resource pool(upstream);
  stream streams[3] = {stream(0), stream(0), stream(0)};
  std::vector<std::thread> workers;
  for (int t = 0; t < 8; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(100 + t));
      for (int i = 0; i < 300; ++i) {
        stream& on = streams[rng() % 3];
        stream& off = streams[rng() % 3];
        const std::size_t bytes = 1 + rng() % (256 << 10);
        void* p = pool.allocate(bytes, on);
        pool.deallocate(p, bytes, off);
      }
    });
  }
  for (auto& w : workers) w.join();
  for (auto& st : streams) st.synchronize();
  const pool_statistics st = pool.statistics();
  EXPECT_EQ(st.used_bytes, 0U);
  EXPECT_EQ(st.used_bytes + st.free_bytes, st.reserved_bytes);
}

// Fences are recorded on demand (src/pool/arena.hpp, Note [Fencing frees on demand]).
// The simulator counts the event records and waits the pool makes.
bool on_simulator() { return current_backend() == backend_kind::sim; }
std::uint64_t event_records() { return detail::simulator::event_records(); }
std::uint64_t event_waits() { return detail::simulator::stream_event_waits(); }

TEST_F(Pool, ThreadsOnTheirOwnStreamsRecordNoEventOnTheHotPath) {
  if (!on_simulator()) GTEST_SKIP() << "counts the simulator's cuEventRecord calls";
  pool_options o;
  o.min_chunk_bytes = o.max_chunk_bytes = 64 * MiB;  // one chunk per stream holds all it needs
  pool_resource pool(upstream, o);
  constexpr int threads = 4;
  std::vector<stream> streams;
  for (int t = 0; t < threads; ++t) streams.emplace_back(0);
  // Each stream's first allocation grows its arena; the misses may ask the other
  // streams to fence, which they do at their next free, here.
  for (stream& st : streams) pool.deallocate(pool.allocate(MiB, st), MiB, st);
  for (stream& st : streams) pool.deallocate(pool.allocate(MiB, st), MiB, st);
  ASSERT_EQ(pool.statistics().streams, static_cast<std::size_t>(threads));
  ASSERT_EQ(pool.statistics().chunks, static_cast<std::size_t>(threads));

  const std::uint64_t records_before = event_records();
  const std::uint64_t waits_before = event_waits();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(7 + t));
      std::vector<std::pair<void*, std::size_t>> live;
      for (int i = 0; i < 4000; ++i) {  // about 2000 frees of up to 1 MiB on each stream
        if (live.empty() || (live.size() < 32 && (rng() & 1U))) {
          const std::size_t bytes = 1 + rng() % MiB;
          live.emplace_back(pool.allocate(bytes, streams[t]), bytes);
        } else {
          const std::size_t k = rng() % live.size();
          pool.deallocate(live[k].first, live[k].second, streams[t]);
          live[k] = live.back();
          live.pop_back();
        }
      }
      for (auto [p, n] : live) pool.deallocate(p, n, streams[t]);
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(event_records() - records_before, 0U) << "a fence was recorded that no stream asked for";
  EXPECT_EQ(event_waits() - waits_before, 0U);
  EXPECT_EQ(pool.statistics().chunks, static_cast<std::size_t>(threads)) << "no stream ran short";
  for (stream& st : streams) st.synchronize();
}

TEST_F(Pool, AStreamFencesWhenAnotherAsksAndTheTakerWaitsForItsEarlierWork) {
  // a frees p while its earlier work on p is still running. b's miss finds p's chunk
  // free but unfenced: b asks a to fence and grows. a's next free records the fence;
  // b's next miss takes p's chunk, and its work on it waits for a's.
  pool_options o;
  o.min_chunk_bytes = o.max_chunk_bytes = 2 * MiB;
  pool_resource pool(upstream, o);
  stream a(0);
  stream b(0);
  void* p = pool.allocate(2 * MiB, a);
  void* r = pool.allocate(256, a);  // a second chunk, for a's next free
  held_check check(p, 2 * MiB, 0xD4, std::chrono::milliseconds(200), a);
  const std::uint64_t records_before = event_records();
  pool.deallocate(p, 2 * MiB, a);
  void* q = pool.allocate(2 * MiB, b);
  EXPECT_NE(q, p) << "p's free is not fenced: b must not take it yet";
  if (on_simulator()) {
    EXPECT_EQ(event_records(), records_before) << "b must not record on a's stream";
  }
  pool.deallocate(r, 256, a);  // a was asked: this free records a's fence, after the check
  if (on_simulator()) {
    EXPECT_EQ(event_records(), records_before + 1);
  }
  const std::uint64_t waits_before = event_waits();
  void* q2 = pool.allocate(2 * MiB, b);  // b is short again: p's chunk is fenced now
  EXPECT_EQ(q2, p);
  if (on_simulator()) {
    EXPECT_EQ(event_waits(), waits_before + 1);
  }
  device_fill(q2, 2 * MiB, 0x4D, b);
  EXPECT_EQ(check.mismatches(), 0U) << "b overwrote p while a's earlier work still used it";
  EXPECT_EQ(device_count_mismatches(q2, 2 * MiB, 0x4D, b), 0U);
  pool.deallocate(q, 2 * MiB, b);
  pool.deallocate(q2, 2 * MiB, b);
}

TEST_F(Pool, ThePerThreadDefaultStreamFencesOnItsOwnThread) {
  // CU_STREAM_PER_THREAD names the calling thread's stream: only the thread that
  // freed on it can fence those frees. Another thread that wants the memory asks,
  // and gets it after that thread's next free, ordered after its earlier work.
  pool_options o;
  o.min_chunk_bytes = o.max_chunk_bytes = 2 * MiB;
  pool_resource pool(upstream, o);
  stream b(0);
  void* p = nullptr;
  std::latch freed(1), asked(1), fenced(1), taken(1);
  std::size_t mismatches = 0;
  std::thread owner([&] {
    set_current_device(0);  // the per-thread default stream is the current context's
    const stream_view mine = stream_view::per_thread();
    p = pool.allocate(2 * MiB, mine);
    void* r = pool.allocate(256, mine);
    held_check check(p, 2 * MiB, 0xE6, std::chrono::milliseconds(200), mine);
    pool.deallocate(p, 2 * MiB, mine);
    freed.count_down();
    asked.wait();
    pool.deallocate(r, 256, mine);  // records the fence this thread was asked for
    fenced.count_down();
    taken.wait();
    mismatches = check.mismatches();  // waits for this thread's stream
  });
  freed.wait();
  const std::uint64_t records_before = event_records();
  void* q = pool.allocate(2 * MiB, b);
  EXPECT_NE(q, p);
  if (on_simulator()) {
    EXPECT_EQ(event_records(), records_before) << "recorded on another thread's stream";
  }
  asked.count_down();
  fenced.wait();
  if (on_simulator()) {
    EXPECT_EQ(event_records(), records_before + 1);
  }
  void* q2 = pool.allocate(2 * MiB, b);
  EXPECT_EQ(q2, p);
  device_fill(q2, 2 * MiB, 0x6E, b);
  taken.count_down();
  owner.join();
  EXPECT_EQ(mismatches, 0U) << "b overwrote p while the owner thread's work still used it";
  EXPECT_EQ(device_count_mismatches(q2, 2 * MiB, 0x6E, b), 0U);
  pool.deallocate(q, 2 * MiB, b);
  pool.deallocate(q2, 2 * MiB, b);
}

TEST_F(Pool, MemoryOfADestroyedStreamIsReusedWithoutCallsOnIt) {
  // A program may destroy a stream once its calls return. Its free memory stays in
  // the pool; another stream takes it without the pool ever naming the dead stream
  // (the simulator refuses a destroyed handle, so any call on it would throw here).
  pool_options o;
  o.maximum_bytes = 2 * MiB;
  o.min_chunk_bytes = o.max_chunk_bytes = 2 * MiB;
  pool_resource pool(upstream, o);
  stream b(0);
  void* p = nullptr;
  {
    stream a(0);
    p = pool.allocate(2 * MiB, a);
    device_fill(p, 2 * MiB, 0x21, a);
    pool.deallocate(p, 2 * MiB, a);
  }
  const std::uint64_t records_before = event_records();
  void* q = pool.allocate(2 * MiB, b);  // only possible by reusing p's memory
  EXPECT_EQ(q, p);
  if (on_simulator()) {
    EXPECT_EQ(event_records(), records_before);
  }
  device_fill(q, 2 * MiB, 0x12, b);
  EXPECT_EQ(device_count_mismatches(q, 2 * MiB, 0x12, b), 0U);
  pool.deallocate(q, 2 * MiB, b);
}

TEST_F(Pool, TrimAsksEveryStreamToFenceForTheNextTrim) {
  pool_options o;
  o.min_chunk_bytes = o.max_chunk_bytes = 2 * MiB;
  pool_resource pool(upstream, o);
  stream other(0);
  void* c = pool.allocate(256, other);  // a second stream
  void* a = pool.allocate(2 * MiB, s);
  void* b = pool.allocate(2 * MiB, s);
  pool.deallocate(a, 2 * MiB, s);
  EXPECT_EQ(pool.trim(), 0U) << "a's free is not fenced: no stream was asked to fence yet";
  pool.deallocate(b, 2 * MiB, s);  // trim() asked s: this free records its fence
  EXPECT_EQ(pool.trim(), 4 * MiB);
  pool.deallocate(c, 256, other);
  s.synchronize();
  other.synchronize();
}

TEST_F(Pool, PeriodicFencesStillFollowTheOptions) {
  if (!on_simulator()) GTEST_SKIP() << "counts the simulator's cuEventRecord calls";
  pool_options o;
  o.fence_interval = 4;
  pool_resource pool(upstream, o);
  stream other(0);
  pool.deallocate(pool.allocate(256, other), 256, other);  // the pool serves two streams
  const std::uint64_t records_before = event_records();
  for (int i = 0; i < 8; ++i) pool.deallocate(pool.allocate(4096, s), 4096, s);
  EXPECT_EQ(event_records() - records_before, 2U) << "one fence every 4 frees";
}

// ---- CUDA graphs (Note [Pools and stream capture] in src/stream_device.hpp) ----

TEST_F(Pool, AStreamUnderCaptureIsRefusedWithAClearErrorAndThePoolStaysIntact) {
  pool_resource pool(upstream);
  expect_capture_refused(pool, s);
}

TEST_F(Pool, AStreamNewToThePoolUnderCaptureIsRefusedAndTheCaptureSurvives) {
  // The pool's first driver call on a new stream is the capture query: others (the
  // device check) fail on a capturing stream and invalidate the program's capture.
  pool_resource pool(upstream);
  capture_on capture(s);
  EXPECT_THROW((void)pool.allocate(1000, s), logic_error);
  EXPECT_THROW(pool.trim(s), logic_error);
  capture.end();  // throws if the capture was invalidated
  pool.deallocate(pool.allocate(1000, s), 1000, s);
  s.synchronize();
  EXPECT_EQ(pool.statistics().allocations, 0U);
}

TEST_F(Pool, TheDefaultStreamsAreNeverQueriedForCapture) {
  pool_resource pool(upstream);
  // The legacy default stream cannot be captured: served without a query.
  void* p = pool.allocate(256, stream_view{});
  pool.deallocate(p, 256, stream_view{});
  void* q = pool.allocate(256, stream_view::legacy_default());
  pool.deallocate(q, 256, stream_view::legacy_default());
  EXPECT_EQ(pool.statistics().allocations, 0U);
}

TEST_F(Pool, RefuseCaptureCanBeTurnedOff) {
  pool_options o;
  o.refuse_capture = false;
  pool_resource pool(upstream, o);
  void* warm = pool.allocate(1000, s);  // the quick cache serves the capture's request
  pool.deallocate(warm, 1000, s);
  s.synchronize();
  void* during = nullptr;
  {
    capture_on capture(s);
    during = pool.allocate(1000, s);  // the caller's responsibility now
    capture.end();
  }
  EXPECT_EQ(during, warm);
  pool.deallocate(during, 1000, s);
  EXPECT_EQ(pool.statistics().allocations, 0U);
}

}  // namespace
}  // namespace gpumem::test
