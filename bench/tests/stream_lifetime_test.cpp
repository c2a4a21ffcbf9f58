// The streams a workload hands a row's resource are destroyed after it: W5's
// replays of a log (Note [The replay's streams outlive the resource] in
// workloads/w5_replay.cpp) and W3's threads (also made before it).
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "bench.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/error.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/stream.hpp"
#include "workloads/registry.hpp"

namespace gpumem::bench {
namespace {

std::atomic<int> resources_destroyed{0};
std::atomic<int> streams_gone_before_the_resource{0};
std::atomic<int> streams_seen{0};

// A pool that remembers every stream it is handed and, when destroyed, asks
// each one whether it is still there, as an allocator that keeps a record per
// stream (PyTorch's expandable segments) does when it empties its cache.
class stream_keeping_resource final : public memory_resource {
 public:
  explicit stream_keeping_resource(int device)
      : pool_(std::make_shared<cuda_resource>(device)) {}
  ~stream_keeping_resource() override {
    for (CUstream h : seen_) {
      try {
        (void)stream_view{h}.ready();
      } catch (const cuda_error&) {
        ++streams_gone_before_the_resource;
      }
    }
    streams_seen += static_cast<int>(seen_.size());
    ++resources_destroyed;
  }

 private:
  void note(stream_view s) {
    std::lock_guard lock(mutex_);
    if (s.handle() != nullptr) seen_.insert(s.handle());
  }
  void* do_allocate(std::size_t bytes, stream_view s, std::size_t alignment) override {
    note(s);
    return pool_.allocate(bytes, s, alignment);
  }
  void do_deallocate(void* p, std::size_t bytes, stream_view s, std::size_t alignment) override {
    note(s);
    pool_.deallocate(p, bytes, s, alignment);
  }
  resource_properties properties() const noexcept override { return pool_.properties(); }

  pool_resource pool_;
  std::mutex mutex_;
  std::set<CUstream> seen_;
};

const subject keeper{"stream keeper", subject_kind::peer,
                     [](int device) -> std::shared_ptr<memory_resource> {
                       return std::make_shared<stream_keeping_resource>(device);
                     }};

// A short run, with the counts from zero.
options short_run() {
  resources_destroyed = 0;
  streams_gone_before_the_resource = 0;
  streams_seen = 0;
  options opts;
  opts.quick = true;
  opts.reps = 1;
  opts.rep_seconds = 0.001;
  opts.cell_budget_seconds = 1;
  return opts;
}

// Every cell measured, and no stream gone before the resource that was handed it.
void expect_measured_with_every_stream_alive(const std::vector<cell>& cells) {
  for (const cell& c : cells) EXPECT_EQ(c.status, cell_status::ok) << c.message;
  EXPECT_EQ(streams_gone_before_the_resource.load(), 0);
}

TEST(BenchStreams, TheLogsStreamsOutliveTheRowsResource) {
  options opts = short_run();
  // Two threads, each on a stream of its own (not the default stream).
  opts.traces = {std::string(GPUMEM_BENCH_TRACE_DIR "/example-training.csv")};
  const context ctx{opts, 0};
  const std::vector<cell> cells = w5_replay().measure(keeper, ctx);
  ASSERT_EQ(cells.size(), 3u);  // time, memory, out-of-memory for the one log
  expect_measured_with_every_stream_alive(cells);
  EXPECT_EQ(resources_destroyed.load(), 2) << "one resource for time and memory, one for the out-of-memory replay";
  EXPECT_GT(streams_seen.load(), 0) << "the log's streams reached the resource";
}

TEST(BenchStreams, TheThreadsStreamsOutliveTheRowsResource) {
  const options opts = short_run();
  const context ctx{opts, 0};
  const std::vector<cell> cells = w3_threads().measure(keeper, ctx);
  ASSERT_FALSE(cells.empty());
  expect_measured_with_every_stream_alive(cells);
  EXPECT_EQ(resources_destroyed.load(), 3) << "a resource for each thread count: 1, 4 and 16";
  EXPECT_EQ(streams_seen.load(), 1 + 4 + 16) << "each thread's own stream";
}

}  // namespace
}  // namespace gpumem::bench
