// What both pools hand out on a stream that is being captured into a CUDA graph:
// the graph's own memory, through the driver's graph memory nodes
// (Note [Pools and stream capture] in src/stream_device.hpp).
#pragma once

#include <cstddef>

#include "gpumem/memory_resource.hpp"
#include "live_allocations.hpp"

namespace gpumem::detail {

class graph_allocations {
 public:
  graph_allocations(const char* resource, int device) : resource_(resource), device_(device) {}

  // `stream` is capturing: cuMemAllocAsync there makes an allocation node of the
  // graph, whose memory the graph owns. out_of_memory where the driver has no room.
  void* allocate(std::size_t bytes, std::size_t alignment, CUstream stream);

  // Frees `ptr` if it is one of ours (a free node `under_capture`, otherwise a
  // stream-ordered free of the graph's allocation: Note [Freeing a graph's
  // allocation]); false if it is not. logic_error for a size other than the allocation's.
  bool deallocate(void* ptr, std::size_t bytes, CUstream stream, bool under_capture);

 private:
  const char* const resource_;
  const int device_;
  live_allocations live_;
};

}  // namespace gpumem::detail
