// statistics_adaptor: exact counts, peaks, scopes, rejected calls, many threads.
#include <gtest/gtest.h>

#include <random>
#include <thread>
#include <vector>

#include "adaptors/adaptor_test_support.hpp"
#include "gpumem/adaptors/limiting.hpp"
#include "gpumem/adaptors/statistics.hpp"
#include "gpumem/pool_resource.hpp"
#include "support/touch.hpp"

namespace gpumem::test {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

TEST(StatisticsAdaptor, CountsCurrentPeakAndTotal) {
  pool_resource pool(std::make_shared<cuda_resource>(0));
  statistics_adaptor mr(pool);
  stream s(0);
  void* a = mr.allocate(1000, s);
  void* b = mr.allocate(3000, s);
  allocation_counters c = mr.statistics();
  EXPECT_EQ(c.current_bytes, 4000U);
  EXPECT_EQ(c.current_count, 2U);
  EXPECT_EQ(c.peak_bytes, 4000U);
  EXPECT_EQ(c.peak_count, 2U);
  EXPECT_EQ(c.total_bytes, 4000U);
  EXPECT_EQ(c.total_count, 2U);
  mr.deallocate(b, 3000, s);
  void* d = mr.allocate(500, s);
  device_fill(d, 500, 0x31, s);
  EXPECT_EQ(device_count_mismatches(d, 500, 0x31, s), 0U);
  c = mr.statistics();
  EXPECT_EQ(c.current_bytes, 1500U);
  EXPECT_EQ(c.current_count, 2U);
  EXPECT_EQ(c.peak_bytes, 4000U) << "the peak stays";
  EXPECT_EQ(c.total_bytes, 4500U);
  EXPECT_EQ(c.total_count, 3U);
  mr.deallocate(a, 1000, s);
  mr.deallocate(d, 500, s);
  c = mr.statistics();
  EXPECT_EQ(c.current_bytes, 0U);
  EXPECT_EQ(c.current_count, 0U);
  EXPECT_EQ(c.peak_count, 2U);
}

TEST(StatisticsAdaptor, RejectedCallsAreNotCounted) {
  auto limited = std::make_shared<limiting_adaptor>(std::make_shared<cuda_resource>(0), 2 * MiB);
  statistics_adaptor mr(limited);
  stream s(0);
  void* p = mr.allocate(MiB, s);
  EXPECT_THROW(mr.allocate(2 * MiB, s), out_of_memory);
  int on_stack = 0;
  EXPECT_THROW(mr.deallocate(&on_stack, 4, s), logic_error);
  EXPECT_THROW(mr.deallocate(p, MiB + 1, s), logic_error);
  EXPECT_THROW(mr.allocate(0, s), logic_error);
  const allocation_counters c = mr.statistics();
  EXPECT_EQ(c.current_bytes, MiB);
  EXPECT_EQ(c.total_count, 1U);
  EXPECT_EQ(c.peak_bytes, MiB);
  mr.deallocate(p, MiB, s);
  EXPECT_EQ(mr.statistics().current_count, 0U);
}

TEST(StatisticsAdaptor, NestedScopesMeasureOneRegion) {
  statistics_adaptor mr(std::make_shared<pool_resource>(std::make_shared<cuda_resource>(0)));
  stream s(0);
  void* outside = mr.allocate(10'000, s);  // live before any scope
  mr.push_scope();
  void* a = mr.allocate(5'000, s);
  mr.deallocate(a, 5'000, s);  // peak in the outer scope: 15,000
  mr.push_scope();
  EXPECT_EQ(mr.scope_depth(), 2U);
  void* b = mr.allocate(2'000, s);
  void* c = mr.allocate(1'000, s);
  mr.deallocate(c, 1'000, s);
  const allocation_counters inner = mr.pop_scope();
  EXPECT_EQ(inner.total_bytes, 3'000U);
  EXPECT_EQ(inner.total_count, 2U);
  EXPECT_EQ(inner.peak_bytes, 13'000U) << "the scope's peak starts at what was live when it began";
  EXPECT_EQ(inner.peak_count, 3U);
  EXPECT_EQ(inner.current_bytes, 12'000U);
  const allocation_counters outer = mr.pop_scope();
  EXPECT_EQ(outer.total_bytes, 8'000U) << "an outer scope's totals include its inner scopes'";
  EXPECT_EQ(outer.total_count, 3U);
  EXPECT_EQ(outer.peak_bytes, 15'000U);
  EXPECT_EQ(mr.scope_depth(), 0U);
  EXPECT_THROW(mr.pop_scope(), logic_error);
  // A scope whose inner scope peaked higher than the rest of it takes that peak.
  mr.push_scope();
  mr.push_scope();
  void* big = mr.allocate(100'000, s);
  mr.deallocate(big, 100'000, s);
  mr.pop_scope();
  EXPECT_EQ(mr.pop_scope().peak_bytes, 12'000U + 100'000U);
  const allocation_counters life = mr.statistics();
  EXPECT_EQ(life.peak_bytes, 112'000U);
  EXPECT_EQ(life.total_count, 5U);
  mr.deallocate(b, 2'000, s);
  mr.deallocate(outside, 10'000, s);
}

TEST(StatisticsAdaptor, PeakIsExactFromOneThread) {
  statistics_adaptor mr(std::make_shared<pool_resource>(std::make_shared<cuda_resource>(0)));
  stream s(0);
  std::mt19937_64 rng(3);
  std::vector<std::pair<void*, std::size_t>> live;
  std::size_t current = 0, peak = 0, total = 0, peak_count = 0;
  for (int i = 0; i < 5000; ++i) {
    if (live.empty() || (live.size() < 500 && rng() % 2 == 0)) {
      const std::size_t n = 1 + rng() % (256 << 10);
      live.emplace_back(mr.allocate(n, s), n);
      current += n;
      total += n;
      peak = std::max(peak, current);
      peak_count = std::max(peak_count, live.size());
    } else {
      const std::size_t k = rng() % live.size();
      mr.deallocate(live[k].first, live[k].second, s);
      current -= live[k].second;
      live[k] = live.back();
      live.pop_back();
    }
  }
  const allocation_counters c = mr.statistics();
  EXPECT_EQ(c.current_bytes, current);
  EXPECT_EQ(c.peak_bytes, peak);
  EXPECT_EQ(c.peak_count, peak_count);
  EXPECT_EQ(c.total_bytes, total);
  for (auto [p, n] : live) mr.deallocate(p, n, s);
}

TEST(StatisticsAdaptor, SeveralAdaptorsUsedInTurnByOneThreadStayExact) {
  // Each thread caches its counters for the adaptors it used last; using three in
  // turn evicts them, and must still count each call once, exactly.
  auto up = std::make_shared<cuda_resource>(0);
  std::vector<std::unique_ptr<statistics_adaptor>> adaptors;
  for (int i = 0; i < 3; ++i) adaptors.push_back(std::make_unique<statistics_adaptor>(up));
  std::vector<std::vector<std::pair<void*, std::size_t>>> live(3);
  std::vector<std::size_t> current(3, 0), peak(3, 0);
  std::mt19937 rng(5);
  for (int i = 0; i < 3000; ++i) {
    const std::size_t k = rng() % 3;
    if (live[k].empty() || rng() % 2 == 0) {
      const std::size_t n = 1 + rng() % 100000;
      live[k].emplace_back(adaptors[k]->allocate(n, stream_view{}), n);
      current[k] += n;
      peak[k] = std::max(peak[k], current[k]);
    } else {
      auto [p, n] = live[k].back();
      live[k].pop_back();
      adaptors[k]->deallocate(p, n, stream_view{});
      current[k] -= n;
    }
  }
  for (std::size_t k = 0; k < 3; ++k) {
    const allocation_counters c = adaptors[k]->statistics();
    EXPECT_EQ(c.current_bytes, current[k]) << k;
    EXPECT_EQ(c.peak_bytes, peak[k]) << k;
    for (auto [p, n] : live[k]) adaptors[k]->deallocate(p, n, stream_view{});
  }
}

TEST(StatisticsAdaptor, ManyThreadsFreeingEachOthersMemoryAddUpExactly) {
  statistics_adaptor mr(std::make_shared<pool_resource>(std::make_shared<cuda_resource>(0)));
  constexpr int threads = 8;
  constexpr int per_thread = 400;
  std::mutex handoff_mutex;
  std::vector<std::pair<void*, std::size_t>> handoff;  // allocated on one thread, freed on another
  std::atomic<std::size_t> bytes_allocated{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      stream mine(0);
      std::mt19937 rng(static_cast<unsigned>(t));
      std::vector<std::pair<void*, std::size_t>> live;
      for (int i = 0; i < per_thread; ++i) {
        const std::size_t n = 1 + rng() % (64 << 10);
        live.emplace_back(mr.allocate(n, mine), n);
        bytes_allocated += n;
        if (i % 4 == 0) {
          std::lock_guard lock(handoff_mutex);
          handoff.push_back(live.back());
          live.pop_back();
        }
        if (live.size() > 16) {
          mr.deallocate(live.front().first, live.front().second, mine);
          live.erase(live.begin());
        }
      }
      for (auto [p, n] : live) mr.deallocate(p, n, mine);
      mine.synchronize();
    });
  }
  for (auto& w : workers) w.join();
  allocation_counters mid = mr.statistics();
  EXPECT_EQ(mid.current_count, handoff.size());
  std::size_t handoff_bytes = 0;
  for (auto [p, n] : handoff) handoff_bytes += n;
  EXPECT_EQ(mid.current_bytes, handoff_bytes);
  EXPECT_GE(mid.peak_bytes, handoff_bytes);
  // Freed by threads that allocated none of it.
  std::vector<std::thread> freers;
  for (int t = 0; t < 4; ++t) {
    freers.emplace_back([&, t] {
      stream mine(0);
      for (std::size_t k = static_cast<std::size_t>(t); k < handoff.size(); k += 4) {
        mr.deallocate(handoff[k].first, handoff[k].second, mine);
      }
      mine.synchronize();
    });
  }
  for (auto& f : freers) f.join();
  const allocation_counters c = mr.statistics();
  EXPECT_EQ(c.current_bytes, 0U);
  EXPECT_EQ(c.current_count, 0U);
  EXPECT_EQ(c.total_count, std::size_t{threads} * per_thread);
  EXPECT_EQ(c.total_bytes, bytes_allocated.load());
  EXPECT_LE(c.peak_bytes, c.total_bytes);
  EXPECT_GE(c.peak_count, handoff.size());
}

TEST(StatisticsAdaptor, ShortLivedThreadsAreCounted) {
  statistics_adaptor mr(std::make_shared<cuda_resource>(0));
  std::vector<void*> kept(40);
  for (int t = 0; t < 40; ++t) {
    std::thread([&, t] { kept[t] = mr.allocate(1000, stream_view{}); }).join();
  }
  allocation_counters c = mr.statistics();
  EXPECT_EQ(c.current_count, 40U);
  EXPECT_EQ(c.peak_bytes, 40'000U) << "threads that exited published what they held";
  for (void* p : kept) mr.deallocate(p, 1000, stream_view{});
  EXPECT_EQ(mr.statistics().current_bytes, 0U);
}

TEST(StatisticsAdaptor, OwnsOrBorrowsItsUpstream) {
  EXPECT_THROW(statistics_adaptor(std::shared_ptr<memory_resource>{}), logic_error);
  auto up = std::make_shared<cuda_resource>(0);
  std::weak_ptr<cuda_resource> watch = up;
  {
    statistics_adaptor owning(std::move(up));
    EXPECT_FALSE(watch.expired());
    EXPECT_EQ(&owning.upstream(), watch.lock().get());
    EXPECT_EQ(owning.properties().device, 0);
    EXPECT_TRUE(owning.properties().thread_safe);
  }
  EXPECT_TRUE(watch.expired()) << "the shared upstream is released with the adaptor";
  scripted_resource not_thread_safe;
  statistics_adaptor borrowing(not_thread_safe);
  EXPECT_FALSE(borrowing.properties().thread_safe) << "thread_safe is the upstream's";
}

TEST(StatisticsAdaptor, ReportsAtDestructionWhenAsked) {
  statistics_options o;
  o.report_at_exit = true;
  o.name = "stats-under-test";
  testing::internal::CaptureStderr();
  {
    statistics_adaptor mr(std::make_shared<cuda_resource>(0), o);
    void* p = mr.allocate(2048, stream_view{});
    mr.deallocate(p, 2048, stream_view{});
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("stats-under-test: peak 2.00 KiB in 1 allocation(s)"), std::string::npos) << err;
}

}  // namespace
}  // namespace gpumem::test
