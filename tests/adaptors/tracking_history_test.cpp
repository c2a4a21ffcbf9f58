// tracking_adaptor's sites the program supplies (tracking_options::sites) and its
// history of allocations, frees and out-of-memory failures.
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "gpumem/adaptors/limiting.hpp"
#include "gpumem/adaptors/tracking.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/error.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/sim.hpp"
#include "gpumem/stream.hpp"

namespace gpumem::test {
namespace {

// A site source: the site is whatever the test set last on this thread; frames name it.
thread_local std::uint64_t current_site = 0;
std::atomic<int> captures{0};

tracking_site_hooks test_sites() {
  tracking_site_hooks h;
  h.capture = [] {
    captures.fetch_add(1);
    if (current_site == 99) throw std::runtime_error("a hook that fails");
    return current_site;
  };
  h.describe = [](std::uint64_t site) {
    return std::vector<std::string>{"inner.py:" + std::to_string(site) + " leaf", "outer.py:1 main"};
  };
  return h;
}

tracking_options quiet() {
  tracking_options o;
  o.report_at_exit = false;
  return o;
}

TEST(TrackingSites, TheHooksSiteIsKeptAndDescribedInLiveReportsAndSnapshots) {
  tracking_options o = quiet();
  o.sites = test_sites();
  tracking_adaptor mr(std::make_shared<pool_resource>(std::make_shared<cuda_resource>(0)), o);
  stream s(0);
  current_site = 7;
  void* p = mr.allocate(1000, s);
  current_site = 8;
  void* q = mr.allocate(2000, s);
  current_site = 99;  // the hook throws: no site, and the allocation still succeeds
  void* r = mr.allocate(3000, s);
  const auto live = mr.live();
  ASSERT_EQ(live.size(), 3U);
  EXPECT_EQ(live[0].site, 7U);
  EXPECT_EQ(live[0].site_frames, (std::vector<std::string>{"inner.py:7 leaf", "outer.py:1 main"}));
  EXPECT_EQ(live[1].site, 8U);
  EXPECT_EQ(live[2].site, 0U);
  EXPECT_TRUE(live[2].site_frames.empty());
  EXPECT_TRUE(live[0].stack.empty()) << "native stacks stay off";

  const std::string report = mr.leak_report();
  EXPECT_NE(report.find("      #0 inner.py:7 leaf\n      #1 outer.py:1 main\n"), std::string::npos) << report;
  EXPECT_NE(report.find("#0 inner.py:8 leaf"), std::string::npos) << report;

  const std::string path = ::testing::TempDir() + "tracking_sites_" + std::to_string(::getpid()) + ".csv";
  mr.write_snapshot(path);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find(",inner.py:7 leaf\n"), std::string::npos) << "the site column holds the innermost frame";
  std::remove(path.c_str());

  mr.deallocate(p, 1000, s);
  mr.deallocate(q, 2000, s);
  mr.deallocate(r, 3000, s);
  current_site = 0;
}

TEST(TrackingSites, WithoutAHistoryFreesDoNotCallTheHook) {
  tracking_options o = quiet();
  o.sites = test_sites();
  tracking_adaptor mr(std::make_shared<cuda_resource>(0), o);
  stream s(0);
  const int before = captures.load();
  void* p = mr.allocate(512, s);
  mr.deallocate(p, 512, s);
  EXPECT_EQ(captures.load() - before, 1);
  EXPECT_TRUE(mr.history().empty());
  EXPECT_EQ(mr.history_dropped(), 0U);
}

TEST(TrackingHistory, RecordsAllocationsFreesAndOutOfMemoryInOrder) {
  tracking_options o = quiet();
  o.sites = test_sites();
  o.history_entries = 100;
  auto limit = std::make_shared<limiting_adaptor>(std::make_shared<pool_resource>(std::make_shared<cuda_resource>(0)),
                                                  8192);
  tracking_adaptor mr(limit, o);
  stream s(0);
  current_site = 1;
  void* a = mr.allocate(1000, s);
  current_site = 2;
  void* b = mr.allocate(4000, s);
  current_site = 3;
  mr.deallocate(a, 1000, s);
  current_site = 4;
  EXPECT_THROW(mr.allocate(1 << 20, s), out_of_memory);
  current_site = 5;
  void* c = mr.allocate(1000, s);

  const auto h = mr.history();
  ASSERT_EQ(h.size(), 5U);
  EXPECT_EQ(h[0].kind, tracking_event_kind::allocate);
  EXPECT_EQ(h[0].ptr, a);
  EXPECT_EQ(h[0].bytes, 1000U);
  EXPECT_EQ(h[0].seq, 1U);
  EXPECT_EQ(h[0].site, 1U);
  EXPECT_EQ(h[0].stream, s.view());
  EXPECT_EQ(h[1].kind, tracking_event_kind::allocate);
  EXPECT_EQ(h[1].ptr, b);
  EXPECT_EQ(h[1].bytes, 4000U);
  EXPECT_EQ(h[2].kind, tracking_event_kind::deallocate);
  EXPECT_EQ(h[2].ptr, a);
  EXPECT_EQ(h[2].bytes, 1000U);
  EXPECT_EQ(h[2].seq, 1U) << "a free names the allocation it ends";
  EXPECT_EQ(h[2].site, 3U) << "a free's site is where it was freed";
  EXPECT_EQ(h[3].kind, tracking_event_kind::out_of_memory);
  EXPECT_EQ(h[3].ptr, nullptr);
  EXPECT_EQ(h[3].bytes, std::size_t{1} << 20);
  EXPECT_EQ(h[3].site, 4U);
  EXPECT_EQ(h[4].kind, tracking_event_kind::allocate);
  EXPECT_EQ(h[4].ptr, c);
  EXPECT_EQ(h[4].seq, 3U) << "a refused allocation takes no number";
  for (std::size_t i = 1; i < h.size(); ++i) EXPECT_LE(h[i - 1].time_ns, h[i].time_ns);
  EXPECT_EQ(h[0].thread, h[4].thread);

  mr.clear_history();
  EXPECT_TRUE(mr.history().empty());
  mr.deallocate(b, 4000, s);
  mr.deallocate(c, 1000, s);
  ASSERT_EQ(mr.history().size(), 2U);
  current_site = 0;
}

TEST(TrackingHistory, KeepsTheLatestEventsAndCountsTheRest) {
  tracking_options o = quiet();
  o.history_entries = 4;
  tracking_adaptor mr(std::make_shared<pool_resource>(std::make_shared<cuda_resource>(0)), o);
  stream s(0);
  for (std::size_t i = 1; i <= 5; ++i) {
    void* p = mr.allocate(i * 256, s);
    mr.deallocate(p, i * 256, s);
  }
  const auto h = mr.history();
  ASSERT_EQ(h.size(), 4U);
  EXPECT_EQ(mr.history_dropped(), 6U);
  // The last four of ten events: allocate 4, free 4, allocate 5, free 5.
  EXPECT_EQ(h[0].kind, tracking_event_kind::allocate);
  EXPECT_EQ(h[0].bytes, 4U * 256);
  EXPECT_EQ(h[1].kind, tracking_event_kind::deallocate);
  EXPECT_EQ(h[2].bytes, 5U * 256);
  EXPECT_EQ(h[3].kind, tracking_event_kind::deallocate);
  EXPECT_EQ(h[3].seq, 5U);
  EXPECT_EQ(h[0].site, 0U) << "no hook: no site";
}

// Many threads: every allocation's event comes before its free's, and a free of
// some memory comes before the next allocation of the same address.
TEST(TrackingHistory, OneOrderForAllThreads) {
  tracking_options o = quiet();
  o.history_entries = 1 << 16;
  tracking_adaptor mr(std::make_shared<pool_resource>(std::make_shared<cuda_resource>(0)), o);
  std::vector<std::thread> workers;
  for (int t = 0; t < 4; ++t) {
    workers.emplace_back([&mr] {
      for (int i = 0; i < 500; ++i) {
        const std::size_t n = 256 + static_cast<std::size_t>(i % 7) * 256;
        void* p = mr.allocate(n, stream_view{});
        mr.deallocate(p, n, stream_view{});
      }
    });
  }
  for (auto& w : workers) w.join();
  const auto h = mr.history();
  ASSERT_EQ(h.size(), 4000U);
  std::map<void*, std::uint64_t> live;  // address -> seq of the allocation there
  for (const auto& e : h) {
    if (e.kind == tracking_event_kind::allocate) {
      EXPECT_TRUE(live.emplace(e.ptr, e.seq).second) << "an address handed out twice without a free between";
    } else {
      auto it = live.find(e.ptr);
      ASSERT_NE(it, live.end()) << "a free before its allocation";
      EXPECT_EQ(it->second, e.seq);
      live.erase(it);
    }
  }
  EXPECT_TRUE(live.empty());
}

}  // namespace
}  // namespace gpumem::test
