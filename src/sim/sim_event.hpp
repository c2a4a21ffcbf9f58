// Events: a record marks a position in a stream's work; the event is complete
// once the stream reaches it, and remembers the host time it was reached.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>

#include "gpumem/export.hpp"
#include "sim/sim_stream.hpp"

namespace gpumem::detail::simulator {

class sim_context;

// Successful cuEventRecord / cuStreamWaitEvent calls since the process started,
// all streams together: tests count the event traffic of the code they drive.
GPUMEM_EXPORT std::uint64_t event_records() noexcept;
GPUMEM_EXPORT std::uint64_t stream_event_waits() noexcept;

class sim_event {
 public:
  using clock = std::chrono::steady_clock;

  sim_event(sim_context& context, unsigned int flags) : context_(context), flags_(flags) {}
  sim_context& context() const { return context_; }
  bool timing_disabled() const { return (flags_ & CU_EVENT_DISABLE_TIMING) != 0; }

  // The most recent record, if any.
  std::optional<stream_position> last_record() const;
  // A new record: returns its generation, which the queued record work passes
  // back to reached() so that an older record completing late changes nothing.
  std::uint64_t begin_record();
  void set_last_record(std::uint64_t generation, stream_position position);
  void reached(std::uint64_t generation, clock::time_point when);
  // When the most recent record was reached (valid once it is complete).
  clock::time_point reached_at() const;

  // Never recorded counts as complete, as in CUDA.
  bool complete() const;

  // Serializes cuEventRecord calls on this event, so generation and position agree.
  std::mutex& record_mutex() { return record_mutex_; }

 private:
  sim_context& context_;
  const unsigned int flags_;
  std::mutex record_mutex_;
  mutable std::mutex mutex_;
  std::uint64_t generation_ = 0;
  std::optional<stream_position> last_record_;
  clock::time_point reached_at_{};
};

inline CUevent to_handle(sim_event* event) { return reinterpret_cast<CUevent>(event); }

}  // namespace gpumem::detail::simulator
