// CUDA graphs in the simulator: what a capture leaves (a graph of its allocation
// nodes), executable graphs that run nothing but mark those allocations made, and
// graph memory (docs/simulator.md, "Graphs").
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "sim/sim_address_space.hpp"
#include "sim/sim_state.hpp"
#include "sim/sim_stream.hpp"

namespace gpumem::detail::simulator {

// The graph of a capture that begins (cuStreamGetCaptureInfo hands it out, and
// cuGraphRetainUserObject adds to it meanwhile); the capture's end gives it its
// allocation nodes.
CUgraph make_graph();
void add_allocation_nodes(CUgraph graph, std::vector<sim_stream::graph_node> allocations);
// cuGraphDestroy's work, for a graph no one was handed (an invalidated capture's).
void drop_graph(sim_state& state, CUgraph graph);

// cuMemAllocAsync on a capturing stream: an allocation node. Its memory is taken
// from the device at once (the simulator launches nothing, so nothing runs before it).
CUresult allocate_graph_memory(sim_state& state, const std::shared_ptr<sim_stream>& stream, std::size_t bytes,
                               CUdeviceptr* pointer);

// cuMemFreeAsync of graph memory: under a capture a free node (the memory goes
// back now); after it, a stream-ordered free once a launch of its graph made the
// allocation, and CUDA_ERROR_INVALID_VALUE, as with the driver, when none did.
CUresult free_graph_memory(sim_state& state, const allocation& a, const std::shared_ptr<sim_stream>& stream);

}  // namespace gpumem::detail::simulator
