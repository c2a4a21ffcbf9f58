// Stream capture for the pools' capture tests (Note [Pools and stream capture] in
// src/stream_device.hpp): beginning and ending one, launching its graph, and what a
// pool must do while one is in progress.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <thread>

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

// Waits, up to ten seconds, until `pool` holds less than `used_bytes` in use: a
// block held for a graph comes back once the driver says the graph is gone, which
// a GPU's driver says on a thread of its own, a little later (Note [A pool block
// freed under a capture], src/pool/graph_holds.cpp). True if it did.
template <class Pool>
inline bool wait_for_used_below(Pool& pool, std::size_t used_bytes) {
  for (int i = 0; i < 1000; ++i) {
    if (pool.statistics().used_bytes < used_bytes) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// While `s` is captured, `pool` hands out the graph's own memory for requests of
// `bytes` (never its blocks), frees it under the capture (a free node) and after
// it (once the graph ran), holds a block it handed out before the capture and
// freed under it until the graph is gone, serves another stream, and is intact
// afterwards (Note [Pools and stream capture] in src/stream_device.hpp).
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
  EXPECT_THROW(pool.deallocate(before, bytes + 1, s), logic_error) << "not its size";
  const std::size_t used = pool.statistics().used_bytes;
  pool.deallocate(before, bytes, s);  // held for the graph
  EXPECT_EQ(pool.statistics().allocations, live_before - 1) << "freed";
  EXPECT_EQ(pool.statistics().used_bytes, used) << "held for the graph, still in use";
  EXPECT_THROW(pool.deallocate(before, bytes, s), logic_error) << "freed twice";
  // Another stream, not captured, is served meanwhile (asked, for a watching pool).
  void* elsewhere = pool.allocate(4096, other);
  pool.deallocate(elsewhere, 4096, other);
  CUgraph graph = end_capture_keeping_graph(s);  // throws if the pool's calls invalidated the capture
  CUgraphExec exec = launch_graph(graph, s);
  pool.deallocate(kept, bytes, s);  // the graph's allocation, freed outside the capture
  EXPECT_THROW(pool.deallocate(kept, bytes, s), logic_error) << "freed twice";
  s.synchronize();
  GPUMEM_CU(cuGraphExecDestroy, exec);
  EXPECT_EQ(pool.statistics().used_bytes, used) << "the graph still lives: its block is still held";
  GPUMEM_CU(cuGraphDestroy, graph);
  EXPECT_TRUE(wait_for_used_below(pool, used)) << "the graph is gone, and its block not back";
  void* after = pool.allocate(bytes, s);
  pool.deallocate(after, bytes, s);
  s.synchronize();
  other.synchronize();
  EXPECT_EQ(pool.statistics().allocations, 0U);
  EXPECT_EQ(pool.statistics().used_bytes, 0U);
}

}  // namespace gpumem::test
