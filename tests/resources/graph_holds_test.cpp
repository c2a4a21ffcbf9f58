// A block the pool handed out before a capture and freed under it is held for the
// graph being captured, and freed once the driver says that graph is gone (Note
// [A pool block freed under a capture], src/pool/graph_holds.cpp). On the
// simulator and on a GPU, for both pools.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "driver/driver.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/diagnostics.hpp"
#include "gpumem/error.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/stream.hpp"
#include "gpumem/vmm_pool_resource.hpp"
#include "pool/pool_inspector.hpp"
#include "support/capture.hpp"

namespace gpumem::test {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

template <class Pool>
class GraphHolds : public ::testing::Test {};

struct default_pool {
  vmm_pool_resource pool{0};
};
struct pool_over_cuda {
  cuda_resource upstream{0};
  pool_resource pool{upstream};
};
using pools = ::testing::Types<default_pool, pool_over_cuda>;
TYPED_TEST_SUITE(GraphHolds, pools);

// A block and a slot (the default pool's large requests), as a capture frees them.
const std::size_t sizes[] = {1000, 8 * MiB};

TYPED_TEST(GraphHolds, HeldUntilTheGraphAndEveryExecutableAreGone) {
  for (std::size_t bytes : sizes) {
    TypeParam p;
    stream s(0);
    void* block = p.pool.allocate(bytes, s);
    begin_capture(s);
    const std::size_t used = p.pool.statistics().used_bytes;
    p.pool.deallocate(block, bytes, s);
    CUgraph graph = end_capture_keeping_graph(s);
    CUgraphExec first = launch_graph(graph, s);
    CUgraphExec second = launch_graph(graph, s);
    GPUMEM_CU(cuGraphDestroy, graph);
    GPUMEM_CU(cuGraphExecDestroy, first);
    (void)p.pool.trim();  // a slow path: takes back what graphs gave up, nothing of a live one
    EXPECT_EQ(p.pool.statistics().used_bytes, used) << "an executable graph may still run: held";
    EXPECT_EQ(detail::pool_inspector::violations(p.pool), "");
    // Launched, then destroyed at once: the launch holds it until it is done.
    {
      detail::device_context_guard guard(0);
      GPUMEM_CU(cuGraphLaunch, second, s.handle());
    }
    GPUMEM_CU(cuGraphExecDestroy, second);
    s.synchronize();
    EXPECT_TRUE(wait_for_used_below(p.pool, used)) << bytes << " bytes: the graph is gone, its block not back";
    EXPECT_EQ(p.pool.statistics().used_bytes, 0U);
    EXPECT_EQ(detail::pool_inspector::violations(p.pool), "");
    void* again = p.pool.allocate(bytes, s);  // the pool serves it as any free block
    p.pool.deallocate(again, bytes, s);
  }
}

TYPED_TEST(GraphHolds, AGraphDroppedUnlaunchedGivesItBack) {
  TypeParam p;
  stream s(0);
  void* block = p.pool.allocate(1000, s);
  begin_capture(s);
  p.pool.deallocate(block, 1000, s);
  GPUMEM_CU(cuGraphDestroy, end_capture_keeping_graph(s));
  EXPECT_TRUE(wait_for_used_below(p.pool, 1));
  EXPECT_EQ(detail::pool_inspector::violations(p.pool), "");
}

TYPED_TEST(GraphHolds, BadFreesUnderACaptureAreRefusedAndChangeNothing) {
  TypeParam p;
  stream s(0), other(0);
  void* mine = p.pool.allocate(1000, s);
  void* theirs = p.pool.allocate(1000, other);
  {
    capture_on capture(s);
    EXPECT_THROW(p.pool.deallocate(mine, 999, s), logic_error) << "not its size";
    try {
      p.pool.deallocate(theirs, 1000, s);  // its fence would have to be recorded on the captured stream
      ADD_FAILURE() << "a block of another stream was taken back under a capture";
    } catch (const logic_error& e) {
      EXPECT_NE(std::string(e.what()).find("captured into a CUDA graph"), std::string::npos) << e.what();
    }
    int on_stack = 0;
    EXPECT_THROW(p.pool.deallocate(&on_stack, 4, s), logic_error) << "not the pool's";
    p.pool.deallocate(mine, 1000, s);
    EXPECT_THROW(p.pool.deallocate(mine, 1000, s), logic_error) << "freed twice";
    EXPECT_EQ(p.pool.statistics().allocations, 1U);
    EXPECT_EQ(detail::pool_inspector::violations(p.pool), "");
  }
  EXPECT_THROW(p.pool.deallocate(mine, 1000, s), logic_error) << "freed twice, after the capture";
  p.pool.deallocate(theirs, 1000, other);
  other.synchronize();
  EXPECT_TRUE(wait_for_used_below(p.pool, 1));
  EXPECT_EQ(p.pool.statistics().allocations, 0U);
}

TYPED_TEST(GraphHolds, AnInvalidatedCaptureFreesAtOnce) {
  TypeParam p;
  stream s(0);
  void* block = p.pool.allocate(1000, s);
  const std::size_t used = p.pool.statistics().used_bytes;
  GPUMEM_CU(cuStreamBeginCapture, s.handle(), CU_STREAM_CAPTURE_MODE_GLOBAL);
  {
    // A call global mode forbids this thread: the driver invalidates the capture.
    detail::device_context_guard guard(0);
    CUdeviceptr forbidden = 0;
    ASSERT_EQ(detail::driver().cuMemAlloc(&forbidden, MiB), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  }
  p.pool.deallocate(block, 1000, s);  // nothing of this capture will run
  EXPECT_LT(p.pool.statistics().used_bytes, used);
  CUgraph graph = nullptr;
  EXPECT_EQ(detail::driver().cuStreamEndCapture(s.handle(), &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(graph, nullptr);
  EXPECT_EQ(detail::pool_inspector::violations(p.pool), "");
}

TYPED_TEST(GraphHolds, APoolDestroyedBeforeTheGraphSaysSo) {
  std::vector<std::string> said;
  diagnostic_sink previous = set_diagnostic_sink([&](diagnostic_level, std::string_view m) { said.emplace_back(m); });
  stream s(0);
  CUgraph graph = nullptr;
  {
    TypeParam p;
    void* block = p.pool.allocate(1000, s);
    begin_capture(s);
    p.pool.deallocate(block, 1000, s);
    graph = end_capture_keeping_graph(s);
  }
  GPUMEM_CU(cuGraphDestroy, graph);  // after its pool: the driver's call writes nothing of the pool's
  set_diagnostic_sink(std::move(previous));
  bool warned = false;
  for (const std::string& m : said) warned |= m.find("held for their graphs") != std::string::npos;
  EXPECT_TRUE(warned);
}

// Short of memory while a graph holds a block, the out_of_memory says so; once
// the graph is gone the same request is served.
template <class Pool>
void expect_out_of_memory_names_what_graphs_hold(Pool& pool) {
  stream s(0);
  void* block = pool.allocate(40 * MiB, s);
  begin_capture(s);
  pool.deallocate(block, 40 * MiB, s);
  CUgraph graph = end_capture_keeping_graph(s);
  try {
    pool.deallocate(pool.allocate(40 * MiB, s), 40 * MiB, s);
    ADD_FAILURE() << "served past the maximum while a graph holds 40 MiB";
  } catch (const out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find("bytes of blocks freed under a CUDA graph capture are held"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(detail::pool_inspector::violations(pool), "");
  GPUMEM_CU(cuGraphDestroy, graph);
  EXPECT_TRUE(wait_for_used_below(pool, 1));
  pool.deallocate(pool.allocate(40 * MiB, s), 40 * MiB, s);  // the held block's memory, free again
}

TEST(GraphHoldsShort, TheDefaultPoolsOutOfMemoryNamesWhatGraphsHold) {
  vmm_pool_options o;
  o.maximum_bytes = 64 * MiB;
  vmm_pool_resource pool(0, o);
  expect_out_of_memory_names_what_graphs_hold(pool);
}

TEST(GraphHoldsShort, PoolResourcesOutOfMemoryNamesWhatGraphsHold) {
  cuda_resource upstream(0);
  pool_options o;
  o.maximum_bytes = 64 * MiB;
  pool_resource pool(upstream, o);
  expect_out_of_memory_names_what_graphs_hold(pool);
}

}  // namespace
}  // namespace gpumem::test
