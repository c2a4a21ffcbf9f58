// A capture in progress on one stream while the pools serve others: their queries,
// waits and growth must not invalidate it (Note [Calls a capture elsewhere forbids]
// in src/driver/capture_interaction.hpp). The driver forbids such calls in a
// thread whose interaction mode is global while any thread captures in global
// mode (PyTorch's default), and in the capturing thread itself unless its capture
// is relaxed. On the simulator and on a GPU.
#include <gtest/gtest.h>

#include <cstddef>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "driver/capture_watch_state.hpp"
#include "driver/driver.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/error.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/stream.hpp"
#include "gpumem/vmm_pool_resource.hpp"
#include "support/capture.hpp"

namespace gpumem::test {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

// Work on streams b and c that takes the pools' slow paths: new segments and
// chunks (growth: cuMemAlloc for pool_resource), frees of one stream's blocks on
// the other (fences, and absorbs that look at them), slots taken back, and trims
// that look at every fence (cuEventQuery) and give memory back (cuMemFree).
template <class Pool>
void serve_two_streams(Pool& pool, stream& b, stream& c) {
  const std::size_t sizes[] = {1000, 3 * MiB, 8 * MiB, 40 * MiB};
  std::vector<std::pair<void*, std::size_t>> held;
  for (int round = 0; round < 4; ++round) {
    for (std::size_t bytes : sizes) held.emplace_back(pool.allocate(bytes + round * 4096, b), bytes + round * 4096);
    for (std::size_t k = 0; k < held.size(); ++k) {
      stream& on = k % 2 == 0 ? c : b;  // half freed on the other stream
      pool.deallocate(held[k].first, held[k].second, on);
    }
    held.clear();
    pool.trim();
  }
  for (std::size_t bytes : sizes) pool.deallocate(pool.allocate(bytes, b), bytes, b);
  pool.trim();
}

enum class caller { capturing_thread, other_thread };

// Begins a capture of `captured` in `mode`, runs serve_two_streams on other streams
// from `who`, and checks that the capture ends valid and its graph launches.
template <class Pool>
void expect_capture_untouched(Pool& pool, CUstreamCaptureMode mode, caller who) {
  stream captured(0), b(0), c(0);
  // The pool knows every stream before the capture: no first use under it.
  for (stream* s : {&captured, &b, &c}) pool.deallocate(pool.allocate(256, *s), 256, *s);
  ASSERT_EQ(detail::driver().cuStreamBeginCapture(captured.handle(), mode), CUDA_SUCCESS);
  void* in_graph = pool.allocate(4096, captured);  // the graph's memory
  if (who == caller::capturing_thread) {
    serve_two_streams(pool, b, c);
  } else {
    std::thread t([&] { serve_two_streams(pool, b, c); });
    t.join();
  }
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  ASSERT_EQ(detail::driver().cuStreamIsCapturing(captured.handle(), &status), CUDA_SUCCESS);
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_ACTIVE) << "the pool's calls invalidated the capture";
  CUgraph graph = end_capture_keeping_graph(captured);  // throws if it was invalidated
  CUgraphExec exec = launch_graph(graph, captured);
  pool.deallocate(in_graph, 4096, captured);
  captured.synchronize();
  GPUMEM_CU(cuGraphExecDestroy, exec);
  GPUMEM_CU(cuGraphDestroy, graph);
  b.synchronize();
  c.synchronize();
  EXPECT_EQ(pool.statistics().allocations, 0U);
}

struct capture_case {
  CUstreamCaptureMode mode;
  caller who;
};

// The cases in which the driver forbids a thread's unsafe calls.
constexpr capture_case forbidding_cases[] = {
    {CU_STREAM_CAPTURE_MODE_GLOBAL, caller::capturing_thread},
    {CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, caller::capturing_thread},
    {CU_STREAM_CAPTURE_MODE_GLOBAL, caller::other_thread},
};

// What the simulator models is what the driver does (measured on an H200, driver
// 580): on the GPU this checks the driver, on the simulator the model.
TEST(CaptureElsewhere, TheDriverForbidsUnsafeCallsAsMeasured) {
  detail::device_context_guard guard(0);
  stream captured(0), b(0);
  CUevent done = nullptr;
  GPUMEM_CU(cuEventCreate, &done, CU_EVENT_DISABLE_TIMING);
  GPUMEM_CU(cuEventRecord, done, b.handle());
  b.synchronize();
  struct call {
    const char* name;
    CUresult (*make)(CUstream, CUevent);
    bool unsafe;        // forbidden unless relaxed
    bool every_mode;    // forbidden in every mode
  };
  const call calls[] = {
      {"cuEventQuery", [](CUstream, CUevent e) { return detail::driver().cuEventQuery(e); }, true, false},
      {"cuEventSynchronize", [](CUstream, CUevent e) { return detail::driver().cuEventSynchronize(e); }, true, false},
      {"cuStreamSynchronize", [](CUstream s, CUevent) { return detail::driver().cuStreamSynchronize(s); }, true, false},
      {"cuCtxSynchronize", [](CUstream, CUevent) { return detail::driver().cuCtxSynchronize(); }, true, true},
      {"cuMemAlloc and cuMemFree",
       [](CUstream, CUevent) {
         CUdeviceptr p = 0;
         CUresult r = detail::driver().cuMemAlloc(&p, MiB);
         if (r == CUDA_SUCCESS) r = detail::driver().cuMemFree(p);
         return r;
       },
       true, false},
      {"cuMemAllocManaged",
       [](CUstream, CUevent) {
         CUdeviceptr p = 0;
         CUresult r = detail::driver().cuMemAllocManaged(&p, MiB, CU_MEM_ATTACH_GLOBAL);
         if (r == CUDA_SUCCESS) {
           CUstreamCaptureMode relaxed = CU_STREAM_CAPTURE_MODE_RELAXED;  // the free is not what is checked
           (void)detail::driver().cuThreadExchangeStreamCaptureMode(&relaxed);
           (void)detail::driver().cuMemFree(p);
           (void)detail::driver().cuThreadExchangeStreamCaptureMode(&relaxed);
         }
         return r;
       },
       true, false},
      {"cuMemHostAlloc and cuMemFreeHost",
       [](CUstream, CUevent) {
         void* p = nullptr;
         CUresult r = detail::driver().cuMemHostAlloc(&p, MiB, 0);
         if (r == CUDA_SUCCESS) r = detail::driver().cuMemFreeHost(p);
         return r;
       },
       true, false},
      {"cuEventRecord", [](CUstream s, CUevent e) { return detail::driver().cuEventRecord(e, s); }, false, false},
      {"cuStreamWaitEvent", [](CUstream s, CUevent e) { return detail::driver().cuStreamWaitEvent(s, e, 0); }, false, false},
  };
  for (const call& k : calls) {
    for (const capture_case& m : {capture_case{CU_STREAM_CAPTURE_MODE_GLOBAL, caller::capturing_thread},
                                  capture_case{CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, caller::capturing_thread},
                                  capture_case{CU_STREAM_CAPTURE_MODE_RELAXED, caller::capturing_thread},
                                  capture_case{CU_STREAM_CAPTURE_MODE_GLOBAL, caller::other_thread},
                                  capture_case{CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, caller::other_thread}}) {
      for (bool relaxed : {false, true}) {
        SCOPED_TRACE(testing::Message() << k.name << ", capture mode " << m.mode
                                        << (m.who == caller::other_thread ? ", other thread" : "")
                                        << (relaxed ? ", caller relaxed" : ""));
        ASSERT_EQ(detail::driver().cuStreamBeginCapture(captured.handle(), m.mode), CUDA_SUCCESS);
        CUresult r = CUDA_SUCCESS;
        auto make = [&] {
          detail::device_context_guard inner(0);
          CUstreamCaptureMode mine = CU_STREAM_CAPTURE_MODE_RELAXED;
          if (relaxed) (void)detail::driver().cuThreadExchangeStreamCaptureMode(&mine);
          r = k.make(b.handle(), done);
          if (relaxed) (void)detail::driver().cuThreadExchangeStreamCaptureMode(&mine);
        };
        if (m.who == caller::other_thread) {
          std::thread t(make);
          t.join();
        } else {
          make();
        }
        const bool forbids_here = m.who == caller::capturing_thread ? m.mode != CU_STREAM_CAPTURE_MODE_RELAXED
                                                                    : m.mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
        const bool forbidden = k.every_mode || (k.unsafe && forbids_here && !relaxed);
        EXPECT_EQ(r, forbidden ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS);
        CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
        ASSERT_EQ(detail::driver().cuStreamIsCapturing(captured.handle(), &status), CUDA_SUCCESS);
        EXPECT_EQ(status, forbidden ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE);
        CUgraph g = nullptr;
        const CUresult ended = detail::driver().cuStreamEndCapture(captured.handle(), &g);
        EXPECT_EQ(ended, forbidden ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS);
        if (g != nullptr) GPUMEM_CU(cuGraphDestroy, g);
        b.synchronize();
      }
    }
  }
  GPUMEM_CU(cuEventDestroy, done);
}

TEST(CaptureElsewhere, TheDefaultPoolServesOtherStreamsWithoutInvalidatingIt) {
  for (const capture_case& k : forbidding_cases) {
    SCOPED_TRACE(testing::Message() << "mode " << k.mode << (k.who == caller::other_thread ? ", other thread" : ""));
    vmm_pool_resource pool(0);
    expect_capture_untouched(pool, k.mode, k.who);
  }
}

TEST(CaptureElsewhere, PoolResourceServesOtherStreamsWithoutInvalidatingIt) {
  for (const capture_case& k : forbidding_cases) {
    SCOPED_TRACE(testing::Message() << "mode " << k.mode << (k.who == caller::other_thread ? ", other thread" : ""));
    cuda_resource upstream(0);
    pool_resource pool(upstream);
    expect_capture_untouched(pool, k.mode, k.who);
  }
}

// release() synchronizes the device, which the driver forbids in every mode while
// a stream is captured. A pool whose capture watch runs knows and gives back only
// what is complete; without the watch it cannot know, and the capture is lost
// (docs/pool.md, "A capture elsewhere").
template <class Pool>
void expect_release_beside_a_capture(Pool& pool, bool watched) {
  stream captured(0), b(0);
  for (stream* s : {&captured, &b}) pool.deallocate(pool.allocate(3 * MiB, *s), 3 * MiB, *s);
  begin_capture(captured);
  pool.deallocate(pool.allocate(5 * MiB, b), 5 * MiB, b);
  if (watched) {
    (void)pool.release();
    end_capture(captured);  // throws if the capture was invalidated
  } else {
    EXPECT_THROW((void)pool.release(), cuda_error) << "the driver forbids the synchronisation";
    CUgraph g = nullptr;
    EXPECT_EQ(detail::driver().cuStreamEndCapture(captured.handle(), &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  }
  b.synchronize();
  (void)pool.release();  // after the capture: everything
  EXPECT_EQ(pool.statistics().allocations, 0U);
}

TEST(CaptureElsewhere, AWatchingPoolsReleaseLeavesACaptureValid) {
  {
    vmm_pool_options o;
    o.watch_captures = true;
    vmm_pool_resource pool(0, o);
    if (detail::capture_watch_word_now() != 0) GTEST_SKIP() << "the capture watch did not start here (CUPTI)";
    expect_release_beside_a_capture(pool, true);
  }
  pool_options o;
  o.watch_captures = true;
  cuda_resource upstream(0);
  pool_resource pool(upstream, o);
  expect_release_beside_a_capture(pool, true);
}

TEST(CaptureElsewhere, WithoutTheWatchReleaseInvalidatesACaptureAsTheDriverSays) {
  vmm_pool_resource pool(0);
  expect_release_beside_a_capture(pool, false);
}

TEST(CaptureElsewhere, TheThreadsInteractionModeIsRestoredAfterThePoolsCalls) {
  vmm_pool_resource pool(0);
  stream b(0), c(0);
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
  ASSERT_EQ(detail::driver().cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
  serve_two_streams(pool, b, c);
  CUstreamCaptureMode now = CU_STREAM_CAPTURE_MODE_GLOBAL;
  ASSERT_EQ(detail::driver().cuThreadExchangeStreamCaptureMode(&now), CUDA_SUCCESS);
  EXPECT_EQ(now, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) << "the pool left the thread's mode changed";
}

}  // namespace
}  // namespace gpumem::test
