// CUDA graphs in the simulator (sim_graph.hpp) and their entry points.
#include "sim/sim_graph.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>

#include "sim/sim_entry_points.hpp"
#include "sim/sim_memory.hpp"

namespace gpumem::detail::simulator {

namespace {

// A user object: its destroy function runs once the last reference goes.
struct sim_user_object {
  void* ptr;
  CUhostFn destroy;
  std::atomic<std::uint64_t> references;
};

void release_user_object(sim_user_object* o, std::uint64_t count) {
  if (o->references.fetch_sub(count, std::memory_order_acq_rel) == count) {
    o->destroy(o->ptr);
    delete o;
  }
}

// A graph's allocation nodes and user object references, shared by the graph,
// its executables and their launches in flight. When the last of the graph and
// its executables goes, the allocations no launch made go back, and their
// addresses may be handed out again (as the driver does:
// tests/fuzz/capture_program.cpp); once the launches are done too, the
// references go (as the driver's do, measured on an H200: docs/pool.md).
struct graph_nodes {
  std::vector<sim_stream::graph_node> allocations;
  std::mutex mutex;  // guards user_objects: a capture's graph takes them while others read it
  std::vector<std::pair<sim_user_object*, unsigned>> user_objects;
  graph_nodes() = default;
  graph_nodes(const graph_nodes&) = delete;
  graph_nodes& operator=(const graph_nodes&) = delete;
  ~graph_nodes() {
    for (auto [o, count] : user_objects) release_user_object(o, count);
  }
};
struct sim_graph {
  std::shared_ptr<graph_nodes> nodes;
};
struct sim_graph_exec {
  std::shared_ptr<graph_nodes> nodes;
};

std::atomic<std::uint64_t> next_graph_node{1};

void drop_nodes(sim_state& state, std::shared_ptr<graph_nodes>& nodes) {
  if (nodes.use_count() == 1) {
    for (const sim_stream::graph_node& n : nodes->allocations) {
      if (sim_device* d = state.device(n.device)) d->memory.release_unlaunched_graph_allocation(n.pointer, n.id);
    }
  }
  nodes.reset();
}

}  // namespace

CUgraph make_graph() { return reinterpret_cast<CUgraph>(new sim_graph{std::make_shared<graph_nodes>()}); }

void add_allocation_nodes(CUgraph graph, std::vector<sim_stream::graph_node> allocations) {
  reinterpret_cast<sim_graph*>(graph)->nodes->allocations = std::move(allocations);
}

void drop_graph(sim_state& state, CUgraph graph) {
  auto* g = reinterpret_cast<sim_graph*>(graph);
  drop_nodes(state, g->nodes);
  delete g;
}

CUresult allocate_graph_memory(sim_state& state, const std::shared_ptr<sim_stream>& stream, std::size_t bytes,
                               CUdeviceptr* pointer) {
  if (stream->capture_invalidated()) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  sim_device& device = *state.device(stream->device());
  const CUresult r = allocate_device_memory(state, device, bytes, allocation_kind::graph, pointer);
  if (r == CUDA_SUCCESS) {
    const std::uint64_t id = next_graph_node.fetch_add(1, std::memory_order_relaxed);
    device.memory.set_graph_node(*pointer, id);
    stream->add_captured_allocation({*pointer, stream->device(), id});
  }
  return r;
}

CUresult free_graph_memory(sim_state& state, const allocation& a, const std::shared_ptr<sim_stream>& stream) {
  device_address_space& memory = state.device(a.device)->memory;
  if (stream->capturing()) {
    if (stream->capture_invalidated()) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    return memory.free(a.base);  // a free node
  }
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
  return entry_point([&](sim_state& state) {
    if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
    drop_graph(state, graph);
    return CUDA_SUCCESS;
  });
}

// The flags (auto-free-on-launch among them) change nothing where no graph runs.
CUresult graph_instantiate_with_flags(CUgraphExec* exec, CUgraph graph, unsigned long long /*flags*/) {
  if (exec == nullptr || graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *exec = reinterpret_cast<CUgraphExec>(new sim_graph_exec{reinterpret_cast<sim_graph*>(graph)->nodes});
  return CUDA_SUCCESS;
}

// A launch runs nothing here: a point in its stream's order, after which the
// graph's allocations exist (the driver maps them at launch).
CUresult graph_launch(CUgraphExec exec, CUstream handle) {
  return entry_point([&](sim_state& state) {
    if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::shared_ptr<sim_stream> stream;
    if (CUresult r = resolve_stream(state, handle, stream); r != CUDA_SUCCESS) return r;
    // The launch holds the graph's nodes until its stream reaches it.
    std::shared_ptr<graph_nodes> nodes = reinterpret_cast<sim_graph_exec*>(exec)->nodes;
    if (CUresult r = enqueue(stream, [held = nodes] {}); r != CUDA_SUCCESS) return r;
    for (const sim_stream::graph_node& n : nodes->allocations) {
      if (sim_device* d = state.device(n.device)) d->memory.mark_graph_launched(n.pointer, n.id);
    }
    return CUDA_SUCCESS;
  });
}

CUresult graph_exec_destroy(CUgraphExec exec) {
  return entry_point([&](sim_state& state) {
    if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto* e = reinterpret_cast<sim_graph_exec*>(exec);
    drop_nodes(state, e->nodes);
    delete e;
    return CUDA_SUCCESS;
  });
}

CUresult user_object_create(CUuserObject* object, void* ptr, CUhostFn destroy, unsigned int initial_references,
                            unsigned int flags) {
  return entry_point([&](sim_state&) {
    if (object == nullptr || destroy == nullptr || initial_references == 0 ||
        flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    *object = reinterpret_cast<CUuserObject>(new sim_user_object{ptr, destroy, {initial_references}});
    return CUDA_SUCCESS;
  });
}

CUresult user_object_release(CUuserObject object, unsigned int count) {
  return entry_point([&](sim_state&) {
    if (object == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
    release_user_object(reinterpret_cast<sim_user_object*>(object), count);
    return CUDA_SUCCESS;
  });
}

CUresult graph_retain_user_object(CUgraph graph, CUuserObject object, unsigned int count, unsigned int flags) {
  return entry_point([&](sim_state&) {
    if (graph == nullptr || object == nullptr || count == 0 || (flags & ~CU_GRAPH_USER_OBJECT_MOVE) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    auto* o = reinterpret_cast<sim_user_object*>(object);
    // Moved: the caller's references become the graph's; else new ones.
    if ((flags & CU_GRAPH_USER_OBJECT_MOVE) == 0) o->references.fetch_add(count, std::memory_order_relaxed);
    graph_nodes& nodes = *reinterpret_cast<sim_graph*>(graph)->nodes;
    std::lock_guard lock(nodes.mutex);
    nodes.user_objects.emplace_back(o, count);
    return CUDA_SUCCESS;
  });
}

// The simulator gives graph memory back as it is freed: no cache to trim.
CUresult device_graph_mem_trim(CUdevice device) {
  return entry_point([&](sim_state& state) {
    return state.device(device) != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
  });
}

}  // namespace gpumem::detail::simulator
