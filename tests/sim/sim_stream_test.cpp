// Simulator: streams run their work in order on their own workers, concurrently
// with each other, and follow the legacy default stream's rules.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <mutex>
#include <thread>
#include <vector>

#include "sim_test_support.hpp"

namespace gpumem::sim_test {
namespace {

class sim_stream_test : public sim_test {
 protected:
  CUstream make_stream(unsigned int flags = CU_STREAM_NON_BLOCKING) {
    CUstream s = nullptr;
    EXPECT_EQ(cu().cuStreamCreate(&s, flags), CUDA_SUCCESS);
    created_.push_back(s);
    return s;
  }
  void TearDown() override {
    for (CUstream s : created_) EXPECT_EQ(cu().cuStreamDestroy(s), CUDA_SUCCESS);
    sim_test::TearDown();
  }

  // A log host functions append to, in the order they run.
  struct run_log {
    std::mutex mutex;
    std::vector<int> order;
    void add(int i) {
      std::lock_guard lock(mutex);
      order.push_back(i);
    }
    std::vector<int> get() {
      std::lock_guard lock(mutex);
      return order;
    }
  };

 private:
  std::vector<CUstream> created_;
};

TEST_F(sim_stream_test, work_on_one_stream_runs_in_fifo_order) {
  CUstream s = make_stream();
  run_log log;
  std::vector<int> expected;
  for (int i = 0; i < 200; ++i) {
    ASSERT_EQ(launch(s, [&log, i] { log.add(i); }), CUDA_SUCCESS);
    expected.push_back(i);
  }
  ASSERT_EQ(cu().cuStreamSynchronize(s), CUDA_SUCCESS);
  EXPECT_EQ(log.get(), expected);
}

TEST_F(sim_stream_test, work_runs_asynchronously_and_query_reports_it) {
  CUstream s = make_stream();
  gate& g = new_gate();
  ASSERT_EQ(launch(s, [&] { g.wait(); }), CUDA_SUCCESS);  // returns before the work ran
  EXPECT_EQ(cu().cuStreamQuery(s), CUDA_ERROR_NOT_READY);
  g.open();
  ASSERT_EQ(cu().cuStreamSynchronize(s), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuStreamQuery(s), CUDA_SUCCESS);
}

TEST_F(sim_stream_test, a_blocked_stream_does_not_block_another) {
  CUstream blocked = make_stream();
  CUstream free_running = make_stream();
  gate& g = new_gate();
  std::atomic<bool> blocked_ran{false}, other_ran{false};
  ASSERT_EQ(launch(blocked, [&] { g.wait(); blocked_ran = true; }), CUDA_SUCCESS);
  ASSERT_EQ(launch(free_running, [&] { other_ran = true; }), CUDA_SUCCESS);

  EXPECT_TRUE(eventually([&] { return cu().cuStreamQuery(free_running) == CUDA_SUCCESS; }));
  EXPECT_TRUE(other_ran);
  EXPECT_FALSE(blocked_ran);
  EXPECT_EQ(cu().cuStreamQuery(blocked), CUDA_ERROR_NOT_READY);
  g.open();
  ASSERT_EQ(cu().cuStreamSynchronize(blocked), CUDA_SUCCESS);
  EXPECT_TRUE(blocked_ran);
}

TEST_F(sim_stream_test, create_flags_and_priority) {
  CUstream s = nullptr;
  EXPECT_EQ(cu().cuStreamCreate(&s, 2), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuStreamCreate(nullptr, CU_STREAM_DEFAULT), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cu().cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, -1), CUDA_SUCCESS);
  run_log log;
  ASSERT_EQ(launch(s, [&] { log.add(1); }), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamSynchronize(s), CUDA_SUCCESS);
  EXPECT_EQ(log.get(), std::vector<int>{1});
  EXPECT_EQ(cu().cuStreamDestroy(s), CUDA_SUCCESS);
}

TEST_F(sim_stream_test, stream_device_is_the_creating_context_device) {
  CUstream on_device1 = nullptr;
  {
    current_device d1(1);
    ASSERT_EQ(cu().cuStreamCreate(&on_device1, CU_STREAM_DEFAULT), CUDA_SUCCESS);
    CUdevice dev = -1;
    ASSERT_EQ(cu().cuStreamGetDevice(nullptr, &dev), CUDA_SUCCESS);
    EXPECT_EQ(dev, 1);  // the default stream: the current context's device
  }
  CUdevice dev = -1;
  ASSERT_EQ(cu().cuStreamGetDevice(on_device1, &dev), CUDA_SUCCESS);
  EXPECT_EQ(dev, 1);  // whatever is current now
  ASSERT_EQ(cu().cuStreamGetDevice(CU_STREAM_LEGACY, &dev), CUDA_SUCCESS);
  EXPECT_EQ(dev, 0);
  ASSERT_EQ(cu().cuStreamGetDevice(CU_STREAM_PER_THREAD, &dev), CUDA_SUCCESS);
  EXPECT_EQ(dev, 0);
  EXPECT_EQ(cu().cuStreamGetDevice(on_device1, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuStreamDestroy(on_device1), CUDA_SUCCESS);
}

TEST_F(sim_stream_test, destroy_returns_at_once_and_queued_work_still_runs) {
  CUstream s = nullptr;
  ASSERT_EQ(cu().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  gate& g = new_gate();
  std::atomic<bool> ran{false};
  ASSERT_EQ(launch(s, [&] { g.wait(); }), CUDA_SUCCESS);
  ASSERT_EQ(launch(s, [&] { ran = true; }), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamDestroy(s), CUDA_SUCCESS);  // does not wait for the gate
  EXPECT_FALSE(ran);
  EXPECT_EQ(cu().cuStreamQuery(s), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(launch(s, [] {}), CUDA_ERROR_INVALID_HANDLE);
  g.open();
  // cuCtxSynchronize also waits for destroyed streams' queued work.
  ASSERT_EQ(cu().cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_TRUE(ran);
}

TEST_F(sim_stream_test, ctx_synchronize_waits_for_every_stream_of_the_context) {
  CUstream a = make_stream();
  CUstream b = make_stream(CU_STREAM_DEFAULT);
  std::atomic<int> done{0};
  for (CUstream s : {a, b, static_cast<CUstream>(nullptr)}) {
    ASSERT_EQ(launch(s, [&] { std::this_thread::sleep_for(20ms); ++done; }), CUDA_SUCCESS);
  }
  ASSERT_EQ(cu().cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(done, 3);
}

TEST_F(sim_stream_test, invalid_handles_are_reported_not_dereferenced) {
  int not_a_stream = 0;
  auto bogus = reinterpret_cast<CUstream>(&not_a_stream);
  CUdevice dev = -1;
  EXPECT_EQ(cu().cuStreamSynchronize(bogus), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu().cuStreamQuery(bogus), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu().cuStreamGetDevice(bogus, &dev), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu().cuStreamDestroy(bogus), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(launch(bogus, [] {}), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu().cuStreamDestroy(nullptr), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu().cuStreamDestroy(CU_STREAM_LEGACY), CUDA_ERROR_INVALID_HANDLE);
  CUstream s = nullptr;
  ASSERT_EQ(cu().cuStreamCreate(&s, CU_STREAM_DEFAULT), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamDestroy(s), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuStreamDestroy(s), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu().cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu().cuLaunchHostFunc(nullptr, nullptr, nullptr), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(sim_stream_test, host_functions_may_not_call_the_driver) {
  CUstream s = make_stream();
  CUresult from_host_function[4] = {};
  ASSERT_EQ(launch(s,
                   [&] {
                     CUdeviceptr p = 0;
                     CUcontext ctx = nullptr;
                     from_host_function[0] = cu().cuMemAlloc(&p, 4096);
                     from_host_function[1] = cu().cuStreamSynchronize(nullptr);
                     from_host_function[2] = cu().cuCtxGetCurrent(&ctx);
                     from_host_function[3] = cu().cuInit(0);
                   }),
            CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamSynchronize(s), CUDA_SUCCESS);
  for (CUresult r : from_host_function) EXPECT_EQ(r, CUDA_ERROR_NOT_PERMITTED);
}

// ---- the legacy default stream ----

TEST_F(sim_stream_test, legacy_stream_waits_for_earlier_work_on_blocking_streams) {
  CUstream blocking = make_stream(CU_STREAM_DEFAULT);
  gate& g = new_gate();
  run_log log;
  ASSERT_EQ(launch(blocking, [&] { g.wait(); log.add(1); }), CUDA_SUCCESS);
  ASSERT_EQ(launch(nullptr, [&] { log.add(2); }), CUDA_SUCCESS);
  std::this_thread::sleep_for(settle_time);
  EXPECT_EQ(cu().cuStreamQuery(nullptr), CUDA_ERROR_NOT_READY);
  EXPECT_TRUE(log.get().empty());
  g.open();
  ASSERT_EQ(cu().cuStreamSynchronize(CU_STREAM_LEGACY), CUDA_SUCCESS);
  EXPECT_EQ(log.get(), (std::vector<int>{1, 2}));
}

TEST_F(sim_stream_test, legacy_stream_does_not_wait_for_non_blocking_streams) {
  CUstream non_blocking = make_stream(CU_STREAM_NON_BLOCKING);
  gate& g = new_gate();
  std::atomic<bool> legacy_ran{false};
  ASSERT_EQ(launch(non_blocking, [&] { g.wait(); }), CUDA_SUCCESS);
  ASSERT_EQ(launch(nullptr, [&] { legacy_ran = true; }), CUDA_SUCCESS);
  EXPECT_TRUE(eventually([&] { return legacy_ran.load(); }));
  EXPECT_EQ(cu().cuStreamQuery(non_blocking), CUDA_ERROR_NOT_READY);
  g.open();
}

TEST_F(sim_stream_test, blocking_streams_wait_for_earlier_legacy_work_non_blocking_do_not) {
  CUstream blocking = make_stream(CU_STREAM_DEFAULT);
  CUstream non_blocking = make_stream(CU_STREAM_NON_BLOCKING);
  gate& g = new_gate();
  run_log log;
  ASSERT_EQ(launch(CU_STREAM_LEGACY, [&] { g.wait(); log.add(1); }), CUDA_SUCCESS);
  ASSERT_EQ(launch(blocking, [&] { log.add(2); }), CUDA_SUCCESS);
  ASSERT_EQ(launch(non_blocking, [&] { log.add(3); }), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamSynchronize(non_blocking), CUDA_SUCCESS);  // not held by the legacy stream
  std::this_thread::sleep_for(settle_time);
  EXPECT_EQ(log.get(), std::vector<int>{3});
  EXPECT_EQ(cu().cuStreamQuery(blocking), CUDA_ERROR_NOT_READY);
  g.open();
  ASSERT_EQ(cu().cuStreamSynchronize(blocking), CUDA_SUCCESS);
  EXPECT_EQ(log.get(), (std::vector<int>{3, 1, 2}));
}

TEST_F(sim_stream_test, legacy_rules_are_per_context) {
  CUstream blocking_on_device1 = nullptr;
  {
    current_device d1(1);
    ASSERT_EQ(cu().cuStreamCreate(&blocking_on_device1, CU_STREAM_DEFAULT), CUDA_SUCCESS);
  }
  gate& g = new_gate();
  std::atomic<bool> legacy0_ran{false};
  ASSERT_EQ(launch(blocking_on_device1, [&] { g.wait(); }), CUDA_SUCCESS);
  ASSERT_EQ(launch(nullptr, [&] { legacy0_ran = true; }), CUDA_SUCCESS);  // device 0's legacy stream
  EXPECT_TRUE(eventually([&] { return legacy0_ran.load(); }));
  g.open();
  EXPECT_EQ(cu().cuStreamSynchronize(blocking_on_device1), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuStreamDestroy(blocking_on_device1), CUDA_SUCCESS);
}

TEST_F(sim_stream_test, synchronous_memcpy_waits_for_blocking_streams) {
  CUstream blocking = make_stream(CU_STREAM_DEFAULT);
  int source = 0, destination = -1;
  ASSERT_EQ(launch(blocking, [&] { std::this_thread::sleep_for(50ms); source = 42; }), CUDA_SUCCESS);
  // Queued on the legacy stream, so it runs after the blocking stream's write.
  ASSERT_EQ(cu().cuMemcpy(reinterpret_cast<CUdeviceptr>(&destination),
                          reinterpret_cast<CUdeviceptr>(&source), sizeof source),
            CUDA_SUCCESS);
  EXPECT_EQ(destination, 42);
}

using sim_stream_DeathTest = sim_test;

// Leaves streams busy, blocked and waiting on each other, then exits the process.
[[noreturn]] void exit_with_streams_alive() {
  // Never destroyed: the blocked stream's host function may start waiting after exit()
  // has begun running destructors, so a static gate could be used after its destruction.
  static gate& never_opened = *new gate;
  CUstream busy = nullptr, blocked = nullptr;
  CUevent e = nullptr;
  const bool ok = cu().cuStreamCreate(&busy, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS &&
                  cu().cuStreamCreate(&blocked, CU_STREAM_DEFAULT) == CUDA_SUCCESS &&
                  cu().cuEventCreate(&e, CU_EVENT_DEFAULT) == CUDA_SUCCESS &&
                  launch(busy, [] { std::this_thread::sleep_for(20ms); }) == CUDA_SUCCESS &&
                  launch(blocked, [] { never_opened.wait(); }) == CUDA_SUCCESS &&
                  cu().cuEventRecord(e, blocked) == CUDA_SUCCESS &&
                  cu().cuStreamWaitEvent(busy, e, 0) == CUDA_SUCCESS &&
                  launch(nullptr, [] {}) == CUDA_SUCCESS;  // the legacy stream waits for `blocked`
  std::exit(ok ? 0 : 1);
}

// As with the driver: a query or synchronization of a capturing stream fails and
// invalidates the capture, whose end then fails; the stream leaves capture all the same.
TEST_F(sim_stream_test, a_query_under_capture_fails_and_invalidates_the_capture) {
  CUstream s = make_stream();
  CUstreamCaptureStatus status{};
  for (int call = 0; call < 3; ++call) {
    ASSERT_EQ(cu().cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CUdevice dev{};
    const CUresult r = call == 0 ? cu().cuStreamGetDevice(s, &dev)
                     : call == 1 ? cu().cuStreamQuery(s)
                                 : cu().cuStreamSynchronize(s);
    EXPECT_EQ(r, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) << "call " << call;
    ASSERT_EQ(cu().cuStreamIsCapturing(s, &status), CUDA_SUCCESS);
    EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    CUgraph g = reinterpret_cast<CUgraph>(1);
    EXPECT_EQ(cu().cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    EXPECT_EQ(g, nullptr);
    ASSERT_EQ(cu().cuStreamIsCapturing(s, &status), CUDA_SUCCESS);
    EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_NONE);
  }
  // A capture nothing invalidated ends with a graph.
  ASSERT_EQ(cu().cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamIsCapturing(s, &status), CUDA_SUCCESS);
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CUgraph g = nullptr;
  ASSERT_EQ(cu().cuStreamEndCapture(s, &g), CUDA_SUCCESS);
  EXPECT_NE(g, nullptr);
  EXPECT_EQ(cu().cuGraphDestroy(g), CUDA_SUCCESS);
}

// As with the driver's graph memory nodes: cuMemAllocAsync under capture is an
// allocation node whose memory the graph owns (cuMemFree refuses it), a free node
// under the capture gives it back, and cuMemFreeAsync after the capture frees it in
// stream order; none of it invalidates the capture, and a launch runs in order.
TEST_F(sim_stream_test, allocations_under_capture_are_the_graphs_memory) {
  constexpr std::size_t bytes = std::size_t{1} << 20;
  CUstream s = make_stream();
  std::size_t free_before = 0;
  std::size_t total = 0;
  ASSERT_EQ(cu().cuMemGetInfo(&free_before, &total), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  CUdeviceptr temporary = 0;
  CUdeviceptr kept = 0;
  ASSERT_EQ(cu().cuMemAllocAsync(&temporary, bytes, s), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemAllocAsync(&kept, bytes, s), CUDA_SUCCESS);
  std::size_t free_now = 0;
  ASSERT_EQ(cu().cuMemGetInfo(&free_now, &total), CUDA_SUCCESS);
  EXPECT_LE(free_now, free_before - 2 * bytes) << "the graph's memory is the device's";
  EXPECT_EQ(cu().cuMemFree(temporary), CUDA_ERROR_INVALID_VALUE) << "only a stream-ordered free frees it";
  EXPECT_EQ(cu().cuMemFreeAsync(temporary, s), CUDA_SUCCESS);  // a free node
  CUgraph g = nullptr;
  ASSERT_EQ(cu().cuStreamEndCapture(s, &g), CUDA_SUCCESS) << "nothing invalidated the capture";
  CUgraphExec exec = nullptr;
  ASSERT_EQ(cu().cuGraphInstantiateWithFlags(&exec, g, CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH),
            CUDA_SUCCESS);
  EXPECT_EQ(cu().cuGraphLaunch(exec, s), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemFreeAsync(kept, s), CUDA_SUCCESS);  // after the capture: in stream order
  EXPECT_EQ(cu().cuMemFreeAsync(kept, s), CUDA_ERROR_INVALID_VALUE) << "freed twice";
  ASSERT_EQ(cu().cuStreamSynchronize(s), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemGetInfo(&free_now, &total), CUDA_SUCCESS);
  EXPECT_EQ(free_now, free_before);
  EXPECT_EQ(cu().cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuGraphDestroy(g), CUDA_SUCCESS);

  // A graph never launched made nothing: a free outside the capture fails, as the
  // driver's does, and holds nothing.
  ASSERT_EQ(cu().cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemAllocAsync(&kept, bytes, s), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamEndCapture(s, &g), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuGraphDestroy(g), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemFreeAsync(kept, s), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cu().cuMemGetInfo(&free_now, &total), CUDA_SUCCESS);
  EXPECT_EQ(free_now, free_before);
}

// As measured with the driver on an H200 (docs/pool.md, "CUDA graphs"): the graph
// being captured is named by cuStreamGetCaptureInfo and takes user objects; their
// references go once the graph and every executable of it are gone and their
// launches done; an invalidated capture's graph goes at its end, and its graph
// memory calls fail meanwhile.
TEST_F(sim_stream_test, user_objects_go_with_the_last_of_a_graph_and_its_executables) {
  CUstream s = make_stream();
  std::atomic<int> destroyed{0};
  auto retain_in_capture = [&] {
    CUstreamCaptureStatus status{};
    cuuint64_t id = 0;
    CUgraph capturing = nullptr;
    EXPECT_EQ(cu().cuStreamGetCaptureInfo(s, &status, &id, &capturing, nullptr, nullptr, nullptr), CUDA_SUCCESS);
    EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
    EXPECT_NE(capturing, nullptr);
    CUuserObject o = nullptr;
    EXPECT_EQ(cu().cuUserObjectCreate(&o, &destroyed, [](void* p) { ++*static_cast<std::atomic<int>*>(p); }, 1,
                                      CU_USER_OBJECT_NO_DESTRUCTOR_SYNC),
              CUDA_SUCCESS);
    EXPECT_EQ(cu().cuGraphRetainUserObject(capturing, o, 1, CU_GRAPH_USER_OBJECT_MOVE), CUDA_SUCCESS);
    return id;
  };
  ASSERT_EQ(cu().cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  const cuuint64_t first = retain_in_capture();
  CUgraph g = nullptr;
  ASSERT_EQ(cu().cuStreamEndCapture(s, &g), CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  ASSERT_EQ(cu().cuGraphInstantiateWithFlags(&exec, g, 0), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuGraphDestroy(g), CUDA_SUCCESS);
  EXPECT_EQ(destroyed.load(), 0) << "an executable of the graph lives";
  // The launch waits behind a host function that holds the stream.
  std::atomic<bool> release{false};
  ASSERT_EQ(cu().cuLaunchHostFunc(
                s, [](void* p) { while (!static_cast<std::atomic<bool>*>(p)->load()) std::this_thread::yield(); },
                &release),
            CUDA_SUCCESS);
  EXPECT_EQ(cu().cuGraphLaunch(exec, s), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(destroyed.load(), 0) << "its launch is not done";
  release = true;
  ASSERT_EQ(cu().cuStreamSynchronize(s), CUDA_SUCCESS);
  for (int i = 0; i < 1000 && destroyed.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(destroyed.load(), 1);

  // Invalidated: the graph memory calls fail, and its end drops the graph.
  ASSERT_EQ(cu().cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  EXPECT_NE(retain_in_capture(), first) << "each capture has an id of its own";
  CUdeviceptr made = 0;
  ASSERT_EQ(cu().cuMemAllocAsync(&made, 4096, s), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuStreamQuery(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUstreamCaptureStatus status{};
  CUgraph capturing = reinterpret_cast<CUgraph>(1);
  ASSERT_EQ(cu().cuStreamGetCaptureInfo(s, &status, nullptr, &capturing, nullptr, nullptr, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  EXPECT_EQ(capturing, nullptr);
  CUdeviceptr more = 0;
  EXPECT_EQ(cu().cuMemAllocAsync(&more, 4096, s), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(cu().cuMemFreeAsync(made, s), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(destroyed.load(), 1);
  EXPECT_EQ(cu().cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(destroyed.load(), 2) << "the invalidated capture's graph went at its end";
  CUstreamCaptureStatus none{};
  EXPECT_EQ(cu().cuStreamGetCaptureInfo(s, &none, nullptr, nullptr, nullptr, nullptr, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(none, CU_STREAM_CAPTURE_STATUS_NONE);
}

// The simulator is never torn down, so exiting with streams alive neither crashes nor hangs.
TEST_F(sim_stream_DeathTest, process_exits_cleanly_with_streams_alive) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(exit_with_streams_alive(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace gpumem::sim_test
