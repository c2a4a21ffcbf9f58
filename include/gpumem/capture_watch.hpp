// capture_watch: learn of CUDA stream captures as they begin and end, so that the
// pools need not ask the driver on every call (docs/pool.md, "CUDA graphs").
//
// A pool serves a stream under capture from the graph's own memory
// (pool_options::check_capture). To know,
// it asks the driver (cuStreamIsCapturing) on every allocate and deallocate: about
// as much as the pool's own work (docs/benchmarks.md). With a watch,
// the pools that ask for it (pool_options::watch_captures) ask the driver only
// while some capture is in progress somewhere in the process.
//
// The watch is process-wide and shared: the first capture_watch starts it, the
// last one to go stops it. On the CUDA backend it is a CUPTI callback
// subscription to cuStreamBeginCapture* and cuStreamEndCapture* (the runtime's
// capture calls go through them); on the simulator, the simulated driver reports
// its captures itself.
//
// Limits (why it is a choice, not the default):
//  - CUPTI allows one callback subscriber per process: while the watch is on, a
//    profiler that subscribes later (Nsight Systems attached later, a framework's
//    profiler) is refused, and the watch cannot start under a profiler that
//    subscribed first. It then stays inactive, and the pools ask the driver.
//  - A capture that began before the watch started is not counted. A pool that
//    meets a stream already capturing when it first uses it stops trusting the
//    watch (it asks the driver on every call again); start the watch before any
//    capture, as at program start.
//  - libcupti (CUDA toolkit, or the nvidia-cuda-cupti wheel) must be found:
//    GPUMEM_CUPTI_LIBRARY names it, else the usual library paths and the toolkit's.
#pragma once

#include <string>

#include "gpumem/export.hpp"

namespace gpumem {

class GPUMEM_EXPORT capture_watch {
 public:
  // Joins the process-wide watch, starting it if this is the first. Never throws
  // for a watch that cannot start: active() is then false and reason() says why.
  capture_watch();
  ~capture_watch();
  capture_watch(const capture_watch&) = delete;
  capture_watch& operator=(const capture_watch&) = delete;

  // Whether captures are being watched now (false once a pool found a capture
  // the watch had not seen).
  bool active() const noexcept;
  // "CUPTI" or "simulator" when it started, else empty.
  const std::string& source() const noexcept { return source_; }
  // Why the watch did not start (empty when it did).
  const std::string& reason() const noexcept { return reason_; }

 private:
  std::string source_;
  std::string reason_;
};

}  // namespace gpumem
