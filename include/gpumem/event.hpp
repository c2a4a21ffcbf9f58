// RAII driver event on one device: record on a stream, query, synchronize,
// make a stream wait for it, time between two events.
#pragma once

#include <cuda.h>

#include "gpumem/export.hpp"
#include "gpumem/stream.hpp"

namespace gpumem {

class GPUMEM_EXPORT event {
 public:
  // A new event on `device` (-1: the current device). Timing is off unless asked:
  // events without timing are cheaper to record and to wait on.
  explicit event(int device = -1, bool timing = false);
  ~event();
  event(event&& other) noexcept;
  event& operator=(event&& other) noexcept;
  event(const event&) = delete;
  event& operator=(const event&) = delete;

  void record(stream_view s);
  // True when the work captured by the last record has completed (or never recorded).
  bool ready() const;
  void synchronize() const;

  CUevent handle() const noexcept { return handle_; }
  int device() const noexcept { return device_; }

  // Milliseconds between two recorded, completed events made with timing on.
  static float elapsed_ms(const event& start, const event& end);

 private:
  void reset() noexcept;
  CUevent handle_ = nullptr;
  int device_ = -1;
};

}  // namespace gpumem
