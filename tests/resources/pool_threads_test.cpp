// pool_resource with many threads and streams: threads on their own and on shared
// streams, fences one stream asks of another, the per-thread default stream,
// destroyed streams, periodic fences, and streams under capture.
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

TEST_F(Pool, AStreamUnderCaptureGetsTheGraphsMemoryAndThePoolStaysIntact) {
  pool_resource pool(upstream);
  expect_graph_memory_under_capture(pool, s, 1000);
}

TEST_F(Pool, AStreamNewToThePoolUnderCaptureGetsTheGraphsMemoryAndTheCaptureSurvives) {
  // The pool's first driver call on a new stream is the capture query: others (the
  // device check) fail on a capturing stream and invalidate the program's capture.
  pool_resource pool(upstream);
  capture_on capture(s);
  void* p = pool.allocate(1000, s);
  EXPECT_EQ(pool.statistics().allocations, 0U) << "the graph's memory, not the pool's";
  EXPECT_THROW(pool.trim(s), logic_error);
  pool.deallocate(p, 1000, s);  // a free node
  capture.end();  // throws if the capture was invalidated
  pool.deallocate(pool.allocate(1000, s), 1000, s);
  s.synchronize();
  EXPECT_EQ(pool.statistics().allocations, 0U);
}

TEST_F(Pool, AGraphsAllocationIsFreedAfterTheCaptureEvenIfTheGraphNeverRan) {
  // Note [Freeing a graph's allocation]: the driver refuses that free (nothing was
  // ever made there); the pool takes it as done.
  pool_resource pool(upstream);
  pool.deallocate(pool.allocate(1000, s), 1000, s);  // the stream's arena exists
  begin_capture(s);
  void* output = pool.allocate(1000, s);
  GPUMEM_CU(cuGraphDestroy, end_capture_keeping_graph(s));
  pool.deallocate(output, 1000, s);
  EXPECT_THROW(pool.deallocate(output, 1000, s), logic_error) << "freed twice";
  s.synchronize();
  EXPECT_EQ(pool.statistics().allocations, 0U);
}

TEST_F(Pool, UnderCaptureTooLargeAnAlignmentAndAShortageAreClearErrors) {
  pool_resource pool(upstream);
  pool.deallocate(pool.allocate(1000, s), 1000, s);  // the stream's arena exists
  begin_capture(s);
  try {
    (void)pool.allocate(1000, s, 4096);
    ADD_FAILURE() << "an alignment above the graph memory's was accepted";
  } catch (const logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("under capture"), std::string::npos) << e.what();
  }
  if (on_simulator()) {
    sim::fail_nth_allocation(1);  // the driver's allocation node fails
    try {
      (void)pool.allocate(1000, s);
      ADD_FAILURE() << "the driver's refusal was not reported";
    } catch (const out_of_memory& e) {
      EXPECT_NE(std::string(e.what()).find("captured into a CUDA graph"), std::string::npos) << e.what();
    }
    sim::fail_nth_allocation(0);
  }
  end_capture(s);  // neither invalidated the capture
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

TEST_F(Pool, CheckCaptureCanBeTurnedOff) {
  pool_options o;
  o.check_capture = false;
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
