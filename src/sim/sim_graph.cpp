// CUDA graphs in the simulator (sim_graph.hpp) and their entry points.
#include "sim/sim_graph.hpp"

#include <utility>

#include "sim/sim_entry_points.hpp"
#include "sim/sim_memory.hpp"

namespace gpumem::detail::simulator {

namespace {
struct sim_graph {
  std::vector<CUdeviceptr> allocations;  // its allocation nodes
};
struct sim_graph_exec {
  std::vector<CUdeviceptr> allocations;  // its graph's allocation nodes
};
}  // namespace

CUgraph make_graph(std::vector<CUdeviceptr> allocations) {
  return reinterpret_cast<CUgraph>(new sim_graph{std::move(allocations)});
}

CUresult allocate_graph_memory(sim_state& state, const std::shared_ptr<sim_stream>& stream, std::size_t bytes,
                               CUdeviceptr* pointer) {
  const CUresult r =
      allocate_device_memory(state, *state.device(stream->device()), bytes, allocation_kind::graph, pointer);
  if (r == CUDA_SUCCESS) stream->add_captured_allocation(*pointer);
  return r;
}

CUresult free_graph_memory(sim_state& state, const allocation& a, const std::shared_ptr<sim_stream>& stream) {
  device_address_space& memory = state.device(a.device)->memory;
  if (stream->capturing()) return memory.free(a.base);  // a free node
  if (!a.graph_launched) {
    (void)memory.free(a.base);  // nothing was made there: nothing to hold
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Marked now, so a second free is refused at the call; back to the device when
  // the stream reaches the free.
  if (CUresult r = memory.mark_free_pending(a.base); r != CUDA_SUCCESS) return r;
  const CUdeviceptr base = a.base;
  CUresult r = enqueue(stream, [&memory, base] { memory.complete_pending_free(base); });
  if (r != CUDA_SUCCESS) memory.cancel_pending_free(base);
  return r;
}

CUresult graph_destroy(CUgraph graph) {
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  delete reinterpret_cast<sim_graph*>(graph);
  return CUDA_SUCCESS;
}

// The flags (auto-free-on-launch among them) change nothing where no graph runs.
CUresult graph_instantiate_with_flags(CUgraphExec* exec, CUgraph graph, unsigned long long /*flags*/) {
  if (exec == nullptr || graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *exec = reinterpret_cast<CUgraphExec>(new sim_graph_exec{reinterpret_cast<sim_graph*>(graph)->allocations});
  return CUDA_SUCCESS;
}

// A launch runs nothing here: a point in its stream's order, after which the
// graph's allocations exist (the driver maps them at launch).
CUresult graph_launch(CUgraphExec exec, CUstream handle) {
  return entry_point([&](sim_state& state) {
    if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::shared_ptr<sim_stream> stream;
    if (CUresult r = resolve_stream(state, handle, stream); r != CUDA_SUCCESS) return r;
    if (CUresult r = enqueue(stream, [] {}); r != CUDA_SUCCESS) return r;
    for (CUdeviceptr p : reinterpret_cast<sim_graph_exec*>(exec)->allocations) {
      if (auto a = find_allocation(state, p)) state.device(a->device)->memory.mark_graph_launched(p);
    }
    return CUDA_SUCCESS;
  });
}

CUresult graph_exec_destroy(CUgraphExec exec) {
  if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  delete reinterpret_cast<sim_graph_exec*>(exec);
  return CUDA_SUCCESS;
}

}  // namespace gpumem::detail::simulator
