// run_capture_program (capture_program.hpp).
#include "fuzz/capture_program.hpp"

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "driver/driver.hpp"
#include "fuzz/program_input.hpp"
#include "fuzz/vmm_program_checks.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/diagnostics.hpp"
#include "gpumem/error.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/stream.hpp"
#include "gpumem/vmm_pool_resource.hpp"
#include "pool/pool_inspector.hpp"

namespace gpumem::test {
namespace {

struct graph_allocation {
  void* ptr;
  std::size_t bytes;
  int capture;  // the capture it was made under
};

struct pool_allocation {
  void* ptr;
  std::size_t bytes;
};

template <class Pool>
std::string run_on(Pool& pool, program_reader& in) {
  auto& streams = program_streams();
  std::map<std::uintptr_t, pool_allocation> live;   // the pool's
  std::map<std::uintptr_t, graph_allocation> graph;  // the graphs'
  // Allocations of graphs dropped before they ran: gone with their graph (the driver
  // hands their addresses out again), so never freed here (Note [Freeing a graph's
  // allocation]); a new allocation at one's address replaces the pool's record.
  std::map<std::uintptr_t, graph_allocation> dangling;
  // The pool's blocks freed under a capture: held for its graph until that graph
  // is gone (Note [A pool block freed under a capture]), so never handed out meanwhile.
  std::map<std::uintptr_t, graph_allocation> held;
  int capturing = -1;  // the stream under capture
  int capture = 0;     // numbers the captures
  // An allocation short of memory whose last resort, a device synchronisation, the
  // driver refused for the capture (a pool without the watch cannot know of it):
  // the capture is invalidated, and the out_of_memory says so (docs/pool.md).
  bool capture_lost = false;
  // The pool says so as a diagnostic too, when the request is served all the same.
  struct lost_watch {
    bool& lost;
    diagnostic_sink previous;
    explicit lost_watch(bool& l) : lost(l) {
      previous = set_diagnostic_sink([this](diagnostic_level, std::string_view m) {
        if (m.find("is now invalidated") != std::string_view::npos) lost = true;
      });
    }
    ~lost_watch() { set_diagnostic_sink(std::move(previous)); }
  } watch_for_lost{capture_lost};
  // A program that fails mid-capture ends it while the pool lives: the next
  // program starts with no capture, and the pool is not destroyed beside one.
  struct end_left_capture {
    int& capturing;
    ~end_left_capture() {
      if (capturing < 0) return;
      CUgraph g = nullptr;
      (void)detail::driver().cuStreamEndCapture(program_streams()[static_cast<std::size_t>(capturing)].handle(), &g);
      if (g != nullptr) (void)detail::driver().cuGraphDestroy(g);
    }
  } left{capturing};
  // What [a, a + bytes) overlaps: empty if nothing.
  auto overlaps = [&](std::uintptr_t a, std::size_t bytes) -> std::string {
    auto covers = [&](const auto& m) {
      auto next = m.lower_bound(a);
      return (next != m.end() && a + bytes > next->first) ||
             (next != m.begin() && std::prev(next)->first + std::prev(next)->second.bytes > a);
    };
    if (covers(live)) return "a live allocation of the pool";
    if (covers(graph)) return "a graph's allocation";
    if (covers(held)) return "a block held for a graph that may still run";
    return {};
  };
  // The graph of `capture` is gone: its held blocks may come back.
  auto graph_gone = [&](int of) {
    std::erase_if(held, [of](const auto& entry) { return entry.second.capture == of; });
  };
  // The graph of `of` was dropped before it ran: its allocations' addresses went back.
  auto dropped = [&](int of) {
    for (auto it = graph.begin(); it != graph.end();) {
      if (it->second.capture == of) {
        dangling.insert(*it);
        it = graph.erase(it);
      } else {
        ++it;
      }
    }
  };
  auto end_capture = [&]() -> std::string {
    CUstream s = streams[static_cast<std::size_t>(capturing)].handle();
    CUgraph g = nullptr;
    const CUresult r = detail::driver().cuStreamEndCapture(s, &g);
    capturing = -1;
    if (capture_lost) {
      capture_lost = false;
      graph_gone(capture);
      if (r != CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) return "a capture the pool's error said was lost ended otherwise";
      dropped(capture);  // the driver destroyed its graph; freed later, as a graph's that never ran
      return {};
    }
    if (r != CUDA_SUCCESS) return "the capture ended with " + std::to_string(r) + ": the pool invalidated it";
    const bool launch = in.byte() % 2 == 0;
    if (launch) {  // launched once, as PyTorch instantiates; else dropped unlaunched
      detail::device_context_guard guard(0);
      CUgraphExec exec = nullptr;
      GPUMEM_CU(cuGraphInstantiateWithFlags, &exec, g, CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
      GPUMEM_CU(cuGraphLaunch, exec, s);
      GPUMEM_CU(cuStreamSynchronize, s);
      GPUMEM_CU(cuGraphExecDestroy, exec);
    }
    GPUMEM_CU(cuGraphDestroy, g);
    graph_gone(capture);
    if (!launch) dropped(capture);
    return {};
  };
  for (int step = 0; !in.empty() && step < 200; ++step) {
    const std::uint8_t op = in.byte() % 8;
    const int k = in.byte() % 3;
    stream& s = streams[static_cast<std::size_t>(k)];
    if (op <= 2) {  // allocate: a block, a slot or a large one
      const std::size_t bytes = 1 + (static_cast<std::size_t>(in.u16()) << (in.byte() % 9));
      const std::size_t count_before = pool.statistics().allocations;
      void* p = nullptr;
      try {
        p = pool.allocate(bytes, s);
      } catch (const out_of_memory& e) {
        if (std::string(e.what()).find("capture is now invalidated") != std::string::npos) {
          if (capturing < 0) return "an out_of_memory says a capture was invalidated where none was in progress";
          capture_lost = true;
        }
        continue;  // the simulated device is small; frugality is the other programs' to check
      } catch (const cuda_error& e) {
        // The graph's memory under a capture the driver invalidated: it says so.
        if (k == capturing && capture_lost && e.result() == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) continue;
        throw;
      }
      const auto a = reinterpret_cast<std::uintptr_t>(p);
      if (std::string o = overlaps(a, bytes); !o.empty()) {
        return "an allocation " + std::string(k == capturing ? "under capture" : "") + " overlaps " + o;
      }
      if (k == capturing) {
        if (pool.statistics().allocations != count_before) return "an allocation under capture came from the pool";
        graph.emplace(a, graph_allocation{p, bytes, capture});
        dangling.erase(a);
      } else {
        if (pool.statistics().allocations != count_before + 1) return "the pool did not count its allocation";
        live.emplace(a, pool_allocation{p, bytes});
      }
    } else if (op <= 4) {  // free: the pool's, or a graph's
      const bool of_graph = in.byte() % 3 == 0 && !graph.empty();
      if (of_graph) {
        auto it = graph.begin();
        std::advance(it, static_cast<std::ptrdiff_t>(in.u16() % graph.size()));
        const graph_allocation g = it->second;
        // Under its own capture: on the capturing stream (a free node). After it: any stream.
        const bool current = capturing >= 0 && g.capture == capture;
        stream& on = current ? streams[static_cast<std::size_t>(capturing)] : s;
        if (!current && k == capturing) continue;  // a graph's memory is not freed into another graph
        pool.deallocate(g.ptr, g.bytes, on);
        graph.erase(it);
      } else if (!live.empty()) {
        auto it = live.begin();
        std::advance(it, static_cast<std::ptrdiff_t>(in.u16() % live.size()));
        const pool_allocation al = it->second;
        if (k == capturing) {
          try {
            pool.deallocate(al.ptr, al.bytes, s);
          } catch (const logic_error&) {
            continue;  // a block of another stream's arena: its fence would join the capture
          }
          // Held for the graph; freed at once where the capture is lost (nothing of it runs).
          if (!capture_lost) held.emplace(it->first, graph_allocation{al.ptr, al.bytes, capture});
          live.erase(it);
          continue;
        }
        pool.deallocate(al.ptr, al.bytes, s);
        live.erase(it);
      }
    } else if (op == 5) {  // trims: every stream's (beside a capture too), or one stream's
      if (in.byte() % 2 == 0) {
        pool.trim();
      } else if (k == capturing) {
        try {
          pool.trim(s);
          return "trim(stream) of a capturing stream was accepted";
        } catch (const logic_error&) {
        }
      } else {
        pool.trim(s);
      }
    } else if (op == 6) {  // a capture begins or ends
      if (capturing < 0) {
        const CUstreamCaptureMode modes[] = {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                                             CU_STREAM_CAPTURE_MODE_RELAXED};
        GPUMEM_CU(cuStreamBeginCapture, s.handle(), modes[in.byte() % 3]);
        capturing = k;
        ++capture;
      } else if (std::string v = end_capture(); !v.empty()) {
        return v;
      }
    } else {  // checks
      if (pool.statistics().allocations != live.size()) return "statistics count the wrong number of allocations";
      if (std::string v = detail::pool_inspector::violations(pool); !v.empty()) return v;
    }
  }
  if (capturing >= 0) {
    // What is left of the capture's own memory goes under it, as a program would.
    for (auto it = graph.begin(); it != graph.end();) {
      if (it->second.capture == capture) {
        pool.deallocate(it->second.ptr, it->second.bytes, streams[static_cast<std::size_t>(capturing)]);
        it = graph.erase(it);
      } else {
        ++it;
      }
    }
    if (std::string v = end_capture(); !v.empty()) return v;
  }
  for (auto& [a, g] : graph) pool.deallocate(g.ptr, g.bytes, streams[0]);
  for (auto& [a, al] : live) pool.deallocate(al.ptr, al.bytes, streams[0]);
  for (stream& s : streams) s.synchronize();
  if (pool.statistics().allocations != 0) return "allocations left after every free";
  // Every graph is gone: what they held comes back (a GPU's driver says so a little later).
  for (int i = 0; pool.statistics().used_bytes != 0; ++i) {
    if (i == 1000) return "blocks held for graphs that are gone did not come back";
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (std::string v = detail::pool_inspector::violations(pool); !v.empty()) return v;
  (void)pool.release();
  return {};
}

}  // namespace

std::string run_capture_program(const std::uint8_t* data, std::size_t size) {
  program_reader in(data, size);
  const bool vmm = in.byte() % 2 == 0;
  const bool watch = in.byte() % 4 == 0;
  // Now and then a budget, so that the last resort of a short allocation (a device
  // synchronisation) meets the captures on any device, a GPU's too.
  const std::size_t maximum = in.byte() % 3 == 0 ? std::size_t{64} << 20 << (in.byte() % 3) : 0;
  // What the driver keeps for the process's first streams, events and graph, and
  // CUPTI for its first subscriber, is not the pool's (measured on an H200, these
  // programs first in the process: 4 MiB for the streams, 12 MiB at the first pool
  // with the capture watch; the graph is made first in case a driver keeps some too).
  warm_streams(program_streams());
  static const bool watch_warm = [] {
    vmm_pool_options o;
    o.watch_captures = true;
    vmm_pool_resource first_watch(0, o);
    return true;
  }();
  (void)watch_warm;
  static const bool graphs_warm = [] {
    stream& s = program_streams()[0];
    detail::device_context_guard guard(0);
    CUdeviceptr p = 0;
    GPUMEM_CU(cuStreamBeginCapture, s.handle(), CU_STREAM_CAPTURE_MODE_RELAXED);
    GPUMEM_CU(cuMemAllocAsync, &p, std::size_t{1} << 20, s.handle());
    GPUMEM_CU(cuMemFreeAsync, p, s.handle());
    CUgraph g = nullptr;
    GPUMEM_CU(cuStreamEndCapture, s.handle(), &g);
    CUgraphExec exec = nullptr;
    GPUMEM_CU(cuGraphInstantiateWithFlags, &exec, g, CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    GPUMEM_CU(cuGraphLaunch, exec, s.handle());
    GPUMEM_CU(cuStreamSynchronize, s.handle());
    GPUMEM_CU(cuGraphExecDestroy, exec);
    GPUMEM_CU(cuGraphDestroy, g);
    return true;
  }();
  (void)graphs_warm;
  {
    // The driver's cache of graph memory, which earlier programs and tests may have
    // left, goes first: the pool's release() at the end gives this program's back.
    detail::device_context_guard guard(0);
    GPUMEM_CU(cuCtxSynchronize);
    GPUMEM_CU(cuDeviceGraphMemTrim, 0);
  }
  const std::size_t device_free_before = device_free_bytes();
  std::string failure;
  if (vmm) {
    vmm_pool_options o;
    o.watch_captures = watch;
    o.maximum_bytes = maximum;
    vmm_pool_resource pool(0, o);
    failure = run_on(pool, in);
  } else {
    pool_options o;
    o.watch_captures = watch;
    o.maximum_bytes = maximum;
    auto upstream = std::make_shared<cuda_resource>(0);
    pool_resource pool(upstream, o);
    failure = run_on(pool, in);
  }
  if (!failure.empty()) return failure;
  return device_memory_kept(device_free_before);
}

}  // namespace gpumem::test
