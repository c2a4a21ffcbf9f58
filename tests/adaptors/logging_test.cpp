// logging_adaptor and event_log: the rows and their columns, outcomes, order by
// seq across threads, shared logs with two sources, flushing at thread exit,
// destruction and process exit.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <thread>
#include <unistd.h>
#include <vector>

#include "adaptors/adaptor_test_support.hpp"
#include "gpumem/adaptors/limiting.hpp"
#include "gpumem/adaptors/logging.hpp"
#include "gpumem/config.hpp"
#include "gpumem/pool_resource.hpp"
#include "support/touch.hpp"

namespace gpumem::test {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

std::vector<csv_row> by_seq(csv_file f) {
  std::sort(f.rows.begin(), f.rows.end(),
            [](const csv_row& a, const csv_row& b) { return to_u64(a.at("seq")) < to_u64(b.at("seq")); });
  return f.rows;
}

TEST(LoggingAdaptor, OneRowPerCallWithItsOutcome) {
  temp_path file("log.csv");
  stream s(0);
  {
    auto limited = std::make_shared<limiting_adaptor>(std::make_shared<cuda_resource>(0), 4 * MiB);
    logging_adaptor mr(limited, file.str());
    void* p = mr.allocate(3 * MiB, s, 512);
    EXPECT_THROW(mr.allocate(2 * MiB, s), out_of_memory);
    int on_stack = 0;
    EXPECT_THROW(mr.deallocate(&on_stack, 4, s), logic_error);
    device_fill(p, 3 * MiB, 1, s);
    mr.deallocate(p, 3 * MiB, s, 512);
    EXPECT_EQ(mr.log()->events(), 4U);
    EXPECT_EQ(mr.log()->path(), file.str());
  }  // destruction flushes
  const csv_file csv = read_csv(file.str());
  EXPECT_EQ(csv.header, (std::vector<std::string>{"seq", "time_ns", "thread", "device", "stream", "source",
                                                  "op", "ptr", "bytes", "alignment", "outcome", "site"}));
  const auto rows = by_seq(csv);
  ASSERT_EQ(rows.size(), 4U);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(to_u64(rows[i].at("seq")), i + 1);
    EXPECT_EQ(rows[i].at("device"), "0");
    EXPECT_EQ(rows[i].at("source"), "app");
    EXPECT_EQ(to_u64(rows[i].at("stream")), reinterpret_cast<std::uintptr_t>(s.handle()));
    if (i > 0) {
      EXPECT_GE(to_u64(rows[i].at("time_ns")), to_u64(rows[i - 1].at("time_ns")));
    }
  }
  EXPECT_EQ(rows[0].at("op"), "allocate");
  EXPECT_EQ(rows[0].at("bytes"), "3145728");
  EXPECT_EQ(rows[0].at("alignment"), "512");
  EXPECT_EQ(rows[0].at("outcome"), "ok");
  EXPECT_NE(to_u64(rows[0].at("ptr")), 0U);
  EXPECT_EQ(rows[1].at("outcome"), "oom");
  EXPECT_EQ(rows[1].at("ptr"), "0x0");
  EXPECT_EQ(rows[2].at("op"), "deallocate");
  EXPECT_EQ(rows[2].at("outcome"), "logic_error");
  EXPECT_EQ(rows[3].at("op"), "deallocate");
  EXPECT_EQ(rows[3].at("ptr"), rows[0].at("ptr"));
  EXPECT_EQ(rows[3].at("outcome"), "ok");
}

TEST(LoggingAdaptor, SequenceNumbersOrderEveryFreeBeforeTheReuseOfItsMemory) {
  // Threads churn through one stream's arena of a pool, so freed blocks are
  // reused at once by other threads. Replayed in seq order, no address may be
  // handed out twice.
  temp_path file("order.csv");
  {
    pool_options o;
    o.min_chunk_bytes = o.max_chunk_bytes = 4 * MiB;
    logging_adaptor mr(std::make_shared<pool_resource>(std::make_shared<cuda_resource>(0), o), file.str());
    stream shared(0);
    std::vector<std::thread> workers;
    for (int t = 0; t < 6; ++t) {
      workers.emplace_back([&, t] {
        for (int i = 0; i < 400; ++i) {
          const std::size_t n = 256 * static_cast<std::size_t>(1 + (i + t) % 8);
          void* p = mr.allocate(n, shared);
          mr.deallocate(p, n, shared);
        }
      });
    }
    for (auto& w : workers) w.join();
    shared.synchronize();
  }
  const auto rows = by_seq(read_csv(file.str()));
  ASSERT_EQ(rows.size(), 6U * 400U * 2U);
  std::set<std::string> live;
  std::set<std::string> threads;
  std::map<std::string, std::set<std::string>> threads_of_ptr;  // who got each address
  for (const csv_row& r : rows) {
    ASSERT_EQ(r.at("outcome"), "ok");
    threads.insert(r.at("thread"));
    if (r.at("op") == "allocate") {
      threads_of_ptr[r.at("ptr")].insert(r.at("thread"));
      ASSERT_TRUE(live.insert(r.at("ptr")).second) << "seq " << r.at("seq") << ": " << r.at("ptr")
                                                    << " handed out while live";
    } else {
      ASSERT_EQ(live.erase(r.at("ptr")), 1U) << "seq " << r.at("seq") << ": free of a pointer not live";
    }
  }
  EXPECT_EQ(threads.size(), 6U);
  std::size_t shared_addresses = 0;
  for (const auto& [ptr, who] : threads_of_ptr) shared_addresses += who.size() > 1 ? 1 : 0;
  EXPECT_GT(shared_addresses, 0U) << "the test needs memory reused across threads";
  EXPECT_EQ(to_u64(rows.back().at("seq")), rows.size()) << "seq numbers are dense: no event lost";
}

TEST(LoggingAdaptor, AThreadsEventsAreWrittenWhenItExits) {
  temp_path file("thread-exit.csv");
  logging_adaptor mr(std::make_shared<cuda_resource>(0), file.str());
  void* p = nullptr;
  std::thread([&] { p = mr.allocate(4096, stream_view{}); }).join();
  const csv_file csv = read_csv(file.str());  // no flush() yet
  ASSERT_EQ(csv.rows.size(), 1U);
  EXPECT_EQ(csv.rows[0].at("bytes"), "4096");
  mr.deallocate(p, 4096, stream_view{});
}

TEST(LoggingAdaptor, RingsLargerThanTheirCapacityAreWrittenInFull) {
  temp_path file("many.csv");
  {
    logging_adaptor mr(std::make_shared<pool_resource>(std::make_shared<cuda_resource>(0)), file.str());
    stream s(0);
    for (int i = 0; i < 10000; ++i) {
      void* p = mr.allocate(512, s);
      mr.deallocate(p, 512, s);
    }
  }
  const auto rows = by_seq(read_csv(file.str()));
  ASSERT_EQ(rows.size(), 20000U);
  EXPECT_EQ(to_u64(rows.back().at("seq")), 20000U);
}

TEST(LoggingAdaptor, SharedLogWithTheUpstreamsEvents) {
  // What GPUMEM_CONF=pool,log=... builds: the program's calls and the pool's chunks.
  temp_path file("two-sources.csv");
  {
    auto mr = make_resource_from_config("pool,sites,log=" + file.str(), 0);
    stream s(0);
    void* p = mr->allocate(3 * MiB, s);
    mr->deallocate(p, 3 * MiB, s);
  }
  const auto rows = by_seq(read_csv(file.str()));
  std::vector<std::string> sequence;
  for (const auto& r : rows) sequence.push_back(r.at("source") + ":" + r.at("op"));
  // The pool reserves a chunk before it hands out the block, and gives it back when destroyed.
  ASSERT_EQ(sequence, (std::vector<std::string>{"upstream:allocate", "app:allocate", "app:deallocate",
                                                "upstream:deallocate"}));
  EXPECT_GE(to_u64(rows[0].at("bytes")), 3 * MiB);
  EXPECT_FALSE(rows[1].at("site").empty()) << "sites were asked for";
  EXPECT_TRUE(rows[0].at("site").empty());
}

TEST(LoggingAdaptor, BadLogsAreLogicErrors) {
  EXPECT_THROW(logging_adaptor(std::make_shared<cuda_resource>(0), "/nonexistent-dir/log.csv"), logic_error);
  EXPECT_THROW(logging_adaptor(std::make_shared<cuda_resource>(0), std::shared_ptr<event_log>{}), logic_error);
  temp_path file("bad-source.csv");
  EXPECT_THROW(logging_adaptor(std::make_shared<cuda_resource>(0), file.str(), logging_options{"", false}),
               logic_error);
}

TEST(LoggingAdaptor, PercentPInThePathIsTheProcessId) {
  temp_path dir_file("pid-%p.csv");
  const std::string expected = [&] {
    std::string s = dir_file.str();
    s.replace(s.find("%p"), 2, std::to_string(::getpid()));
    return s;
  }();
  {
    logging_adaptor mr(std::make_shared<cuda_resource>(0), dir_file.str());
    EXPECT_EQ(mr.log()->path(), expected);
  }
  EXPECT_EQ(read_csv(expected).header.front(), "seq");
  std::remove(expected.c_str());
}

TEST(LoggingAdaptorDeathTest, FlushesAtExitWhenNeverDestroyed) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // The death test's child runs this body again in a new process: it finds the
  // parent's path in the environment.
  temp_path file("exit.csv");
  if (std::getenv("GPUMEM_TEST_EXIT_LOG") == nullptr) ::setenv("GPUMEM_TEST_EXIT_LOG", file.str().c_str(), 1);
  const std::string path = std::getenv("GPUMEM_TEST_EXIT_LOG");
  EXPECT_EXIT(
      {
        // Never destroyed (a global keeps it reachable, so LeakSanitizer does not object).
        static logging_adaptor* mr = new logging_adaptor(std::make_shared<cuda_resource>(0), path);
        for (int i = 0; i < 3; ++i) mr->allocate(1000 + i, stream_view{});
        std::exit(0);
      },
      testing::ExitedWithCode(0), "");
  ::unsetenv("GPUMEM_TEST_EXIT_LOG");
  const csv_file csv = read_csv(path);
  ASSERT_EQ(csv.rows.size(), 3U);
  EXPECT_EQ(csv.rows[2].at("bytes"), "1002");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace gpumem::test
