// What a capture in progress forbids elsewhere in the process, as the driver does
// (Note [Calls a capture elsewhere forbids], src/driver/capture_interaction.hpp):
// the captures in progress with their modes and threads, each thread's
// interaction mode (cuThreadExchangeStreamCaptureMode), and the checks the
// simulator's entry points make before a potentially unsafe call.
#pragma once

#include <cuda.h>

#include <memory>

namespace gpumem::detail::simulator {

class sim_stream;

// cuStreamBeginCapture / cuStreamEndCapture record and drop a capture.
void capture_begun(const std::shared_ptr<sim_stream>& stream, CUstreamCaptureMode mode);
void capture_ended(const sim_stream* stream);

// Before a potentially unsafe call (cuEventQuery, cuEventSynchronize, cuStreamQuery
// and cuStreamSynchronize of a stream not captured, cuMemAlloc, cuMemFree,
// cuMemAllocAsync / cuMemFreeAsync on a stream not captured, cuMemAllocManaged,
// cuMemHostAlloc, cuMemFreeHost): CUDA_SUCCESS when
// this thread may make it now, else CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, every
// capture that forbids it invalidated.
CUresult unsafe_call_permitted();

// cuCtxSynchronize: forbidden in every mode while a capture of the device is in
// progress, each of them invalidated.
CUresult context_synchronize_permitted(int device);

// cuThreadExchangeStreamCaptureMode.
CUresult thread_exchange_stream_capture_mode(CUstreamCaptureMode* mode);

}  // namespace gpumem::detail::simulator
