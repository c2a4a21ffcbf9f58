// Stream capture for the pools' capture tests (Note [Pools and stream capture] in
// src/stream_device.hpp): beginning and ending one, launching its graph, and what a
// pool must do while one is in progress.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#include "driver/driver.hpp"
#include "gpumem/error.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/stream.hpp"

namespace gpumem::test {

inline void begin_capture(stream_view s) {
  // Relaxed: the test thread may still make other driver calls (cuMemAlloc) meanwhile.
  GPUMEM_CU(cuStreamBeginCapture, s.handle(), CU_STREAM_CAPTURE_MODE_RELAXED);
}

// Throws if the capture was invalidated.
inline void end_capture(stream_view s) {
  CUgraph g = nullptr;
  GPUMEM_CU(cuStreamEndCapture, s.handle(), &g);
  GPUMEM_CU(cuGraphDestroy, g);
}

// A capture for a scope, or until end().
struct capture_on {
  explicit capture_on(stream_view st) : s(st.handle()) { begin_capture(s); }
  ~capture_on() { end(); }
  void end() {
    if (s == nullptr) return;
    end_capture(s);
    s = nullptr;
  }
  CUstream s;
};

// Ends the capture of `s` and returns its graph, which the caller destroys.
// Throws if the capture was invalidated.
inline CUgraph end_capture_keeping_graph(stream_view s) {
  CUgraph g = nullptr;
  GPUMEM_CU(cuStreamEndCapture, s.handle(), &g);
  return g;
}

// Instantiates `g` as PyTorch does (its allocations may stay unfreed between
// launches), launches it on `s` and waits for it; the caller destroys the result.
inline CUgraphExec launch_graph(CUgraph g, stream_view s) {
  detail::device_context_guard guard(s.device());  // instantiating needs the device's context
  CUgraphExec exec = nullptr;
  GPUMEM_CU(cuGraphInstantiateWithFlags, &exec, g, CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
  GPUMEM_CU(cuGraphLaunch, exec, s.handle());
  GPUMEM_CU(cuStreamSynchronize, s.handle());
  return exec;
}

// While `s` is captured, `pool` hands out the graph's own memory for requests of
// `bytes` (never its blocks), frees it under the capture (a free node) and after
// it (once the graph ran), refuses to take back a block it handed out before the
// capture, serves another stream, and is intact afterwards (Note [Pools and stream
// capture] in src/stream_device.hpp).
template <class Pool>
inline void expect_graph_memory_under_capture(Pool& pool, stream& s, std::size_t bytes) {
  stream other(0);
  void* before = pool.allocate(bytes, s);
  const std::size_t live_before = pool.statistics().allocations;
  begin_capture(s);
  void* temporary = pool.allocate(bytes, s);
  EXPECT_EQ(pool.statistics().allocations, live_before) << "the graph's memory, not the pool's";
  pool.deallocate(temporary, bytes, s);  // a free node of the graph
  void* kept = pool.allocate(bytes, s);  // freed after the capture
  EXPECT_THROW(pool.deallocate(kept, bytes + 1, s), logic_error) << "not its size";
  EXPECT_THROW(pool.trim(s), logic_error) << "its fence would join the capture";
  try {
    pool.deallocate(before, bytes, s);
    ADD_FAILURE() << "a block handed out before the capture was taken back under it";
  } catch (const logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("captured into a CUDA graph"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("after it"), std::string::npos) << e.what();
  }
  // Another stream, not captured, is served meanwhile (asked, for a watching pool).
  void* elsewhere = pool.allocate(4096, other);
  pool.deallocate(elsewhere, 4096, other);
  CUgraph graph = end_capture_keeping_graph(s);  // throws if the pool's calls invalidated the capture
  CUgraphExec exec = launch_graph(graph, s);
  pool.deallocate(kept, bytes, s);  // the graph's allocation, freed outside the capture
  EXPECT_THROW(pool.deallocate(kept, bytes, s), logic_error) << "freed twice";
  s.synchronize();
  GPUMEM_CU(cuGraphExecDestroy, exec);
  GPUMEM_CU(cuGraphDestroy, graph);
  EXPECT_EQ(pool.statistics().allocations, live_before) << "the refused free left the block allocated";
  pool.deallocate(before, bytes, s);
  void* after = pool.allocate(bytes, s);
  pool.deallocate(after, bytes, s);
  s.synchronize();
  other.synchronize();
  EXPECT_EQ(pool.statistics().allocations, 0U);
}

}  // namespace gpumem::test
