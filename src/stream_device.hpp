// The checks device resources make of the stream they are given: a stream of
// another device than the resource's is a logic_error (docs/resource-contract.md);
// a pool refuses a stream being captured into a CUDA graph (docs/pool.md).
#pragma once

#include <cstdio>
#include <string>

#include "driver/capture_watch_state.hpp"
#include "driver/driver.hpp"
#include "gpumem/error.hpp"
#include "gpumem/stream.hpp"

namespace gpumem::detail {

// The default-stream handles mean the current context's streams; callers have
// made the resource's device current, so they pass.
inline void check_stream_device(stream_view stream, int device, const char* where) {
  const CUstream h = stream.handle();
  if (is_default_stream(h)) return;
  CUdevice dev{};
  GPUMEM_CU(cuStreamGetDevice, h, &dev);
  if (static_cast<int>(dev) != device) {
    throw logic_error(std::string(where) + ": the stream belongs to device " + std::to_string(dev) +
                      ", the resource to device " + std::to_string(device));
  }
}

// Note [Pools and stream capture]
// Work queued on a stream under capture does not run: it becomes part of a graph
// launched later, any number of times. A block of the pool handed out then, or
// taken back, would be reused by the pool at once on the host's clock, long
// before the graph's kernels touch it: silently unsafe. So under capture a pool
// hands out the graph's own memory instead: cuMemAllocAsync on the capturing
// stream becomes an allocation node, whose memory the driver keeps for the graph
// (graph_allocations). Its free under the capture becomes a free node; after the
// capture it is a stream-ordered free of the graph's allocation, as the driver
// allows (a graph instantiated with auto-free-on-launch, as PyTorch's are, may
// leave its allocations unfreed between launches). A block the pool handed out
// before the capture and freed under it on its own stream is held until the
// graph is gone (Note [A pool block freed under a capture], pool/graph_holds.cpp);
// one of another stream's arena would need a fence on the captured stream: a
// logic_error that says so, the pool unchanged.
// Both calls must ask: an allocation under capture must be the graph's, and a
// free under capture must not give a pool block back. The driver tells no one
// when a capture begins (only a CUPTI subscriber hears of it:
// gpumem::capture_watch). The legacy default stream cannot
// be captured, so its calls skip the query, which costs about two driver calls for
// another stream. cuStreamGetCaptureInfo (status only) costs as much or more
// (both of its ABI versions, timed side by side on an H200), so the pools keep
// cuStreamIsCapturing (docs/pool.md, "CUDA graphs"; the figures are in
// docs/benchmarks.md). A stream new to the pool under capture gets no arena (the
// device check would fail on it and invalidate the capture): its calls go to the
// graph's memory, and its arena is made at its first call outside a capture.
// A pool that uses the capture watch (`watched`: pool_options::watch_captures, and
// the watch running) skips the query while no capture is in progress anywhere in
// the process: one load (driver/capture_watch_state.hpp).
// The per-thread default stream is resolved in the calling thread's current
// context, so `device`'s context is made current for it; a created stream needs none.
// The stream must be alive (docs/resource-contract.md).
inline bool stream_is_capturing(CUstream h, int device, bool watched = false) {
  if (h == nullptr || h == CU_STREAM_LEGACY) return false;
  if (watched && watch_says_no_capture()) [[likely]] return false;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (h == CU_STREAM_PER_THREAD) {
    device_context_guard guard(device);
    GPUMEM_CU(cuStreamIsCapturing, h, &status);
  } else {
    GPUMEM_CU(cuStreamIsCapturing, h, &status);
  }
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

// A pool's first use of a stream, before any other driver call on it (most calls,
// cuStreamGetDevice among them, fail on a capturing stream and invalidate the
// capture): whether it is capturing. Always asks the driver, so it also tells the
// capture watch of a capture that began before it (driver/capture_watch_state.hpp).
inline bool new_stream_is_capturing(CUstream h, int device) {
  if (!stream_is_capturing(h, device)) return false;
  capture_watch_found_unseen(h);
  return true;
}

[[noreturn]] inline void throw_capturing(const char* resource, const char* call, CUstream h) {
  char text[96];
  std::snprintf(text, sizeof text, "%p", static_cast<void*>(h));
  throw logic_error(std::string("gpumem::") + resource + "::" + call + ": stream " + text +
                    " is being captured into a CUDA graph, and the pool records nothing on it then (a fence "
                    "would become a node of the graph): free a block handed out on another stream on that "
                    "stream, or after the capture, and trim the stream after it. A block of this stream's "
                    "freed under the capture is held for the graph; allocations under the capture are the "
                    "graph's memory and can be freed under it or after it");
}

}  // namespace gpumem::detail
