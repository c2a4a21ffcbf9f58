// The pools' own driver calls beside a capture in progress elsewhere: a scope in
// which the calling thread's capture interaction mode is relaxed.
#pragma once

#include <cuda.h>

#include "driver/driver.hpp"

namespace gpumem::detail {

// Note [Calls a capture elsewhere forbids]
// While a stream is being captured into a CUDA graph, the driver forbids
// "potentially unsafe" calls: in a thread whose interaction mode is global (every
// thread's default) whenever any thread captures in global mode (PyTorch's
// torch.cuda.graph does by default) or the thread itself captures in global or
// thread-local mode. A forbidden call fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
// and invalidates the capture, whose end then fails: a pool serving another
// stream would break the program's graph. Measured on an H200 (driver 580), each
// call made by the capturing thread and by another, in each mode
// (docs/pool.md, "A capture elsewhere"):
//  - forbidden unless relaxed: cuEventQuery, cuEventSynchronize, cuStreamQuery and
//    cuStreamSynchronize (of a stream not captured), cuMemAlloc, cuMemFree,
//    cuMemAllocAsync/FreeAsync on a stream not captured, cuMemAllocManaged,
//    cuMemHostAlloc and cuMemFreeHost;
//  - forbidden in every mode, the caller's relaxed too: cuCtxSynchronize;
//  - permitted: cuStreamIsCapturing, cuEventRecord and cuStreamWaitEvent on a
//    stream not captured, cuEventCreate/Destroy, every virtual memory call
//    (create, reserve, map, access, unmap, release), cuMemGetInfo.
// The pools' queries and waits are on their own fences, recorded on streams that
// were not capturing (a call on a capturing stream records nothing: Note [Pools
// and stream capture]), and their cuMemAlloc/cuMemFree touch no stream: nothing
// there depends on the captured work. So they run with the thread's mode relaxed
// for the call, as the driver provides for a library that knows a call is safe
// (PyTorch's allocator does the same around cudaMalloc). cuCtxSynchronize cannot
// be made safe so: a pool skips it while its capture watch knows of a capture,
// and otherwise tries it and, refused, says that the capture is lost
// (stream_ordered_pool::synchronize_and_fence_everything, synchronize_as_last_resort).
class relaxed_capture_interaction {
 public:
  relaxed_capture_interaction() { GPUMEM_CU(cuThreadExchangeStreamCaptureMode, &previous_); }
  ~relaxed_capture_interaction() { (void)driver().cuThreadExchangeStreamCaptureMode(&previous_); }
  relaxed_capture_interaction(const relaxed_capture_interaction&) = delete;
  relaxed_capture_interaction& operator=(const relaxed_capture_interaction&) = delete;

 private:
  CUstreamCaptureMode previous_ = CU_STREAM_CAPTURE_MODE_RELAXED;
};

}  // namespace gpumem::detail
