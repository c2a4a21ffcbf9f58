// The graph memory the pools hand out under a capture, across graphs: a graph
// dropped before it ran gives its allocations' addresses back to the driver, which
// hands them to later captures (Note [Freeing a graph's allocation],
// src/pool/graph_allocations.cpp). On the simulator and on a GPU.
#include <gtest/gtest.h>

#include <cstddef>

#include "driver/driver.hpp"
#include "gpumem/backend.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/device.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/stream.hpp"
#include "gpumem/vmm_pool_resource.hpp"
#include "support/capture.hpp"

namespace gpumem::test {
namespace {

// A capture's allocation of `first` bytes, its graph dropped unlaunched; then a
// capture that gets the same address for `second` bytes (the simulator's memory
// is first fit, as the driver's graph addresses were on an H200) and runs. The new
// allocation is freed with its own size, and the pool is left with nothing.
template <class Pool>
void expect_reused_address_served(Pool& pool, std::size_t first, std::size_t second) {
  stream s(0);
  pool.deallocate(pool.allocate(256, s), 256, s);  // the stream's arena, before any capture
  begin_capture(s);
  void* dropped = pool.allocate(first, s);
  GPUMEM_CU(cuGraphDestroy, end_capture_keeping_graph(s));  // never instantiated, never run
  begin_capture(s);
  void* reused = pool.allocate(second, s);
  CUgraph graph = end_capture_keeping_graph(s);
  CUgraphExec exec = launch_graph(graph, s);
  if (current_backend() == backend_kind::sim) {
    EXPECT_EQ(reused, dropped) << "the simulator hands the dropped graph's address out again";
  }
  pool.deallocate(reused, second, s);  // its own size: the stale record was replaced
  s.synchronize();
  GPUMEM_CU(cuGraphExecDestroy, exec);
  GPUMEM_CU(cuGraphDestroy, graph);
  if (reused != dropped) pool.deallocate(dropped, first, s);  // a graph that never ran: done
  EXPECT_EQ(pool.statistics().allocations, 0U);
}

TEST(GraphMemory, TheDefaultPoolServesAnAddressADroppedGraphGaveBack) {
  vmm_pool_resource pool(0);
  expect_reused_address_served(pool, 3000, 2000);
}

TEST(GraphMemory, PoolResourceServesAnAddressADroppedGraphGaveBack) {
  cuda_resource upstream(0);
  pool_resource pool(upstream);
  expect_reused_address_served(pool, 3000, 2000);
}

// The driver keeps the memory of graphs' allocations cached once they are freed
// (seen on an H200: 32-68 MiB of the random capture programs' stayed with it); the
// pools' release() gives that back with their own (cuDeviceGraphMemTrim).
template <class Pool>
void expect_release_gives_graph_memory_back(Pool& pool) {
  constexpr std::size_t bytes = std::size_t{64} << 20;
  stream s(0);
  pool.deallocate(pool.allocate(256, s), 256, s);  // the stream's arena, before the capture
  (void)pool.release();
  const std::size_t free_before = device_memory_info(0).free_bytes;
  begin_capture(s);
  void* made = pool.allocate(bytes, s);  // the graph's
  CUgraph graph = end_capture_keeping_graph(s);
  CUgraphExec exec = launch_graph(graph, s);
  pool.deallocate(made, bytes, s);
  s.synchronize();
  GPUMEM_CU(cuGraphExecDestroy, exec);
  GPUMEM_CU(cuGraphDestroy, graph);
  if (current_backend() == backend_kind::cuda) {
    EXPECT_LT(device_memory_info(0).free_bytes, free_before) << "the driver gave the graph's memory back itself";
  }
  (void)pool.release();
  EXPECT_EQ(device_memory_info(0).free_bytes, free_before);
}

TEST(GraphMemory, TheDefaultPoolsReleaseGivesTheDriversGraphMemoryBack) {
  vmm_pool_resource pool(0);
  expect_release_gives_graph_memory_back(pool);
}

TEST(GraphMemory, PoolResourcesReleaseGivesTheDriversGraphMemoryBack) {
  cuda_resource upstream(0);
  pool_resource pool(upstream);
  expect_release_gives_graph_memory_back(pool);
}

}  // namespace
}  // namespace gpumem::test
