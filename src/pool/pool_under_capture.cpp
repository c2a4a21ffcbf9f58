// The pools' calls on a stream under capture (Note [Pools and stream capture] in
// src/stream_device.hpp): the graph's own memory, and the pool's blocks freed
// under a capture held for the graph (graph_holds.hpp).
#include "pool/stream_ordered_pool.hpp"

#include "driver/driver.hpp"

namespace gpumem::detail {

// Calls on a stream under capture (Note [Pools and stream capture]): the graph's
// own memory, never the pool's.
void* stream_ordered_pool::allocate_under_capture(std::size_t bytes, stream_view stream, std::size_t alignment) {
  return graph_memory.allocate(bytes, alignment, stream.handle());
}

void stream_ordered_pool::deallocate_under_capture(void* ptr, std::size_t bytes, stream_view stream) {
  // The pool's own memory first: a graph's record at an address inside one of its
  // chunks is stale (a graph that never ran gave the address back, and a chunk took
  // it: Note [Freeing a graph's allocation]).
  arena* const owner = chunk_owner(reinterpret_cast<std::uintptr_t>(ptr));
  if (owner == nullptr && graph_memory.deallocate(ptr, bytes, stream.handle(), true)) return;  // a free node of the graph
  arena* freeing = nullptr;
  if (owner != nullptr && arena_of(stream, freeing) && freeing == owner) {
    hold_for_graph(*owner, ptr, bytes, stream.handle());
    return;
  }
  throw_capturing(name, "deallocate", stream.handle());
}

void stream_ordered_pool::hold_for_graph(arena& a, void* ptr, std::size_t bytes, CUstream stream) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUgraph graph = nullptr;
  {
    device_context_guard guard(device);  // for the per-thread default stream
    GPUMEM_CU(cuStreamGetCaptureInfo, stream, &status, nullptr, &graph, nullptr, nullptr, nullptr);
  }
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  block* b = nullptr;
  {
    std::lock_guard lock(a.lock);
    b = a.live.find(address);
    if (b == nullptr || b->cached) throw not_ours(ptr);
    if (b->requested_bytes != bytes) throw wrong_size(ptr, b->requested_bytes, bytes);
    if (status != CU_STREAM_CAPTURE_STATUS_ACTIVE || graph == nullptr) {
      // An invalidated capture runs nothing (no fence: the stream still captures),
      // and one that ended meanwhile left an ordinary free.
      const std::size_t size = b->size;
      free_live(a, b, address, bytes);
      if (status == CU_STREAM_CAPTURE_STATUS_NONE) note_free(a, size);
      return;
    }
    a.live.erase(address);
    b->held = true;
  }
  try {
    held_for_graphs.hold(graph, {b, &a, b->size});
  } catch (...) {
    std::lock_guard lock(a.lock);
    b->held = false;
    a.live.insert(address, b);
    throw;
  }
}

void stream_ordered_pool::free_blocks_graphs_released() {
  for (const graph_holds::held& h : held_for_graphs.take_released()) {
    arena& a = *h.owner;
    block* b = h.freed;
    {
      std::lock_guard lock(a.lock);
      a.live.insert(b->address, b);
      b->held = false;
      // On its stream, now, without a fence (the stream may be gone): its later
      // work follows the block's last uses, other streams wait for its next fence.
      free_live(a, b, b->address, b->requested_bytes);
    }
    held_for_graphs.returned(h);
  }
}

}  // namespace gpumem::detail
