// tracking_adaptor: what it records, its checks, leak reports (on demand, at
// destruction, at exit) and snapshots in the log format.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "adaptors/adaptor_test_support.hpp"
#include "gpumem/adaptors/tracking.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/error.hpp"
#include "gpumem/pool_resource.hpp"
#include "support/touch.hpp"

namespace gpumem::test {
namespace {

// Not inlined, so that it is a frame of its own in captured stacks.
__attribute__((noinline)) void* allocate_from_a_named_site(memory_resource& mr, std::size_t n, stream_view s) {
  void* p = mr.allocate(n, s);
  asm volatile("" ::: "memory");
  return p;
}

TEST(TrackingAdaptor, RecordsEveryLiveAllocation) {
  tracking_options o;
  o.report_at_exit = false;
  tracking_adaptor mr(std::make_shared<pool_resource>(std::make_shared<cuda_resource>(0)), o);
  stream a(0);
  stream b(0);
  void* p = mr.allocate(1000, a);
  void* q = mr.allocate(5000, b, 4096);
  void* r = mr.allocate(64, a);
  mr.deallocate(r, 64, a);
  const auto live = mr.live();
  ASSERT_EQ(live.size(), 2U);
  EXPECT_EQ(live[0].ptr, p);
  EXPECT_EQ(live[0].bytes, 1000U);
  EXPECT_EQ(live[0].stream, a.view());
  EXPECT_EQ(live[0].seq, 1U);
  EXPECT_EQ(live[1].ptr, q);
  EXPECT_EQ(live[1].alignment, 4096U);
  EXPECT_EQ(live[1].stream, b.view());
  EXPECT_EQ(live[1].seq, 2U);
  EXPECT_LE(live[0].time_ns, live[1].time_ns);
  EXPECT_EQ(live[0].thread, live[1].thread);
  EXPECT_TRUE(live[0].stack.empty()) << "stacks are off by default";
  EXPECT_EQ(mr.live_count(), 2U);
  EXPECT_EQ(mr.live_bytes(), 6000U);
  device_fill(q, 5000, 0x12, b);
  EXPECT_EQ(device_count_mismatches(q, 5000, 0x12, b), 0U);
  mr.deallocate(p, 1000, a);
  mr.deallocate(q, 5000, b, 4096);
  EXPECT_EQ(mr.live_count(), 0U);
  EXPECT_EQ(mr.leak_report(), "");
}

TEST(TrackingAdaptor, CapturesTheAllocatingStackOutsideGpumem) {
  tracking_options o;
  o.capture_stacks = true;
  o.report_at_exit = false;
  tracking_adaptor mr(std::make_shared<cuda_resource>(0), o);
  void* p = allocate_from_a_named_site(mr, 256, stream_view{});
  const auto live = mr.live();
  ASSERT_EQ(live.size(), 1U);
  ASSERT_FALSE(live[0].stack.empty());
  EXPECT_LE(live[0].stack.size(), 16U);
  for (const std::string& frame : live[0].stack) {
    EXPECT_EQ(frame.find("libgpumem"), std::string::npos) << "gpumem's own frames are left out: " << frame;
  }
  mr.deallocate(p, 256, stream_view{});
}

TEST(TrackingAdaptor, RejectsForeignDoubleAndResizedFreesAndStaysConsistent) {
  tracking_options o;
  o.report_at_exit = false;
  auto up = std::make_shared<scripted_resource>(0);
  tracking_adaptor mr(up, o);
  void* p = mr.allocate(4096, stream_view{});
  void* foreign = up->real().allocate(256, stream_view{});
  EXPECT_THROW(mr.deallocate(foreign, 256, stream_view{}), logic_error);
  EXPECT_THROW(mr.deallocate(p, 4095, stream_view{}), logic_error);
  EXPECT_THROW(mr.deallocate(static_cast<char*>(p) + 256, 256, stream_view{}), logic_error);
  EXPECT_EQ(up->deallocations.load(), 0) << "rejected before the upstream was called";
  // The upstream refuses a free: the allocation stays tracked.
  up->fail_deallocation_number = 1;
  EXPECT_THROW(mr.deallocate(p, 4096, stream_view{}), cuda_error);
  EXPECT_EQ(mr.live_count(), 1U);
  mr.deallocate(p, 4096, stream_view{});
  EXPECT_THROW(mr.deallocate(p, 4096, stream_view{}), logic_error);
  EXPECT_EQ(mr.live_count(), 0U);
  up->real().deallocate(foreign, 256, stream_view{});
}

TEST(TrackingAdaptor, LeakReportOnDemandAndAtDestruction) {
  auto up = std::make_shared<cuda_resource>(0);
  void* leaked = nullptr;
  testing::internal::CaptureStderr();
  {
    tracking_options o;
    o.capture_stacks = true;
    o.report_limit = 2;
    tracking_adaptor mr(up, o);
    leaked = allocate_from_a_named_site(mr, 3000, stream_view{});
    void* x = mr.allocate(100, stream_view{});
    void* y = mr.allocate(200, stream_view{});
    const std::string report = mr.leak_report();
    EXPECT_NE(report.find("3 allocation(s), 3300 bytes"), std::string::npos) << report;
    EXPECT_NE(report.find("3000 bytes, stream 0x0"), std::string::npos) << report;
    EXPECT_NE(report.find("... and 1 more"), std::string::npos) << report;
    EXPECT_NE(report.find("#0 "), std::string::npos) << "stacks are listed: " << report;
    mr.deallocate(x, 100, stream_view{});
    mr.deallocate(y, 200, stream_view{});
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("1 allocation(s), 3000 bytes"), std::string::npos) << err;
  EXPECT_NE(err.find("as the adaptor is destroyed"), std::string::npos) << err;
  up->deallocate(leaked, 3000, stream_view{});
}

TEST(TrackingAdaptorDeathTest, ReportsLeaksAtExit) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        // Never destroyed (a global keeps it reachable, so LeakSanitizer does not object).
        static tracking_adaptor* mr = new tracking_adaptor(std::make_shared<cuda_resource>(0));
        mr->allocate(777, stream_view{});
        std::exit(0);
      },
      testing::ExitedWithCode(0), "1 allocation\\(s\\), 777 bytes .*still live at exit");
}

TEST(TrackingAdaptor, SnapshotIsALogOfTheLiveAllocations) {
  tracking_options o;
  o.report_at_exit = false;
  o.capture_stacks = true;
  tracking_adaptor mr(std::make_shared<cuda_resource>(0), o);
  stream s(0);
  void* a = mr.allocate(1000, s);
  void* b = allocate_from_a_named_site(mr, 2000, s);
  temp_path file("snapshot.csv");
  mr.write_snapshot(file.str());
  const csv_file csv = read_csv(file.str());
  ASSERT_EQ(csv.header.front(), "seq");
  ASSERT_EQ(csv.rows.size(), 2U);
  EXPECT_EQ(csv.rows[0].at("op"), "allocate");
  EXPECT_EQ(csv.rows[0].at("source"), "snapshot");
  EXPECT_EQ(to_u64(csv.rows[0].at("ptr")), reinterpret_cast<std::uintptr_t>(a));
  EXPECT_EQ(csv.rows[1].at("bytes"), "2000");
  EXPECT_EQ(to_u64(csv.rows[1].at("stream")), reinterpret_cast<std::uintptr_t>(s.handle()));
  EXPECT_FALSE(csv.rows[1].at("site").empty());
  EXPECT_THROW(mr.write_snapshot("/nonexistent-dir/x.csv"), logic_error);
  mr.deallocate(a, 1000, s);
  mr.deallocate(b, 2000, s);
}

TEST(TrackingAdaptor, ManyThreads) {
  tracking_options o;
  o.report_at_exit = false;
  tracking_adaptor mr(std::make_shared<pool_resource>(std::make_shared<cuda_resource>(0)), o);
  std::vector<std::thread> workers;
  std::vector<std::vector<std::pair<void*, std::size_t>>> kept(6);
  for (int t = 0; t < 6; ++t) {
    workers.emplace_back([&, t] {
      stream mine(0);
      for (int i = 0; i < 300; ++i) {
        const std::size_t n = 256 + static_cast<std::size_t>(i * 7 + t);
        void* p = mr.allocate(n, mine);
        if (i % 10 == 0) kept[t].emplace_back(p, n);
        else mr.deallocate(p, n, mine);
      }
      mine.synchronize();
    });
  }
  for (auto& w : workers) w.join();
  std::size_t count = 0, bytes = 0;
  for (auto& v : kept) {
    count += v.size();
    for (auto [p, n] : v) bytes += n;
  }
  EXPECT_EQ(mr.live_count(), count);
  EXPECT_EQ(mr.live_bytes(), bytes);
  for (auto& v : kept) {
    for (auto [p, n] : v) mr.deallocate(p, n, stream_view{});
  }
  EXPECT_EQ(mr.live_count(), 0U);
}

TEST(TrackingAdaptor, AStackDepthOutsideItsRangeIsRefusedNamingTheField) {
  cuda_resource upstream(0);
  for (int depth : {0, -1, 257, 1 << 30}) {
    tracking_options o;
    o.capture_stacks = true;
    o.stack_depth = depth;
    try {
      tracking_adaptor mr(upstream, o);
      ADD_FAILURE() << "stack_depth " << depth << " accepted";
    } catch (const logic_error& e) {
      EXPECT_NE(std::string(e.what()).find("stack_depth"), std::string::npos) << e.what();
    }
  }
  tracking_options deepest;
  deepest.capture_stacks = true;
  deepest.stack_depth = 256;
  tracking_adaptor mr(upstream, deepest);
  stream s(0);
  void* p = mr.allocate(256, s);
  EXPECT_EQ(mr.live_count(), 1U);
  mr.deallocate(p, 256, s);
}

}  // namespace
}  // namespace gpumem::test
