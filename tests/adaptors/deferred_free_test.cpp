// deferred_free_adaptor: every flush trigger (count, bytes, out-of-memory,
// request, end of scope), defer_cleanup nesting, cancelled queues, the
// environment, stream order, misuse and threads.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "adaptors/adaptor_test_support.hpp"
#include "gpumem/adaptors/deferred_free.hpp"
#include "gpumem/adaptors/limiting.hpp"
#include "gpumem/device.hpp"
#include "gpumem/pool_resource.hpp"
#include "support/touch.hpp"

namespace gpumem::test {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

deferred_free_options count_limit(std::size_t n) {
  deferred_free_options o;
  o.max_pending_count = n;
  return o;
}

TEST(DeferredFreeAdaptor, FreesWaitUntilTheQueuePassesTheCount) {
  auto up = std::make_shared<cuda_resource>(0);
  deferred_free_adaptor mr(up, count_limit(10));
  stream s(0);
  std::vector<void*> p;
  for (int i = 0; i < 11; ++i) p.push_back(mr.allocate(1000, s));
  for (int i = 0; i < 10; ++i) mr.deallocate(p[i], 1000, s);
  EXPECT_EQ(up->allocation_count(), 11U) << "ten frees are held";
  deferred_free_statistics st = mr.statistics();
  EXPECT_EQ(st.pending_count, 10U);
  EXPECT_EQ(st.pending_bytes, 10'000U);
  EXPECT_EQ(st.flushes, 0U);
  mr.deallocate(p[10], 1000, s);  // the eleventh passes the count
  EXPECT_EQ(up->allocation_count(), 0U);
  st = mr.statistics();
  EXPECT_EQ(st.pending_count, 0U);
  EXPECT_EQ(st.flushes, 1U);
  EXPECT_EQ(st.flushes_by_count, 1U);
  EXPECT_EQ(st.frees, 11U);
}

TEST(DeferredFreeAdaptor, FreesWaitUntilTheQueuePassesTheByteRatio) {
  auto up = std::make_shared<cuda_resource>(0);
  deferred_free_options o;
  o.max_pending_count = 1000;
  o.max_pending_ratio = 0.001;
  deferred_free_adaptor mr(up, o);
  const std::size_t limit = mr.max_pending_bytes();
  EXPECT_EQ(limit, static_cast<std::size_t>(static_cast<double>(device_memory_info(0).total_bytes) * 0.001));
  const std::size_t half = limit / 2;
  void* a = mr.allocate(half, stream_view{});
  void* b = mr.allocate(half, stream_view{});
  void* c = mr.allocate(2, stream_view{});
  mr.deallocate(a, half, stream_view{});
  mr.deallocate(b, half, stream_view{});  // at the limit, not past it
  EXPECT_EQ(mr.statistics().pending_count, 2U);
  mr.deallocate(c, 2, stream_view{});
  const deferred_free_statistics st = mr.statistics();
  EXPECT_EQ(st.flushes_by_bytes, 1U);
  EXPECT_EQ(st.pending_bytes, 0U);
  EXPECT_EQ(up->allocation_count(), 0U);
}

TEST(DeferredFreeAdaptor, AnAllocationThatRunsOutFlushesAndRetriesOnce) {
  auto limited = std::make_shared<limiting_adaptor>(std::make_shared<cuda_resource>(0), 4 * MiB);
  deferred_free_adaptor mr(limited, count_limit(100));
  void* a = mr.allocate(3 * MiB, stream_view{});
  mr.deallocate(a, 3 * MiB, stream_view{});  // held: the limit still counts it
  EXPECT_EQ(limited->used_bytes(), 3 * MiB);
  void* b = mr.allocate(2 * MiB, stream_view{});  // fails, flushes, succeeds
  deferred_free_statistics st = mr.statistics();
  EXPECT_EQ(st.flushes_by_oom, 1U);
  EXPECT_EQ(st.pending_count, 0U);
  EXPECT_EQ(limited->used_bytes(), 2 * MiB);
  // Nothing queued: the out-of-memory is the caller's at once.
  EXPECT_THROW(mr.allocate(3 * MiB, stream_view{}), out_of_memory);
  // Queued frees that do not make enough room: flushed once, retried once, then the error.
  void* c = mr.allocate(MiB, stream_view{});
  mr.deallocate(c, MiB, stream_view{});
  EXPECT_THROW(mr.allocate(3 * MiB, stream_view{}), out_of_memory);
  st = mr.statistics();
  EXPECT_EQ(st.flushes_by_oom, 2U);
  EXPECT_EQ(st.pending_count, 0U);
  mr.deallocate(b, 2 * MiB, stream_view{});
  mr.flush();
  EXPECT_EQ(mr.statistics().flushes_requested, 1U);
  EXPECT_EQ(limited->used_bytes(), 0U);
}

TEST(DeferredFreeAdaptor, DeferCleanupHoldsEveryFreeUntilTheOutermostScopeEnds) {
  auto limited = std::make_shared<limiting_adaptor>(std::make_shared<cuda_resource>(0), 8 * MiB);
  deferred_free_adaptor mr(limited, count_limit(3));
  {
    defer_cleanup outer(mr);
    std::vector<void*> p;
    for (int i = 0; i < 8; ++i) p.push_back(mr.allocate(MiB, stream_view{}));
    {
      defer_cleanup inner(mr);
      EXPECT_EQ(mr.cleanup_deferrals(), 2);
      for (int i = 0; i < 5; ++i) mr.deallocate(p[i], MiB, stream_view{});
    }
    EXPECT_EQ(mr.statistics().pending_count, 5U) << "the inner scope's end flushes nothing";
    for (int i = 5; i < 8; ++i) mr.deallocate(p[i], MiB, stream_view{});
    EXPECT_EQ(mr.statistics().pending_count, 8U);
    // As in Numba, an allocation that runs out inside the scope is not rescued.
    EXPECT_THROW(mr.allocate(MiB, stream_view{}), out_of_memory);
    EXPECT_EQ(mr.statistics().flushes, 0U);
    EXPECT_EQ(limited->used_bytes(), 8 * MiB);
  }
  const deferred_free_statistics st = mr.statistics();
  EXPECT_EQ(mr.cleanup_deferrals(), 0);
  EXPECT_EQ(st.pending_count, 0U) << "past the count when the scope ended: flushed";
  EXPECT_EQ(st.flushes_by_count, 1U);
  EXPECT_EQ(limited->used_bytes(), 0U);
  // A scope that ends under the limits leaves the queue as it is.
  {
    defer_cleanup hold(mr);
    void* q = mr.allocate(MiB, stream_view{});
    mr.deallocate(q, MiB, stream_view{});
  }
  EXPECT_EQ(mr.statistics().pending_count, 1U);
  // flush() is an explicit request: it frees inside a scope too.
  {
    defer_cleanup hold(mr);
    mr.flush();
    EXPECT_EQ(mr.statistics().pending_count, 0U);
  }
}

TEST(DeferredFreeAdaptor, ADeallocationErrorCancelsTheRestOfTheQueue) {
  auto up = std::make_shared<scripted_resource>(0);
  deferred_free_adaptor mr(up, count_limit(100));
  std::vector<void*> p;
  for (int i = 0; i < 6; ++i) p.push_back(mr.allocate(1000, stream_view{}));
  for (void* q : p) mr.deallocate(q, 1000, stream_view{});
  up->fail_deallocation_number = 3;
  testing::internal::CaptureStderr();
  EXPECT_THROW(mr.flush(), cuda_error);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("the 3 free(s) (2.93 KiB) queued after it were cancelled"), std::string::npos) << err;
  const deferred_free_statistics st = mr.statistics();
  EXPECT_EQ(st.frees, 2U);
  EXPECT_EQ(st.cancelled_frees, 3U);
  EXPECT_EQ(st.cancelled_bytes, 3000U);
  EXPECT_EQ(st.pending_count, 0U) << "the queue is empty: cancelled, not kept";
  EXPECT_EQ(up->deallocations.load(), 3) << "nothing after the failed free was attempted";
  EXPECT_EQ(up->live_count(), 4U);  // the failed one and the three cancelled ones
  // The adaptor goes on working.
  void* again = mr.allocate(1000, stream_view{});
  mr.deallocate(again, 1000, stream_view{});
  mr.flush();
  EXPECT_EQ(up->live_count(), 4U);
  for (int i = 2; i < 6; ++i) up->real().deallocate(p[i], 1000, stream_view{});
}

TEST(DeferredFreeAdaptor, AFlushTriggeredByAFreeThrowsFromThatFree) {
  auto up = std::make_shared<scripted_resource>(0);
  deferred_free_adaptor mr(up, count_limit(1));
  void* a = mr.allocate(256, stream_view{});
  void* b = mr.allocate(256, stream_view{});
  up->fail_deallocation_number = 1;
  mr.deallocate(a, 256, stream_view{});
  EXPECT_THROW(mr.deallocate(b, 256, stream_view{}), cuda_error);
  EXPECT_EQ(mr.statistics().cancelled_frees, 1U);
  up->real().deallocate(a, 256, stream_view{});
  up->real().deallocate(b, 256, stream_view{});
}

TEST(DeferredFreeAdaptor, MisuseIsReportedAtTheFreeNotAtTheFlush) {
  auto up = std::make_shared<cuda_resource>(0);
  deferred_free_adaptor mr(up, count_limit(100));
  void* p = mr.allocate(4096, stream_view{});
  void* foreign = up->allocate(256, stream_view{});
  EXPECT_THROW(mr.deallocate(foreign, 256, stream_view{}), logic_error);
  EXPECT_THROW(mr.deallocate(p, 4000, stream_view{}), logic_error);
  mr.deallocate(p, 4096, stream_view{});
  EXPECT_THROW(mr.deallocate(p, 4096, stream_view{}), logic_error) << "a queued free is a free";
  EXPECT_EQ(mr.statistics().pending_count, 1U);
  mr.flush();
  EXPECT_EQ(up->allocation_count(), 1U);
  up->deallocate(foreign, 256, stream_view{});
}

TEST(DeferredFreeAdaptor, LimitsComeFromTheEnvironment) {
  {
    scoped_env count("GPUMEM_MAX_PENDING_DEALLOCS_COUNT", "3");
    scoped_env ratio("GPUMEM_MAX_PENDING_DEALLOCS_RATIO", "0.5");
    const deferred_free_options o = deferred_free_options::from_environment();
    EXPECT_EQ(o.max_pending_count, 3U);
    EXPECT_DOUBLE_EQ(o.max_pending_ratio, 0.5);
    deferred_free_adaptor mr(std::make_shared<cuda_resource>(0));
    EXPECT_EQ(mr.max_pending_count(), 3U);
  }
  {
    scoped_env count("GPUMEM_MAX_PENDING_DEALLOCS_COUNT", nullptr);
    scoped_env ratio("GPUMEM_MAX_PENDING_DEALLOCS_RATIO", nullptr);
    const deferred_free_options o = deferred_free_options::from_environment();
    EXPECT_EQ(o.max_pending_count, 10U);
    EXPECT_DOUBLE_EQ(o.max_pending_ratio, 0.2);
  }
  for (const char* bad : {"ten", "-1", "3x"}) {
    scoped_env count("GPUMEM_MAX_PENDING_DEALLOCS_COUNT", bad);
    try {
      deferred_free_options::from_environment();
      ADD_FAILURE() << bad;
    } catch (const logic_error& e) {
      EXPECT_NE(std::string(e.what()).find("GPUMEM_MAX_PENDING_DEALLOCS_COUNT"), std::string::npos);
    }
  }
  for (const char* bad : {"0", "1.5", "x"}) {
    scoped_env ratio("GPUMEM_MAX_PENDING_DEALLOCS_RATIO", bad);
    EXPECT_THROW(deferred_free_options::from_environment(), logic_error) << bad;
  }
  deferred_free_options o;
  o.max_pending_ratio = 0;
  EXPECT_THROW(deferred_free_adaptor(std::make_shared<cuda_resource>(0), o), logic_error);
}

TEST(DeferredFreeAdaptor, AFlushedFreeIsOrderedAfterItsStreamsWork) {
  // The block is freed on stream a while a's work on it still runs; the flush
  // hands it to the pool at once, and stream b asks for the only memory there is.
  pool_options po;
  po.maximum_bytes = 2 * MiB;
  po.min_chunk_bytes = po.max_chunk_bytes = 2 * MiB;
  deferred_free_adaptor mr(std::make_shared<pool_resource>(std::make_shared<cuda_resource>(0), po),
                           count_limit(100));
  stream a(0);
  stream b(0);
  void* p = mr.allocate(2 * MiB, a);
  held_check check(p, 2 * MiB, 0xD4, std::chrono::milliseconds(200), a);
  mr.deallocate(p, 2 * MiB, a);
  mr.flush();
  void* q = mr.allocate(2 * MiB, b);
  EXPECT_EQ(q, p);
  device_fill(q, 2 * MiB, 0x4D, b);
  EXPECT_EQ(check.mismatches(), 0U) << "b reused the block before a's work on it was done";
  mr.deallocate(q, 2 * MiB, b);
}

TEST(DeferredFreeAdaptor, AStreamMayBeDestroyedWhileItsFreesAreQueued) {
  auto up = std::make_shared<pool_resource>(std::make_shared<cuda_resource>(0));
  deferred_free_adaptor mr(up, count_limit(100));
  {
    stream gone(0);
    void* p = mr.allocate(MiB, gone);
    device_fill(p, MiB, 1, gone);
    mr.deallocate(p, MiB, gone);
  }
  mr.flush();
  EXPECT_EQ(mr.statistics().frees, 1U);
  EXPECT_EQ(up->statistics().used_bytes, 0U);
}

TEST(DeferredFreeAdaptor, ManyThreads) {
  auto up = std::make_shared<pool_resource>(std::make_shared<cuda_resource>(0));
  deferred_free_adaptor mr(up, count_limit(7));
  std::vector<std::thread> workers;
  for (int t = 0; t < 6; ++t) {
    workers.emplace_back([&, t] {
      stream mine(0);
      for (int i = 0; i < 200; ++i) {
        const std::size_t n = 256 + static_cast<std::size_t>((i * 13 + t) % 5000);
        void* p = mr.allocate(n, mine);
        device_fill(p, n, static_cast<std::uint8_t>(t), mine);
        if (i % 50 == 0) {
          defer_cleanup hold(mr);
          mr.deallocate(p, n, mine);
        } else {
          mr.deallocate(p, n, mine);
        }
      }
      mine.synchronize();
    });
  }
  for (auto& w : workers) w.join();
  mr.flush();
  const deferred_free_statistics st = mr.statistics();
  EXPECT_EQ(st.frees, 1200U);
  EXPECT_GT(st.flushes_by_count, 10U) << "scopes held by other threads delay flushes, never stop them";
  EXPECT_EQ(up->statistics().used_bytes, 0U);
}

}  // namespace
}  // namespace gpumem::test
