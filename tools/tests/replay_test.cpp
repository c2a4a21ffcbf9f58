// gpumem-replay: a recorded log replays with the original peak, with its threads
// and streams, in either order, and on a smaller simulated device it reports the
// failures.
#include <gtest/gtest.h>

#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/event_log_reader.hpp"
#include "gpumem/adaptors/logging.hpp"
#include "gpumem/adaptors/resource_adaptor.hpp"
#include "gpumem/adaptors/statistics.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/error.hpp"
#include "gpumem/pool_resource.hpp"
#include "replay/replay.hpp"
#include "tools_test_support.hpp"

namespace gpumem::test {
namespace {

using tools::read_event_log;
using tools::replay_events;
using tools::replay_options;
using tools::replay_order;

constexpr std::size_t MiB = std::size_t{1} << 20;

// A churning single-threaded workload on two streams, through
// logging(statistics(pool(statistics(cuda)))): the statistics give the original
// peaks of live and of reserved bytes (exact: one thread).
struct recorded {
  std::size_t allocations = 0;
  std::size_t peak_live = 0;
  std::size_t peak_reserved = 0;
};

recorded record_single_thread(const std::string& path) {
  auto reserved = std::make_shared<statistics_adaptor>(std::make_shared<cuda_resource>(0));
  auto pool = std::make_shared<pool_resource>(reserved);
  auto live = std::make_shared<statistics_adaptor>(pool);
  recorded r;
  {
    logging_adaptor mr(live, path);
    stream a(0), b(0);
    std::mt19937_64 rng(11);
    std::vector<std::tuple<void*, std::size_t, stream*>> held;
    for (int i = 0; i < 3000; ++i) {
      if (held.empty() || (held.size() < 300 && rng() % 2 == 0)) {
        stream* s = rng() % 3 == 0 ? &b : &a;
        const std::size_t n = 1 + rng() % ((rng() % 8 == 0) ? 16 * MiB : 64 << 10);
        held.emplace_back(mr.allocate(n, *s), n, s);
        ++r.allocations;
      } else {
        const std::size_t k = rng() % held.size();
        auto [p, n, s] = held[k];
        mr.deallocate(p, n, *s);
        held[k] = held.back();
        held.pop_back();
      }
    }
    for (auto [p, n, s] : held) mr.deallocate(p, n, *s);
    a.synchronize();
    b.synchronize();
  }
  r.peak_live = live->statistics().peak_bytes;
  r.peak_reserved = reserved->statistics().peak_bytes;
  return r;
}

TEST(Replay, ReproducesTheOriginalPeakExactly) {
  temp_file log("single.csv");
  const recorded original = record_single_thread(log.str());
  const auto events = read_event_log(log.str());
  ASSERT_EQ(events.size(), 2 * original.allocations);
  replay_options o;
  o.resource = "pool";
  const auto r = replay_events(events, o);
  EXPECT_EQ(r.log_peak_live_bytes, original.peak_live);
  EXPECT_EQ(r.peak_live_bytes, original.peak_live) << "the replay's peak of live bytes is the original's";
  EXPECT_EQ(r.peak_reserved_bytes, original.peak_reserved)
      << "the same pool given the same calls reserves the same";
  EXPECT_EQ(r.failures, 0U);
  EXPECT_EQ(r.replayed, 2 * original.allocations);
  EXPECT_EQ(r.threads, 1U);
  EXPECT_EQ(r.streams, 2U);
  EXPECT_EQ(r.left_live, 0U);
  // Against cuda_resource, what is reserved is what is live.
  o.resource = "cuda";
  const auto c = replay_events(events, o);
  EXPECT_EQ(c.peak_live_bytes, original.peak_live);
  EXPECT_EQ(c.peak_reserved_bytes, original.peak_live);
  EXPECT_TRUE(c.reserved_counted);
  // Against pools that take device memory inside the resource, it is not counted.
  for (const char* base : {"async", "vmm"}) {
    o.resource = base;
    const auto v = replay_events(events, o);
    EXPECT_EQ(v.peak_live_bytes, original.peak_live) << base;
    EXPECT_EQ(v.failures, 0U) << base;
    EXPECT_FALSE(v.reserved_counted) << base;
    EXPECT_EQ(v.peak_reserved_bytes, 0U) << base;
  }
  o.resource = "managed";
  const auto m = replay_events(events, o);
  EXPECT_TRUE(m.reserved_counted);
  EXPECT_EQ(m.peak_reserved_bytes, original.peak_live) << "managed memory is taken per allocation";
}

TEST(Replay, KeepsTheOrderOfManyThreadsAndStreams) {
  temp_file log("threads.csv");
  std::size_t allocations = 0;
  {
    logging_adaptor mr(std::make_shared<pool_resource>(std::make_shared<cuda_resource>(0)), log.str());
    std::mutex handoff_mutex;
    std::vector<std::pair<void*, std::size_t>> handoff;
    std::vector<std::thread> workers;
    std::atomic<std::size_t> count{0};
    // All alive until every thread is done: a stream destroyed early could hand its
    // handle to the next one made, and the log would show fewer streams.
    std::vector<stream> streams;
    for (int t = 0; t < 4; ++t) streams.emplace_back(0);
    for (int t = 0; t < 4; ++t) {
      workers.emplace_back([&, t] {
        stream& mine = streams[static_cast<std::size_t>(t)];
        std::mt19937 rng(static_cast<unsigned>(t + 1));
        std::vector<std::pair<void*, std::size_t>> held;
        for (int i = 0; i < 500; ++i) {
          if (held.size() < 40 && rng() % 2 == 0) {
            const std::size_t n = 1 + rng() % (2 * MiB);
            held.emplace_back(mr.allocate(n, mine), n);
            ++count;
          } else if (!held.empty()) {
            auto [p, n] = held.back();
            held.pop_back();
            if (rng() % 5 == 0) {  // freed later by another thread, on its stream
              std::lock_guard lock(handoff_mutex);
              handoff.emplace_back(p, n);
            } else {
              mr.deallocate(p, n, mine);
            }
          }
          std::pair<void*, std::size_t> theirs{nullptr, 0};
          {
            std::lock_guard lock(handoff_mutex);
            if (!handoff.empty() && rng() % 3 == 0) {
              theirs = handoff.back();
              handoff.pop_back();
            }
          }
          if (theirs.first != nullptr) mr.deallocate(theirs.first, theirs.second, mine);
        }
        for (auto [p, n] : held) mr.deallocate(p, n, mine);
        mine.synchronize();
      });
    }
    for (auto& w : workers) w.join();
    for (auto [p, n] : handoff) mr.deallocate(p, n, stream_view{});  // what was left: the main thread
    allocations = count;
  }
  const auto events = read_event_log(log.str());
  replay_options o;
  const auto r = replay_events(events, o);
  EXPECT_EQ(r.peak_live_bytes, r.log_peak_live_bytes) << "seq order gives the original peak exactly";
  EXPECT_EQ(r.failures, 0U);
  EXPECT_EQ(r.allocations, allocations);
  EXPECT_EQ(r.replayed, 2 * allocations);
  EXPECT_GE(r.threads, 4U);
  EXPECT_GE(r.streams, 4U);
  o.order = replay_order::thread;
  const auto t = replay_events(events, o);
  EXPECT_EQ(t.failures, 0U);
  EXPECT_EQ(t.replayed, 2 * allocations);
  EXPECT_LE(t.peak_live_bytes, t.log_peak_live_bytes * 4) << "a sanity bound";
}

// A log of 20,000 threads (one allocation each, held while the next threads
// allocate): they share at most max_replay_threads OS threads, in seq order, and the
// peak is still the log's.
TEST(Replay, ALogOfTwentyThousandThreadsReplaysOnABoundedNumberOfThreads) {
  std::vector<gpumem::tools::logged_event> events;
  constexpr std::uint32_t threads = 20000;
  std::uint64_t seq = 0;
  auto event = [&seq](std::uint32_t thread, bool allocate, std::uint64_t ptr) {
    return gpumem::tools::logged_event{.seq = ++seq, .thread = thread, .source = "app", .allocate = allocate,
                                       .ptr = ptr, .bytes = 4096, .outcome = "ok", .site = {}, .line = 0};
  };
  for (std::uint32_t t = 0; t < threads; ++t) {
    events.push_back(event(t + 1, true, 0x100000 + std::uint64_t{t} * 4096));
    // Eight live at a time: each thread frees the allocation of the thread 8 before it.
    if (t >= 8) events.push_back(event(t + 1, false, 0x100000 + std::uint64_t{t - 8} * 4096));
  }
  for (const replay_order order : {replay_order::seq, replay_order::thread}) {
    replay_options o;
    o.order = order;
    const auto r = replay_events(events, o);
    EXPECT_EQ(r.threads, threads);
    EXPECT_EQ(r.failures, 0U);
    EXPECT_EQ(r.allocations, threads);
    EXPECT_EQ(r.left_live, 8U);
    if (order == replay_order::seq) {
      EXPECT_EQ(r.peak_live_bytes, r.log_peak_live_bytes);
    }
  }
}

// Records the streams it is asked to allocate on.
class stream_recorder final : public resource_adaptor {
 public:
  explicit stream_recorder(std::shared_ptr<memory_resource> up) : resource_adaptor(std::move(up), "stream_recorder") {}
  std::set<CUstream> seen;

 private:
  void* do_allocate(std::size_t bytes, stream_view s, std::size_t alignment) override {
    seen.insert(s.handle());
    return upstream_allocate(bytes, s, alignment);
  }
  void do_deallocate(void* p, std::size_t bytes, stream_view s, std::size_t alignment) override {
    upstream_deallocate(p, bytes, s, alignment);
  }
};

// W5 makes a log's streams before each row's resource (a resource sized from the
// free memory can leave too little for cuStreamCreate); the replays must then run
// on exactly those streams and make none of their own.
TEST(Replay, StreamsMadeBeforeTheResourceAreTheOnesTheReplayUses) {
  std::uint64_t seq = 0;
  auto event = [&seq](std::uint64_t stream, const char* source, bool allocate, std::uint64_t ptr) {
    return gpumem::tools::logged_event{.seq = ++seq, .thread = 1, .stream = stream, .source = source,
                                       .allocate = allocate, .ptr = ptr, .bytes = 4096, .outcome = "ok",
                                       .site = {}, .line = 0};
  };
  const std::vector<gpumem::tools::logged_event> events = {
      event(0xA, "app", true, 0x1000),      event(0xB, "app", true, 0x2000),
      event(0, "app", true, 0x3000),        event(0xC, "upstream", true, 0x9000),
      event(0xA, "app", false, 0x2000),     event(0xB, "app", false, 0x1000),
      event(0, "app", false, 0x3000),
  };
  tools::replay_stream_set set;
  tools::make_replay_streams(set, events, 0);
  ASSERT_EQ(set.by_logged.size(), 2U) << "0xA and 0xB; the default stream is itself, 0xC is not replayed";
  ASSERT_TRUE(set.by_logged.count(0xA) == 1 && set.by_logged.count(0xB) == 1);
  const CUstream a = set.by_logged.at(0xA)->view().handle();
  const CUstream b = set.by_logged.at(0xB)->view().handle();
  EXPECT_NE(a, b);

  stream_recorder mr(std::make_shared<cuda_resource>(0));
  replay_options o;
  o.streams = &set;
  const auto r = tools::replay_events_on(events, mr, o);
  EXPECT_EQ(r.failures, 0U);
  EXPECT_EQ(r.allocations, 3U);
  EXPECT_EQ(set.by_logged.size(), 2U);
  EXPECT_EQ(set.by_logged.at(0xA)->view().handle(), a);
  EXPECT_EQ(set.by_logged.at(0xB)->view().handle(), b);
  EXPECT_EQ(mr.seen, (std::set<CUstream>{a, b, stream_view{}.handle()}));
}

TEST(Replay, ASmallerSimulatedDeviceShowsTheFailures) {
  temp_file log("small-device.csv");
  record_single_thread(log.str());
  temp_file json("small-device.json");
  const command_result r = run_command(tool_path(GPUMEM_REPLAY_EXE) + " " + log.str() +
                                       " --device-memory 24MiB --resource cuda --json " + json.str());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("on sim device 0 (24.00 MiB)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("out of memory"), std::string::npos) << r.output;
  const std::string j = slurp(json.str());
  EXPECT_NE(j.find("\"backend\":\"sim\""), std::string::npos) << j;
  EXPECT_NE(j.find("\"device_total_bytes\":25165824"), std::string::npos) << j;
  EXPECT_EQ(j.find("\"failures\":0,"), std::string::npos) << "the small device must fail some: " << j;
  // And with room enough, none fail, and the peak is the log's.
  const command_result big = run_command(tool_path(GPUMEM_REPLAY_EXE) + " " + log.str() +
                                         " --device-memory 4GiB --resource pool,maximum=90%");
  ASSERT_EQ(big.status, 0) << big.output;
  EXPECT_NE(big.output.find("failures:       0 allocation(s)"), std::string::npos) << big.output;
}

// The JSON is written by a JSON library: a log's name with a quote and a backslash
// comes back as it was, and the keys keep their order.
TEST(Replay, JsonEscapesTheLogsName) {
  temp_file log("we\"ird\\name.csv");
  record_single_thread(log.str());
  temp_file json("escaped.json");
  const command_result r = run_command(tool_path(GPUMEM_REPLAY_EXE) + " '" + log.str() +
                                       "' --device-memory=1GiB --json=" + json.str());
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string text = slurp(json.str());
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << text;
  EXPECT_EQ(j.at("log").get<std::string>(), log.str()) << text;
  EXPECT_EQ(j.at("tool").get<std::string>(), "gpumem-replay");
  EXPECT_EQ(text.rfind("{\"tool\":\"gpumem-replay\",\"log\":", 0), 0U) << text;
}

TEST(Replay, BadInputIsReported) {
  temp_file not_a_log("bad.csv");
  {
    std::ofstream f(not_a_log.str());
    f << "a,b,c\n1,2,3\n";
  }
  EXPECT_THROW(read_event_log(not_a_log.str()), tools::log_format_error);
  EXPECT_THROW(read_event_log("/nonexistent/log.csv"), tools::log_format_error);
  const command_result r = run_command(tool_path(GPUMEM_REPLAY_EXE) + " " + not_a_log.str());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("not a gpumem event log"), std::string::npos) << r.output;
  EXPECT_EQ(run_command(tool_path(GPUMEM_REPLAY_EXE) + " --order sideways x.csv").status, 2);
  temp_file log("bad-resource.csv");
  record_single_thread(log.str());
  replay_options o;
  o.resource = "pool,frobnicate";
  EXPECT_THROW(replay_events(read_event_log(log.str()), o), logic_error);
}

TEST(Replay, MalformedLogsNameTheFileTheLineAndTheField) {
  const std::string header = "seq,time_ns,thread,device,stream,source,op,ptr,bytes,alignment,outcome,site\n";
  const std::string ok_row = "1,10,1,0,0x1,app,allocate,0x10,4096,256,ok,\n";
  const struct {
    const char* name;
    std::string body;
    const char* says;
  } cases[] = {
      {"header-only", "", "no events after the header"},
      {"cut", ok_row + "2,20,1,0,0x1,app,deall", ":3: 7 fields where the header has 12"},
      {"quote", "1,10,1,0,0x1,app,allocate,0x10,4096,256,ok,\"site\n", ":2: an unterminated quote"},
      {"negative-seq", "-5,10,1,0,0x1,app,allocate,0x10,4096,256,ok,\n", ":2: bad seq \"-5\""},
      {"huge-seq", "18446744073709551615,10,1,0,0x1,app,allocate,0x10,4096,256,ok,\n", "outside [1, 2^63)"},
      {"duplicate-seq", ok_row + "1,20,1,0,0x1,app,deallocate,0x10,4096,256,ok,\n", ":3: seq 1 repeats line 2's"},
      {"negative-bytes", "1,10,1,0,0x1,app,allocate,0x10,-4096,256,ok,\n", ":2: bad bytes \"-4096\""},
      {"zero-bytes", "1,10,1,0,0x1,app,allocate,0x10,0,256,ok,\n", ":2: an allocation of 0 bytes"},
      {"alignment-3", "1,10,1,0,0x1,app,allocate,0x10,4096,3,ok,\n", ":2: alignment 3 is not a power of two"},
  };
  for (const auto& c : cases) {
    temp_file log(std::string("malformed-") + c.name + ".csv");
    {
      std::ofstream f(log.str());
      f << header << c.body;
    }
    try {
      (void)read_event_log(log.str());
      ADD_FAILURE() << c.name << ": read";
    } catch (const tools::log_format_error& e) {
      EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << c.name << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(log.str()), std::string::npos) << c.name << ": names the file";
    }
    for (const char* tool : {GPUMEM_REPLAY_EXE, GPUMEM_REPORT_EXE}) {
      const command_result r = run_command(tool_path(tool) + " " + log.str());
      EXPECT_NE(r.status, 0) << c.name << " " << tool << ": " << r.output;
      EXPECT_NE(r.output.find(c.says), std::string::npos) << c.name << " " << tool << ": " << r.output;
    }
  }
  // A failed request may have asked anything: the log keeps it.
  temp_file failed("failed-huge.csv");
  {
    std::ofstream f(failed.str());
    f << header << "1,10,1,0,0x1,app,allocate,0x0,18446744073709551615,256,oom,\n" << ok_row.substr(0, 0)
      << "2,20,1,0,0x1,app,allocate,0x10,4096,256,ok,\n3,30,1,0,0x1,app,deallocate,0x10,4096,256,ok,\n";
  }
  EXPECT_EQ(read_event_log(failed.str()).size(), 3U);
}

}  // namespace
}  // namespace gpumem::test
