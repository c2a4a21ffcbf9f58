// Simulator: stream-ordered allocation from memory pools: reuse in stream order
// and by the reuse policies, the release threshold at synchronizations, trim,
// attributes, pool creation and destruction, current pools and access.
#include <atomic>
#include <cstring>
#include <vector>

#include "sim_test_support.hpp"

namespace gpumem::sim_test {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t granule = 2 * MiB;   // segments are multiples of it
constexpr std::size_t segment = 32 * MiB;  // what a small request reserves (the driver's step on an H200)

class sim_pool_test : public sim_test {
 protected:
  void SetUp() override {
    sim_test::SetUp();
    s_ = make_stream();
    ASSERT_EQ(cu().cuDeviceGetDefaultMemPool(&pool_, 0), CUDA_SUCCESS);
  }
  void TearDown() override {
    for (CUstream s : streams_) EXPECT_EQ(cu().cuStreamDestroy(s), CUDA_SUCCESS);
    sim_test::TearDown();  // synchronizes every device: pending frees complete
    for (CUmemoryPool p : pools_) EXPECT_EQ(cu().cuMemPoolDestroy(p), CUDA_SUCCESS);
    // The default pool gives everything back at a synchronization (threshold 0).
    current_device d0(0);
    EXPECT_EQ(cu().cuCtxSynchronize(), CUDA_SUCCESS);
  }

  CUstream make_stream(unsigned int flags = CU_STREAM_NON_BLOCKING) {
    CUstream s = nullptr;
    EXPECT_EQ(cu().cuStreamCreate(&s, flags), CUDA_SUCCESS);
    streams_.push_back(s);
    return s;
  }

  // A pool of device 0 that keeps what it caches, with the given reuse flags.
  CUmemoryPool make_pool(bool follow_events, bool opportunistic, bool internal, std::size_t max_bytes = 0) {
    CUmemPoolProps props{};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;
    props.maxSize = max_bytes;
    CUmemoryPool pool = nullptr;
    EXPECT_EQ(cu().cuMemPoolCreate(&pool, &props), CUDA_SUCCESS);
    pools_.push_back(pool);
    cuuint64_t keep = ~cuuint64_t{0};
    EXPECT_EQ(cu().cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep), CUDA_SUCCESS);
    int values[] = {follow_events ? 1 : 0, opportunistic ? 1 : 0, internal ? 1 : 0};
    const CUmemPool_attribute flags[] = {CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
                                         CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
                                         CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES};
    for (int i = 0; i < 3; ++i) EXPECT_EQ(cu().cuMemPoolSetAttribute(pool, flags[i], &values[i]), CUDA_SUCCESS);
    return pool;
  }

  static cuuint64_t value(CUmemoryPool pool, CUmemPool_attribute attribute) {
    cuuint64_t v = ~cuuint64_t{0};
    EXPECT_EQ(cu().cuMemPoolGetAttribute(pool, attribute, &v), CUDA_SUCCESS);
    return v;
  }
  static CUdeviceptr alloc(CUmemoryPool pool, std::size_t bytes, CUstream s) {
    CUdeviceptr p = 0;
    EXPECT_EQ(cu().cuMemAllocFromPoolAsync(&p, bytes, pool, s), CUDA_SUCCESS);
    return p;
  }
  // Keeps `s` busy until the gate opens.
  void hold(CUstream s, gate& g) { ASSERT_EQ(launch(s, [&g] { g.wait(); }), CUDA_SUCCESS); }

  CUstream s_ = nullptr;
  CUmemoryPool pool_ = nullptr;  // device 0's default pool

 private:
  std::vector<CUstream> streams_;
  std::vector<CUmemoryPool> pools_;
};

TEST_F(sim_pool_test, same_stream_frees_are_reused_at_once_while_the_stream_is_busy) {
  // The stream's worker is stuck: nothing it queued has run, yet a tight
  // allocate/free loop runs in constant memory, as it does on a GPU.
  gate& g = new_gate();
  hold(s_, g);
  CUdeviceptr first = 0;
  for (int i = 0; i < 1000; ++i) {
    CUdeviceptr p = 0;
    ASSERT_EQ(cu().cuMemAllocAsync(&p, MiB, s_), CUDA_SUCCESS) << i;
    if (i == 0) first = p;
    EXPECT_EQ(p, first);
    ASSERT_EQ(cu().cuMemFreeAsync(p, s_), CUDA_SUCCESS);
  }
  EXPECT_EQ(value(pool_, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), segment);
  EXPECT_EQ(value(pool_, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), segment);
  g.open();
}

TEST_F(sim_pool_test, memory_returns_at_a_synchronization_down_to_the_release_threshold) {
  const std::size_t used_before = sim::used_bytes(0);
  CUdeviceptr p = 0;
  ASSERT_EQ(cu().cuMemAllocAsync(&p, 5000, s_), CUDA_SUCCESS);
  EXPECT_EQ(p % page, 0u);
  EXPECT_EQ(sim::used_bytes(0), used_before + segment);  // the pool reserved a segment

  gate& g = new_gate();
  ASSERT_EQ(launch(s_, [&] { g.wait(); std::memset(reinterpret_cast<void*>(p), 1, 5000); }), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemFreeAsync(p, s_), CUDA_SUCCESS);
  // Gone from the program's view at once (work queued before the free still runs)...
  EXPECT_EQ(cu().cuMemGetAddressRange(nullptr, nullptr, p), CUDA_ERROR_NOT_FOUND);
  // ...but the pool holds the memory until a synchronization sees the free complete.
  std::this_thread::sleep_for(settle_time);
  EXPECT_EQ(sim::used_bytes(0), used_before + segment);
  g.open();
  ASSERT_EQ(cu().cuStreamSynchronize(s_), CUDA_SUCCESS);
  EXPECT_EQ(sim::used_bytes(0), used_before);  // threshold 0: all of it went back

  // With a threshold the pool keeps that much across synchronizations (in whole segments).
  cuuint64_t threshold = 2 * segment;
  ASSERT_EQ(cu().cuMemPoolSetAttribute(pool_, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold), CUDA_SUCCESS);
  std::vector<CUdeviceptr> blocks;
  for (int i = 0; i < 8; ++i) {
    ASSERT_EQ(cu().cuMemAllocAsync(&p, segment, s_), CUDA_SUCCESS);
    blocks.push_back(p);
  }
  for (CUdeviceptr b : blocks) ASSERT_EQ(cu().cuMemFreeAsync(b, s_), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamSynchronize(s_), CUDA_SUCCESS);
  EXPECT_EQ(value(pool_, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), threshold);
  EXPECT_EQ(sim::used_bytes(0), used_before + threshold);
  threshold = 0;
  ASSERT_EQ(cu().cuMemPoolSetAttribute(pool_, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamSynchronize(s_), CUDA_SUCCESS);
  EXPECT_EQ(sim::used_bytes(0), used_before);
}

TEST_F(sim_pool_test, a_queued_free_refuses_later_use_and_second_frees) {
  CUdeviceptr p = 0;
  ASSERT_EQ(cu().cuMemAllocAsync(&p, 64, s_), CUDA_SUCCESS);
  gate& g = new_gate();
  hold(s_, g);
  ASSERT_EQ(cu().cuMemFreeAsync(p, s_), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemFreeAsync(p, s_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemsetD8Async(p, 0, 64, s_), CUDA_ERROR_INVALID_VALUE);
  g.open();
  ASSERT_EQ(cu().cuStreamSynchronize(s_), CUDA_SUCCESS);
}

TEST_F(sim_pool_test, async_allocation_errors) {
  CUdeviceptr p = 0;
  EXPECT_EQ(cu().cuMemAllocAsync(&p, 0, s_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemAllocAsync(nullptr, 64, s_), CUDA_ERROR_INVALID_VALUE);
  const std::size_t remaining = (std::size_t{8} << 30) - sim::used_bytes(0);
  EXPECT_EQ(cu().cuMemAllocAsync(&p, remaining + 1, s_), CUDA_ERROR_OUT_OF_MEMORY);
  int host = 0;
  EXPECT_EQ(cu().cuMemFreeAsync(reinterpret_cast<CUdeviceptr>(&host), s_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemFreeAsync(0, s_), CUDA_ERROR_INVALID_VALUE);
  int not_a_stream = 0;
  EXPECT_EQ(cu().cuMemAllocAsync(&p, 64, reinterpret_cast<CUstream>(&not_a_stream)), CUDA_ERROR_INVALID_HANDLE);
  int not_a_pool = 0;
  EXPECT_EQ(cu().cuMemAllocFromPoolAsync(&p, 64, reinterpret_cast<CUmemoryPool>(&not_a_pool), s_),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemAllocFromPoolAsync(&p, 0, pool_, s_), CUDA_ERROR_INVALID_VALUE);

  ASSERT_EQ(cu().cuMemAllocAsync(&p, 2 * page, s_), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemFreeAsync(p + page, s_), CUDA_ERROR_INVALID_VALUE);  // inside, not the start
  EXPECT_EQ(cu().cuMemFree(p), CUDA_ERROR_INVALID_VALUE);                  // not cuMemAlloc's
  EXPECT_EQ(cu().cuMemFreeAsync(p, s_), CUDA_SUCCESS);
}

TEST_F(sim_pool_test, stream_of_another_device_is_refused_by_the_device_pool) {
  CUstream on_device1 = nullptr;
  {
    current_device d1(1);
    ASSERT_EQ(cu().cuStreamCreate(&on_device1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  }
  CUdeviceptr p = 0;
  EXPECT_EQ(cu().cuMemAllocAsync(&p, 64, on_device1), CUDA_ERROR_INVALID_VALUE);
  {
    current_device d1(1);
    ASSERT_EQ(cu().cuMemAllocAsync(&p, 64, on_device1), CUDA_SUCCESS);
    int ordinal = -1;
    ASSERT_EQ(cu().cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p), CUDA_SUCCESS);
    EXPECT_EQ(ordinal, 1);
    ASSERT_EQ(cu().cuMemFreeAsync(p, on_device1), CUDA_SUCCESS);
    ASSERT_EQ(cu().cuStreamSynchronize(on_device1), CUDA_SUCCESS);
  }
  // cuMemAllocFromPoolAsync takes a pool of any device, whatever the stream's.
  CUmemoryPool pool1 = nullptr;
  ASSERT_EQ(cu().cuDeviceGetDefaultMemPool(&pool1, 1), CUDA_SUCCESS);
  p = alloc(pool1, 64, s_);
  int ordinal = -1;
  ASSERT_EQ(cu().cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p), CUDA_SUCCESS);
  EXPECT_EQ(ordinal, 1);
  ASSERT_EQ(cu().cuMemFreeAsync(p, s_), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamSynchronize(s_), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuStreamDestroy(on_device1), CUDA_SUCCESS);
}

TEST_F(sim_pool_test, usage_attributes_count_blocks_in_pages_and_segments_in_granules) {
  CUmemoryPool pool = make_pool(true, true, true);
  CUdeviceptr a = alloc(pool, 3 * page, s_);
  CUdeviceptr b = alloc(pool, 1, s_);
  CUdeviceptr sync = 0;
  ASSERT_EQ(cu().cuMemAlloc(&sync, page), CUDA_SUCCESS);  // not from the pool
  EXPECT_EQ(value(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 4 * page);
  EXPECT_EQ(value(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), segment);
  EXPECT_EQ(value(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), 4 * page);
  CUdeviceptr big = alloc(pool, 39 * MiB, s_);  // larger than a step: its own segment, in granules
  EXPECT_EQ(value(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), segment + 40 * MiB);
  CUmemoryPool from_pointer = nullptr;
  ASSERT_EQ(cu().cuPointerGetAttribute(&from_pointer, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, a), CUDA_SUCCESS);
  EXPECT_EQ(from_pointer, pool);

  ASSERT_EQ(cu().cuMemFreeAsync(a, s_), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemFreeAsync(big, s_), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamSynchronize(s_), CUDA_SUCCESS);
  EXPECT_EQ(value(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), page);
  EXPECT_EQ(value(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), 4 * page + 39 * MiB);
  EXPECT_EQ(value(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), segment + 40 * MiB);  // kept: threshold max

  // High watermarks reset to the current value by setting 0, and only 0.
  cuuint64_t zero = 0, nonzero = 5;
  EXPECT_EQ(cu().cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &nonzero), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cu().cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero), CUDA_SUCCESS);
  EXPECT_EQ(value(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), page);
  ASSERT_EQ(cu().cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
  EXPECT_EQ(value(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), segment);  // b still lives in the first
  ASSERT_EQ(cu().cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero), CUDA_SUCCESS);
  EXPECT_EQ(value(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), segment);
  EXPECT_EQ(cu().cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &zero), CUDA_ERROR_INVALID_VALUE);

  ASSERT_EQ(cu().cuMemFreeAsync(b, s_), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemFree(sync), CUDA_SUCCESS);
  EXPECT_EQ(value(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0u);
}

TEST_F(sim_pool_test, another_stream_does_not_take_a_pending_free_while_it_can_grow) {
  CUmemoryPool pool = make_pool(true, true, true);
  CUstream b = make_stream();
  gate& g = new_gate();
  hold(s_, g);
  CUdeviceptr a = alloc(pool, MiB, s_);
  ASSERT_EQ(cu().cuMemFreeAsync(a, s_), CUDA_SUCCESS);
  CUdeviceptr on_b = alloc(pool, MiB, b);
  EXPECT_NE(on_b, a) << "a block whose free is pending on a busy stream went to another stream";
  EXPECT_EQ(alloc(pool, MiB, s_), a) << "the freeing stream itself reuses it at once";
  g.open();
}

TEST_F(sim_pool_test, opportunistic_reuse_takes_frees_already_reached) {
  for (bool opportunistic : {true, false}) {
    CUmemoryPool pool = make_pool(false, opportunistic, false);
    CUstream b = make_stream();
    CUdeviceptr a = alloc(pool, MiB, s_);
    ASSERT_EQ(cu().cuMemFreeAsync(a, s_), CUDA_SUCCESS);
    ASSERT_TRUE(eventually([&] { return cu().cuStreamQuery(s_) == CUDA_SUCCESS; }));  // reached, not synchronized
    CUdeviceptr on_b = alloc(pool, MiB, b);
    if (opportunistic) {
      EXPECT_EQ(on_b, a);
    } else {
      EXPECT_NE(on_b, a) << "reused without a dependency or a synchronization";
    }
    ASSERT_EQ(cu().cuMemFreeAsync(on_b, b), CUDA_SUCCESS);
  }
}

TEST_F(sim_pool_test, a_synchronization_makes_frees_reusable_by_any_stream_whatever_the_flags) {
  CUmemoryPool pool = make_pool(false, false, false);
  CUstream b = make_stream();
  CUdeviceptr a = alloc(pool, MiB, s_);
  ASSERT_EQ(cu().cuMemFreeAsync(a, s_), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamSynchronize(s_), CUDA_SUCCESS);
  EXPECT_EQ(alloc(pool, MiB, b), a);
  EXPECT_EQ(cu().cuMemFreeAsync(a, b), CUDA_SUCCESS);
}

TEST_F(sim_pool_test, event_dependencies_let_another_stream_reuse_a_pending_free) {
  CUmemoryPool pool = make_pool(true, false, false);
  CUstream b = make_stream();
  CUstream c = make_stream();
  gate& g = new_gate();
  hold(s_, g);
  CUdeviceptr a = alloc(pool, MiB, s_);
  ASSERT_EQ(cu().cuMemFreeAsync(a, s_), CUDA_SUCCESS);
  CUdeviceptr unrelated = alloc(pool, MiB, c);
  EXPECT_NE(unrelated, a) << "c has no dependency on the free";
  CUevent after_free = nullptr, on_b = nullptr;
  ASSERT_EQ(cu().cuEventCreate(&after_free, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuEventCreate(&on_b, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuEventRecord(after_free, s_), CUDA_SUCCESS);
  // Transitively: b waits for the free, c waits for b.
  ASSERT_EQ(cu().cuStreamWaitEvent(b, after_free, 0), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuEventRecord(on_b, b), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamWaitEvent(c, on_b, 0), CUDA_SUCCESS);
  EXPECT_EQ(alloc(pool, MiB, c), a) << "c is ordered after the free through b";
  g.open();
  EXPECT_EQ(cu().cuEventDestroy(after_free), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuEventDestroy(on_b), CUDA_SUCCESS);
}

TEST_F(sim_pool_test, the_legacy_stream_rules_are_dependencies_too) {
  CUmemoryPool pool = make_pool(true, false, false);
  CUstream blocking = make_stream(CU_STREAM_DEFAULT);
  gate& g = new_gate();
  hold(blocking, g);
  CUdeviceptr a = alloc(pool, MiB, blocking);
  ASSERT_EQ(cu().cuMemFreeAsync(a, blocking), CUDA_SUCCESS);
  CUstream non_blocking = make_stream();
  EXPECT_NE(alloc(pool, MiB, non_blocking), a) << "a non-blocking stream has no dependency on the free";
  // Work on the legacy default stream waits for the blocking stream's earlier work.
  EXPECT_EQ(alloc(pool, MiB, nullptr), a);
  g.open();
}

TEST_F(sim_pool_test, internal_dependencies_when_the_pool_cannot_grow) {
  for (bool internal : {true, false}) {
    CUmemoryPool pool = make_pool(false, false, internal, segment);
    CUstream b = make_stream();
    gate& g = new_gate();
    hold(s_, g);
    CUdeviceptr a = alloc(pool, segment, s_);
    ASSERT_EQ(cu().cuMemFreeAsync(a, s_), CUDA_SUCCESS);
    CUdeviceptr on_b = 0;
    if (!internal) {
      EXPECT_EQ(cu().cuMemAllocFromPoolAsync(&on_b, segment, pool, b), CUDA_ERROR_OUT_OF_MEMORY);
      g.open();
      continue;
    }
    ASSERT_EQ(cu().cuMemAllocFromPoolAsync(&on_b, segment, pool, b), CUDA_SUCCESS);
    EXPECT_EQ(on_b, a);
    // b now waits, on the device, for s_ to reach the free.
    std::atomic<bool> ran{false};
    ASSERT_EQ(launch(b, [&] { ran = true; }), CUDA_SUCCESS);
    std::this_thread::sleep_for(settle_time);
    EXPECT_FALSE(ran) << "b used the block before the free on the other stream was reached";
    g.open();
    ASSERT_EQ(cu().cuStreamSynchronize(b), CUDA_SUCCESS);
    EXPECT_TRUE(ran);
    ASSERT_EQ(cu().cuMemFreeAsync(on_b, b), CUDA_SUCCESS);
  }
}

TEST_F(sim_pool_test, trim_returns_free_segments_the_host_has_seen_and_keeps_what_it_is_asked_to) {
  CUmemoryPool pool = make_pool(true, true, true);
  const std::size_t used_before = sim::used_bytes(0);
  gate& g = new_gate();
  hold(s_, g);
  std::vector<CUdeviceptr> blocks;
  for (int i = 0; i < 3; ++i) blocks.push_back(alloc(pool, segment, s_));
  for (CUdeviceptr b : blocks) ASSERT_EQ(cu().cuMemFreeAsync(b, s_), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
  EXPECT_EQ(value(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 3 * segment)
      << "frees not yet seen count as outstanding";
  g.open();
  ASSERT_EQ(cu().cuStreamSynchronize(s_), CUDA_SUCCESS);
  EXPECT_EQ(value(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 3 * segment);  // threshold max keeps it
  ASSERT_EQ(cu().cuMemPoolTrimTo(pool, segment + 5 * MiB), CUDA_SUCCESS);
  EXPECT_EQ(value(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 2 * segment)
      << "at least what was asked kept, in whole segments";
  std::size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cu().cuMemGetInfo(&free_bytes, &total), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
  std::size_t free_after = 0;
  ASSERT_EQ(cu().cuMemGetInfo(&free_after, &total), CUDA_SUCCESS);
  EXPECT_EQ(free_after, free_bytes + 2 * segment);
  EXPECT_EQ(sim::used_bytes(0), used_before);
}

TEST_F(sim_pool_test, a_pool_stops_at_its_maximum_size) {
  CUmemoryPool pool = make_pool(true, true, true, 2 * segment);
  CUdeviceptr a = alloc(pool, 47 * MiB, s_);  // a segment of 48 MiB
  CUdeviceptr b = 0;
  EXPECT_EQ(cu().cuMemAllocFromPoolAsync(&b, 17 * MiB, pool, s_), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(cu().cuMemAllocFromPoolAsync(&b, 3 * segment, pool, s_), CUDA_ERROR_OUT_OF_MEMORY);
  b = alloc(pool, 15 * MiB, s_);  // no room for a whole step: a segment of just 16 MiB
  EXPECT_EQ(value(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 2 * segment);
  ASSERT_EQ(cu().cuMemFreeAsync(a, s_), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemFreeAsync(b, s_), CUDA_SUCCESS);
}

TEST_F(sim_pool_test, a_small_maximum_size_is_rounded_up_to_the_step) {
  // As on an H200: a pool of maxSize 2 MiB holds two 2 MiB allocations.
  CUmemoryPool pool = make_pool(true, true, true, granule);
  CUdeviceptr a = alloc(pool, granule, s_);
  CUdeviceptr b = alloc(pool, granule, s_);
  EXPECT_EQ(value(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), segment);
  CUdeviceptr c = 0;
  EXPECT_EQ(cu().cuMemAllocFromPoolAsync(&c, segment - 2 * granule + 1, pool, s_), CUDA_ERROR_OUT_OF_MEMORY);
  c = alloc(pool, segment - 2 * granule, s_);
  for (CUdeviceptr p : {a, b, c}) ASSERT_EQ(cu().cuMemFreeAsync(p, s_), CUDA_SUCCESS);
}

TEST_F(sim_pool_test, create_and_destroy) {
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  CUmemoryPool pool = nullptr;
  EXPECT_EQ(cu().cuMemPoolCreate(nullptr, &props), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemPoolCreate(&pool, nullptr), CUDA_ERROR_INVALID_VALUE);
  CUmemPoolProps bad = props;
  bad.allocType = CU_MEM_ALLOCATION_TYPE_INVALID;
  EXPECT_EQ(cu().cuMemPoolCreate(&pool, &bad), CUDA_ERROR_INVALID_VALUE);
  bad = props;
  bad.location.id = 7;
  EXPECT_EQ(cu().cuMemPoolCreate(&pool, &bad), CUDA_ERROR_INVALID_DEVICE);
  bad = props;
  bad.handleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
  EXPECT_EQ(cu().cuMemPoolCreate(&pool, &bad), CUDA_ERROR_NOT_SUPPORTED);
  bad = props;
  bad.reserved[3] = 1;
  EXPECT_EQ(cu().cuMemPoolCreate(&pool, &bad), CUDA_ERROR_INVALID_VALUE);
  int supported = 0;
  ASSERT_EQ(cu().cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, 0), CUDA_SUCCESS);
  EXPECT_EQ(supported, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  ASSERT_EQ(cu().cuMemPoolCreate(&pool, &props), CUDA_SUCCESS);
  EXPECT_NE(pool, pool_);

  // Destroyed with an allocation live: refused for new work at once, memory back once freed.
  const std::size_t used_before = sim::used_bytes(0);
  CUdeviceptr p = alloc(pool, MiB, s_);
  EXPECT_EQ(sim::used_bytes(0), used_before + segment);
  ASSERT_EQ(cu().cuMemPoolDestroy(pool), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemPoolDestroy(pool), CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr q = 0;
  EXPECT_EQ(cu().cuMemAllocFromPoolAsync(&q, 64, pool, s_), CUDA_ERROR_INVALID_VALUE);
  cuuint64_t v = 0;
  EXPECT_EQ(cu().cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(sim::used_bytes(0), used_before + segment);
  ASSERT_EQ(cu().cuMemFreeAsync(p, s_), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamSynchronize(s_), CUDA_SUCCESS);
  EXPECT_EQ(sim::used_bytes(0), used_before);

  EXPECT_EQ(cu().cuMemPoolDestroy(pool_), CUDA_ERROR_INVALID_VALUE) << "a default pool cannot be destroyed";
}

TEST_F(sim_pool_test, the_current_pool_serves_cuMemAllocAsync) {
  CUmemoryPool current = nullptr;
  ASSERT_EQ(cu().cuDeviceGetMemPool(&current, 0), CUDA_SUCCESS);
  EXPECT_EQ(current, pool_);
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  CUmemoryPool pool = nullptr;
  ASSERT_EQ(cu().cuMemPoolCreate(&pool, &props), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuDeviceSetMemPool(0, pool), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuDeviceSetMemPool(1, pool), CUDA_ERROR_INVALID_VALUE) << "a pool of another device";
  EXPECT_EQ(cu().cuDeviceSetMemPool(5, pool), CUDA_ERROR_INVALID_DEVICE);
  ASSERT_EQ(cu().cuDeviceGetMemPool(&current, 0), CUDA_SUCCESS);
  EXPECT_EQ(current, pool);
  CUdeviceptr p = 0;
  ASSERT_EQ(cu().cuMemAllocAsync(&p, 64, s_), CUDA_SUCCESS);
  CUmemoryPool from = nullptr;
  ASSERT_EQ(cu().cuPointerGetAttribute(&from, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p), CUDA_SUCCESS);
  EXPECT_EQ(from, pool);
  ASSERT_EQ(cu().cuMemFreeAsync(p, s_), CUDA_SUCCESS);
  // Destroying the current pool makes the default current again.
  ASSERT_EQ(cu().cuMemPoolDestroy(pool), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuDeviceGetMemPool(&current, 0), CUDA_SUCCESS);
  EXPECT_EQ(current, pool_);
  EXPECT_EQ(cu().cuDeviceGetMemPool(nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuDeviceGetMemPool(&current, 9), CUDA_ERROR_INVALID_DEVICE);
}

TEST_F(sim_pool_test, access_from_other_devices) {
  CUmemoryPool pool = make_pool(true, true, true);
  auto access_of = [&](int device) {
    CUmemLocation where{CU_MEM_LOCATION_TYPE_DEVICE, device};
    CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_MAX;
    EXPECT_EQ(cu().cuMemPoolGetAccess(&flags, pool, &where), CUDA_SUCCESS);
    return flags;
  };
  EXPECT_EQ(access_of(0), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  EXPECT_EQ(access_of(1), CU_MEM_ACCESS_FLAGS_PROT_NONE);
  CUmemAccessDesc grant{{CU_MEM_LOCATION_TYPE_DEVICE, 1}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  ASSERT_EQ(cu().cuMemPoolSetAccess(pool, &grant, 1), CUDA_SUCCESS);
  EXPECT_EQ(access_of(1), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  // The whole map is checked first: a change to the owner refuses all of it.
  CUmemAccessDesc both[] = {{{CU_MEM_LOCATION_TYPE_DEVICE, 1}, CU_MEM_ACCESS_FLAGS_PROT_NONE},
                            {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_NONE}};
  EXPECT_EQ(cu().cuMemPoolSetAccess(pool, both, 2), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(access_of(1), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  ASSERT_EQ(cu().cuMemPoolSetAccess(pool, both, 1), CUDA_SUCCESS);
  EXPECT_EQ(access_of(1), CU_MEM_ACCESS_FLAGS_PROT_NONE);
  CUmemAccessDesc bad{{CU_MEM_LOCATION_TYPE_DEVICE, 9}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  EXPECT_EQ(cu().cuMemPoolSetAccess(pool, &bad, 1), CUDA_ERROR_INVALID_DEVICE);
  bad.location.type = CU_MEM_LOCATION_TYPE_HOST;
  EXPECT_EQ(cu().cuMemPoolSetAccess(pool, &bad, 1), CUDA_ERROR_INVALID_VALUE);
  CUmemLocation where{CU_MEM_LOCATION_TYPE_DEVICE, 0};
  EXPECT_EQ(cu().cuMemPoolGetAccess(nullptr, pool, &where), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(sim_pool_test, settable_attributes_round_trip) {
  cuuint64_t threshold = std::uint64_t{1} << 40;
  ASSERT_EQ(cu().cuMemPoolSetAttribute(pool_, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold), CUDA_SUCCESS);
  EXPECT_EQ(value(pool_, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), threshold);
  threshold = 0;
  ASSERT_EQ(cu().cuMemPoolSetAttribute(pool_, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold), CUDA_SUCCESS);

  for (CUmemPool_attribute flag : {CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
                                   CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
                                   CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES}) {
    int v = -1;
    ASSERT_EQ(cu().cuMemPoolGetAttribute(pool_, flag, &v), CUDA_SUCCESS);
    EXPECT_EQ(v, 1);  // enabled by default
    int off = 0;
    ASSERT_EQ(cu().cuMemPoolSetAttribute(pool_, flag, &off), CUDA_SUCCESS);
    ASSERT_EQ(cu().cuMemPoolGetAttribute(pool_, flag, &v), CUDA_SUCCESS);
    EXPECT_EQ(v, 0);
    int on = 1;
    ASSERT_EQ(cu().cuMemPoolSetAttribute(pool_, flag, &on), CUDA_SUCCESS);
  }
}

TEST_F(sim_pool_test, pools_are_per_device_and_handles_are_checked) {
  CUmemoryPool pool1 = nullptr;
  ASSERT_EQ(cu().cuDeviceGetDefaultMemPool(&pool1, 1), CUDA_SUCCESS);
  EXPECT_NE(pool1, pool_);
  CUmemoryPool again = nullptr;
  ASSERT_EQ(cu().cuDeviceGetDefaultMemPool(&again, 0), CUDA_SUCCESS);
  EXPECT_EQ(again, pool_);
  EXPECT_EQ(cu().cuDeviceGetDefaultMemPool(&again, 2), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(cu().cuDeviceGetDefaultMemPool(nullptr, 0), CUDA_ERROR_INVALID_VALUE);

  int not_a_pool = 0;
  auto bogus = reinterpret_cast<CUmemoryPool>(&not_a_pool);
  cuuint64_t v = 0;
  EXPECT_EQ(cu().cuMemPoolGetAttribute(bogus, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemPoolSetAttribute(bogus, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemPoolTrimTo(bogus, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemPoolDestroy(bogus), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemPoolTrimTo(pool_, 0), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemPoolGetAttribute(pool_, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, nullptr), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(sim_pool_test, many_threads_allocate_and_free_on_their_own_streams) {
  CUmemoryPool pool = make_pool(true, true, true);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      current_device d0(0);
      CUstream s = nullptr;
      if (cu().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
        ++failures;
        return;
      }
      std::vector<CUdeviceptr> live;
      for (int i = 0; i < 300; ++i) {
        CUdeviceptr p = 0;
        if (cu().cuMemAllocFromPoolAsync(&p, static_cast<std::size_t>(1 + (i * 7919 + t) % (256 << 10)), pool, s) !=
            CUDA_SUCCESS) {
          ++failures;
          break;
        }
        const auto byte = static_cast<unsigned char>(t + 1);
        if (cu().cuMemsetD8Async(p, byte, 1, s) != CUDA_SUCCESS) ++failures;
        live.push_back(p);
        if (live.size() > 5) {
          if (cu().cuMemFreeAsync(live.front(), s) != CUDA_SUCCESS) ++failures;
          live.erase(live.begin());
        }
      }
      for (CUdeviceptr p : live) {
        if (cu().cuMemFreeAsync(p, s) != CUDA_SUCCESS) ++failures;
      }
      if (cu().cuStreamSynchronize(s) != CUDA_SUCCESS || cu().cuStreamDestroy(s) != CUDA_SUCCESS) ++failures;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(value(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0u);
}

}  // namespace
}  // namespace gpumem::sim_test
