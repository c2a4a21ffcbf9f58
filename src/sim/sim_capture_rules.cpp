// The captures in progress and what they forbid (sim_capture_rules.hpp).
#include "sim/sim_capture_rules.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "sim/sim_stream.hpp"

namespace gpumem::detail::simulator {

namespace {

struct capture_record {
  std::shared_ptr<sim_stream> stream;
  CUstreamCaptureMode mode;
  std::thread::id thread;
};

struct capture_registry {
  std::mutex mutex;
  std::vector<capture_record> captures;
  std::atomic<std::size_t> count{0};  // read without the mutex: most calls find none
};

capture_registry& registry() {
  static capture_registry r;
  return r;
}

// Every thread starts global, as with the driver.
thread_local CUstreamCaptureMode interaction_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

bool valid_mode(CUstreamCaptureMode m) {
  return m == CU_STREAM_CAPTURE_MODE_GLOBAL || m == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL ||
         m == CU_STREAM_CAPTURE_MODE_RELAXED;
}

}  // namespace

void capture_begun(const std::shared_ptr<sim_stream>& stream, CUstreamCaptureMode mode) {
  capture_registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.captures.push_back({stream, mode, std::this_thread::get_id()});
  r.count.store(r.captures.size(), std::memory_order_release);
}

void capture_ended(const sim_stream* stream) {
  capture_registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::erase_if(r.captures, [&](const capture_record& c) { return c.stream.get() == stream; });
  r.count.store(r.captures.size(), std::memory_order_release);
}

// The driver's rule for the calling thread's interaction mode: global forbids
// while this thread captures in a mode other than relaxed or any other thread
// captures in global mode; thread-local only the first; relaxed nothing.
CUresult unsafe_call_permitted() {
  capture_registry& r = registry();
  if (r.count.load(std::memory_order_acquire) == 0) return CUDA_SUCCESS;
  const CUstreamCaptureMode mine = interaction_mode;
  if (mine == CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_SUCCESS;
  const std::thread::id me = std::this_thread::get_id();
  bool forbidden = false;
  std::lock_guard lock(r.mutex);
  for (const capture_record& c : r.captures) {
    const bool local = c.thread == me && c.mode != CU_STREAM_CAPTURE_MODE_RELAXED;
    const bool global = c.thread != me && c.mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
                        mine == CU_STREAM_CAPTURE_MODE_GLOBAL;
    if (local || global) {
      c.stream->invalidate_capture();
      forbidden = true;
    }
  }
  return forbidden ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

CUresult context_synchronize_permitted(int device) {
  capture_registry& r = registry();
  if (r.count.load(std::memory_order_acquire) == 0) return CUDA_SUCCESS;
  bool forbidden = false;
  std::lock_guard lock(r.mutex);
  for (const capture_record& c : r.captures) {
    if (c.stream->device() == device) {
      c.stream->invalidate_capture();
      forbidden = true;
    }
  }
  return forbidden ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

CUresult thread_exchange_stream_capture_mode(CUstreamCaptureMode* mode) {
  if (mode == nullptr || !valid_mode(*mode)) return CUDA_ERROR_INVALID_VALUE;
  std::swap(*mode, interaction_mode);
  return CUDA_SUCCESS;
}

}  // namespace gpumem::detail::simulator
