// try_allocate_now / try_deallocate_now (Note [Allocating without waiting] in
// src/pool/stream_ordered_pool.hpp): the pools serve their hot path's cases and
// refuse everything else without changing state; every other resource and every
// adaptor refuses; the ordinary calls still raise the errors.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "gpumem/adaptors/statistics.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/device_buffer.hpp"
#include "gpumem/error.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/vmm/virtual_memory.hpp"
#include "gpumem/vmm_pool_resource.hpp"
#include "pool/pool_inspector.hpp"
#include "support/capture.hpp"

namespace gpumem::test {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

// Both pools behind one interface, with their invariant check.
struct pool_under_test {
  std::shared_ptr<memory_resource> mr;
  std::function<std::string()> violations;
};

pool_under_test make_pool(bool paged) {
  if (paged) {
    auto p = std::make_shared<vmm_pool_resource>(0);
    return {p, [p] { return detail::pool_inspector::violations(*p); }};
  }
  auto p = std::make_shared<pool_resource>(std::make_shared<cuda_resource>(0));
  return {p, [p] { return detail::pool_inspector::violations(*p); }};
}

class TryNow : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (GetParam() && !vmm::supported(0)) GTEST_SKIP() << "no virtual memory management on device 0";
    pool = make_pool(GetParam());
  }
  pool_under_test pool;
  stream s{0};
};

TEST_P(TryNow, ServesWhatTheHotPathServesAfterTheFirstCall) {
  memory_resource& mr = *pool.mr;
  // A fresh pool has no memory and no arena for the stream: it must grow, which may wait.
  EXPECT_EQ(mr.try_allocate_now(4096, s), nullptr);
  void* p = mr.allocate(4096, s);
  mr.deallocate(p, 4096, s);
  // The same size again: the quick cache, without waiting.
  void* q = mr.try_allocate_now(4096, s);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q, p);
  // Another size carved from what the pool holds.
  void* r = mr.try_allocate_now(100'000, s);
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(mr.try_deallocate_now(q, 4096, s));
  EXPECT_TRUE(mr.try_deallocate_now(r, 100'000, s));
  EXPECT_EQ(pool.violations(), "");
}

TEST_P(TryNow, RefusesWhatTheOrdinaryCallsReportAndChangesNothing) {
  memory_resource& mr = *pool.mr;
  void* p = mr.allocate(4096, s);
  EXPECT_EQ(mr.try_allocate_now(0, s), nullptr);
  EXPECT_EQ(mr.try_allocate_now(256, s, 3), nullptr);
  EXPECT_EQ(mr.try_allocate_now(~std::size_t{0}, s), nullptr);
  EXPECT_FALSE(mr.try_deallocate_now(nullptr, 4096, s));
  EXPECT_FALSE(mr.try_deallocate_now(p, 0, s));
  EXPECT_FALSE(mr.try_deallocate_now(p, 4097, s));  // the wrong size: deallocate says so
  EXPECT_THROW(mr.deallocate(p, 4097, s), logic_error);
  int on_host = 0;
  EXPECT_FALSE(mr.try_deallocate_now(&on_host, 4, s));  // foreign
  EXPECT_TRUE(mr.try_deallocate_now(p, 4096, s));
  EXPECT_FALSE(mr.try_deallocate_now(p, 4096, s));  // already freed
  EXPECT_THROW(mr.deallocate(p, 4096, s), logic_error);
  EXPECT_EQ(pool.violations(), "");
}

TEST_P(TryNow, OnlyTheStreamTheThreadLastUsedIsServed) {
  memory_resource& mr = *pool.mr;
  stream other{0};
  mr.deallocate(mr.allocate(4096, s), 4096, s);
  mr.deallocate(mr.allocate(4096, other), 4096, other);
  // The thread's cached arena is now other's: s would need the arena lookup.
  EXPECT_EQ(mr.try_allocate_now(4096, s), nullptr);
  void* p = mr.try_allocate_now(4096, other);
  ASSERT_NE(p, nullptr);
  EXPECT_FALSE(mr.try_deallocate_now(p, 4096, s));  // a free from another stream: the ordinary path orders it
  mr.deallocate(p, 4096, s);
  s.synchronize();
  EXPECT_EQ(pool.violations(), "");
}

TEST_P(TryNow, RefusesOnACapturingStream) {
  memory_resource& mr = *pool.mr;
  stream cap{0, stream::flags::non_blocking};
  void* p = mr.allocate(4096, cap);
  mr.deallocate(mr.allocate(8192, cap), 8192, cap);
  {
    capture_on capturing(cap);
    EXPECT_EQ(mr.try_allocate_now(8192, cap), nullptr);
    EXPECT_FALSE(mr.try_deallocate_now(p, 4096, cap));
  }
  EXPECT_TRUE(mr.try_deallocate_now(p, 4096, cap));
  EXPECT_EQ(pool.violations(), "");
}

TEST_P(TryNow, SlotsAreServedWhileTheirPagesAreTheirOwn) {
  memory_resource& mr = *pool.mr;
  void* p = mr.allocate(8 * MiB, s);
  mr.deallocate(p, 8 * MiB, s);
  void* q = mr.try_allocate_now(8 * MiB, s);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q, p);
  EXPECT_TRUE(mr.try_deallocate_now(q, 8 * MiB, s));
  EXPECT_EQ(pool.violations(), "");
}

// Threads mixing both kinds of call on their own streams and on a shared one,
// while another trims: the invariants hold after (and TSan watches the locks).
TEST_P(TryNow, ThreadsMixingBothKindsKeepThePoolConsistent) {
  memory_resource& mr = *pool.mr;
  stream shared{0};
  std::atomic<bool> stop{false};
  std::thread trimmer([&] {
    while (!stop.load()) {
      if (auto* v = dynamic_cast<vmm_pool_resource*>(&mr)) v->trim();
      if (auto* q = dynamic_cast<pool_resource*>(&mr)) q->trim();
      // A pause, as a program trims between steps: trimming back to back would
      // hold the growth mutex nearly always, and the pool lets a thread that
      // waits for it exclusively go before new shared holders.
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      stream own{0};
      std::mt19937 rng(static_cast<unsigned>(t));
      std::uniform_int_distribution<std::size_t> size(1, 3 * MiB);
      std::vector<std::pair<void*, std::size_t>> live;
      for (int i = 0; i < 2000; ++i) {
        stream_view st = (i % 7 == 0) ? stream_view(shared) : stream_view(own);
        if (live.size() < 8 && (rng() & 1)) {
          const std::size_t n = size(rng);
          void* p = mr.try_allocate_now(n, st);
          if (p == nullptr) p = mr.allocate(n, st);
          live.emplace_back(p, n);
        } else if (!live.empty()) {
          auto [p, n] = live.back();
          live.pop_back();
          if (!mr.try_deallocate_now(p, n, st)) mr.deallocate(p, n, st);
        }
      }
      for (auto [p, n] : live) mr.deallocate(p, n, own);
      own.synchronize();
    });
  }
  for (auto& th : threads) th.join();
  stop = true;
  trimmer.join();
  shared.synchronize();
  EXPECT_EQ(pool.violations(), "");
}

std::string pool_name(const ::testing::TestParamInfo<bool>& p) { return p.param ? "vmm_pool_resource" : "pool_resource"; }

INSTANTIATE_TEST_SUITE_P(Pools, TryNow, ::testing::Values(false, true), pool_name);

TEST(TryNowElsewhere, ResourcesWithoutAHotPathAndAdaptorsRefuse) {
  stream s{0};
  auto pool = std::make_shared<pool_resource>(std::make_shared<cuda_resource>(0));
  pool->deallocate(pool->allocate(4096, s), 4096, s);
  statistics_adaptor stats(pool);  // must count every call: never the pool's shortcut
  EXPECT_EQ(stats.try_allocate_now(4096, s), nullptr);
  cuda_resource raw(0);
  EXPECT_EQ(raw.try_allocate_now(4096, s), nullptr);
  void* p = raw.allocate(4096, s);
  EXPECT_FALSE(raw.try_deallocate_now(p, 4096, s));
  raw.deallocate(p, 4096, s);
}

TEST(TryNowElsewhere, DeviceBufferTriesAndFallsBack) {
  stream s{0};
  auto pool = std::make_shared<pool_resource>(std::make_shared<cuda_resource>(0));
  device_buffer none = device_buffer::try_allocate_now(4096, s, pool);  // the pool must grow first
  EXPECT_EQ(none.data(), nullptr);
  EXPECT_TRUE(none.try_release_now());  // nothing to free
  void* first = nullptr;
  {
    device_buffer b(4096, s, pool);
    first = b.data();
  }
  device_buffer b = device_buffer::try_allocate_now(4096, s, pool);
  ASSERT_EQ(b.data(), first);
  EXPECT_EQ(b.size(), 4096U);
  EXPECT_EQ(b.resource(), pool);
  EXPECT_TRUE(b.try_release_now());
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(detail::pool_inspector::violations(*pool), "");
}

}  // namespace
}  // namespace gpumem::test
