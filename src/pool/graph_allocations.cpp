// graph_allocations (graph_allocations.hpp).
#include "pool/graph_allocations.hpp"

#include <string>

#include "driver/capture_interaction.hpp"
#include "driver/driver.hpp"
#include "gpumem/error.hpp"

namespace gpumem::detail {

void* graph_allocations::allocate(std::size_t bytes, std::size_t alignment, CUstream stream) {
  const std::string where = std::string("gpumem::") + resource_ + "::allocate";
  if (alignment > default_alignment) {
    // Graph memory is aligned to 256 bytes as the driver promises, no more; padding
    // would need a second record of where the allocation begins.
    throw logic_error(where + ": an alignment of " + std::to_string(alignment) +
                      " bytes on a stream under capture (the graph's memory is aligned to " +
                      std::to_string(default_alignment) + ")");
  }
  CUdeviceptr p = 0;
  CUresult r = CUDA_SUCCESS;
  {
    // Only the context: under capture, no call that would touch the stream's
    // queue (cuMemAllocAsync becomes the graph's allocation node).
    device_context_guard guard(device_);
    r = driver().cuMemAllocAsync(&p, bytes, stream);
  }
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    throw out_of_memory({.requested_bytes = bytes, .device = device_, .resource = resource_,
                         .resource_held_bytes = live_.bytes(), .device_free_bytes = 0, .device_total_bytes = 0,
                         .reason = "the stream is being captured into a CUDA graph, whose memory the driver "
                                   "allocates (an allocation node), and the driver has no room for it"});
  }
  check(r, "cuMemAllocAsync", __FILE__, __LINE__);
  void* user = reinterpret_cast<void*>(p);
  try {
    live_.replace(user, {user, bytes});  // a record already there is stale (Note [Freeing a graph's allocation])
  } catch (...) {
    (void)driver().cuMemFreeAsync(p, stream);
    throw;
  }
  return user;
}

// Note [Freeing a graph's allocation]
// Under a capture, cuMemFreeAsync of a graph allocation is a free node of the
// graph being captured. After the capture it frees the allocation in stream order
// once a launch of its graph made it, and fails with CUDA_ERROR_INVALID_VALUE when
// no launch did (nothing is mapped there yet: a program that captured a graph and
// dropped it, or its outputs, unlaunched). The pointer was checked to be one this
// pool handed out under a capture, so that failure can mean only this, and the
// free is done: the record goes, as its graph, if ever launched, frees what a
// launch left (auto-free-on-launch) or keeps its own memory. Measured on an H200
// (driver 580): tests/python/test_torch_graphs.py.
//
// A graph destroyed before it ever ran gives its allocations' addresses back to
// the driver, which hands them to later captures (seen on an H200: the random
// capture programs, tests/fuzz/capture_program.cpp). A record of this pool at an
// address the driver hands out again is therefore stale, and the new allocation
// replaces it: nothing of the old one exists. A program that still frees the old
// pointer frees the new allocation, as its own cuMemFreeAsync of that address
// would: such a pointer is dangling, like any pointer into memory already given back.
//
// Under a capture the driver has invalidated (a forbidden call elsewhere), the
// free fails with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: that capture's graph is
// destroyed at its end, and its allocations with it (measured on an H200), so
// the free is done. Its end tells the program of the lost capture.
bool graph_allocations::deallocate(void* ptr, std::size_t bytes, CUstream stream, bool under_capture) {
  if (live_.count() == 0 || !live_.contains(ptr)) return false;
  const std::string where = std::string("gpumem::") + resource_ + "::deallocate";
  const live_allocations::entry e = live_.take(ptr, bytes, where.c_str());
  CUresult r = CUDA_SUCCESS;
  {
    device_context_guard guard(device_);
    // After its capture, on a stream another capture may forbid it on (Note [Calls a capture elsewhere forbids]).
    relaxed_capture_interaction relaxed;
    r = driver().cuMemFreeAsync(reinterpret_cast<CUdeviceptr>(e.base), stream);
  }
  if (r == CUDA_ERROR_INVALID_VALUE && !under_capture) return true;  // its graph never ran
  if (r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED && under_capture) return true;  // goes with its lost graph
  if (r != CUDA_SUCCESS) {
    live_.insert(ptr, e);  // still the graph's: the caller may free it again
    check(r, "cuMemFreeAsync", __FILE__, __LINE__);
  }
  return true;
}

}  // namespace gpumem::detail
