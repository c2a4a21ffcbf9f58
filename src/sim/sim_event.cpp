// Events and the event entry points, including cuStreamWaitEvent (see sim_event.hpp).
#include "sim/sim_event.hpp"

#include <atomic>
#include <memory>

#include "sim/sim_capture_rules.hpp"
#include "sim/sim_entry_points.hpp"
#include "sim/sim_pool.hpp"
#include "sim/sim_state.hpp"

namespace gpumem::detail::simulator {
namespace {

std::atomic<std::uint64_t> event_record_count{0};
std::atomic<std::uint64_t> stream_wait_count{0};

}  // namespace

std::uint64_t event_records() noexcept { return event_record_count.load(std::memory_order_relaxed); }
std::uint64_t stream_event_waits() noexcept { return stream_wait_count.load(std::memory_order_relaxed); }

std::optional<stream_position> sim_event::last_record() const {
  std::lock_guard lock(mutex_);
  return last_record_;
}

std::uint64_t sim_event::begin_record() {
  std::lock_guard lock(mutex_);
  return ++generation_;
}

void sim_event::set_last_record(std::uint64_t generation, stream_position position) {
  std::lock_guard lock(mutex_);
  if (generation == generation_) last_record_ = std::move(position);
}

void sim_event::reached(std::uint64_t generation, clock::time_point when) {
  std::lock_guard lock(mutex_);
  if (generation == generation_) reached_at_ = when;
}

sim_event::clock::time_point sim_event::reached_at() const {
  std::lock_guard lock(mutex_);
  return reached_at_;
}

bool sim_event::complete() const {
  auto record = last_record();
  return !record || record->reached();
}

// ---- entry points ----

namespace {

constexpr unsigned int supported_event_flags =
    CU_EVENT_DEFAULT | CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING;

CUresult find_event(sim_state& state, CUevent handle, std::shared_ptr<sim_event>& out) {
  out = state.events.find(handle);
  return out != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

}  // namespace

CUresult event_create(CUevent* handle, unsigned int flags) {
  return entry_point([&](sim_state& state) {
    sim_context* context = nullptr;
    if (CUresult r = require_current_context(context); r != CUDA_SUCCESS) return r;
    if (handle == nullptr || (flags & ~supported_event_flags) != 0) return CUDA_ERROR_INVALID_VALUE;
    auto event = std::make_shared<sim_event>(*context, flags);
    state.events.add(event);
    *handle = to_handle(event.get());
    return CUDA_SUCCESS;
  });
}

CUresult event_destroy(CUevent handle) {
  return entry_point([&](sim_state& state) {
    // A pending record still completes: its queued work holds the event.
    return state.events.remove(handle) != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
  });
}

CUresult event_record(CUevent event_handle, CUstream stream_handle) {
  return entry_point([&](sim_state& state) {
    std::shared_ptr<sim_event> event;
    if (CUresult r = find_event(state, event_handle, event); r != CUDA_SUCCESS) return r;
    std::shared_ptr<sim_stream> stream;
    if (CUresult r = resolve_stream(state, stream_handle, stream); r != CUDA_SUCCESS) return r;
    if (stream->device() != event->context().device()) return CUDA_ERROR_INVALID_HANDLE;

    std::lock_guard record_lock(event->record_mutex());
    const std::uint64_t generation = event->begin_record();
    stream_position position;
    CUresult r = enqueue(
        stream,
        [event, generation] { event->reached(generation, sim_event::clock::now()); }, {}, &position);
    if (r == CUDA_SUCCESS) {
      event->set_last_record(generation, std::move(position));
      event_record_count.fetch_add(1, std::memory_order_relaxed);
    }
    return r;
  });
}

CUresult event_query(CUevent handle) {
  return entry_point([&](sim_state& state) {
    std::shared_ptr<sim_event> event;
    if (CUresult r = find_event(state, handle, event); r != CUDA_SUCCESS) return r;
    if (CUresult r = unsafe_call_permitted(); r != CUDA_SUCCESS) return r;  // sim_capture_rules.hpp
    return event->complete() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
  });
}

CUresult event_synchronize(CUevent handle) {
  return entry_point([&](sim_state& state) {
    std::shared_ptr<sim_event> event;
    if (CUresult r = find_event(state, handle, event); r != CUDA_SUCCESS) return r;
    if (CUresult r = unsafe_call_permitted(); r != CUDA_SUCCESS) return r;  // sim_capture_rules.hpp
    if (auto record = event->last_record()) {
      record->wait();
      // The host has now seen the recorded work complete: a synchronization point for the pools.
      observe_synchronization(state, host_observation::of_position(*record));
    }
    return CUDA_SUCCESS;
  });
}

CUresult event_elapsed_time(float* milliseconds, CUevent start_handle, CUevent end_handle) {
  return entry_point([&](sim_state& state) {
    if (milliseconds == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::shared_ptr<sim_event> start, end;
    if (CUresult r = find_event(state, start_handle, start); r != CUDA_SUCCESS) return r;
    if (CUresult r = find_event(state, end_handle, end); r != CUDA_SUCCESS) return r;
    // The driver's order: timing disabled or never recorded is a bad handle; pending is not ready.
    if (start->timing_disabled() || end->timing_disabled()) return CUDA_ERROR_INVALID_HANDLE;
    auto start_record = start->last_record();
    auto end_record = end->last_record();
    if (!start_record || !end_record) return CUDA_ERROR_INVALID_HANDLE;
    if (!start_record->reached() || !end_record->reached()) return CUDA_ERROR_NOT_READY;
    const std::chrono::duration<float, std::milli> elapsed = end->reached_at() - start->reached_at();
    *milliseconds = elapsed.count();
    return CUDA_SUCCESS;
  });
}

CUresult stream_wait_event(CUstream stream_handle, CUevent event_handle, unsigned int flags) {
  return entry_point([&](sim_state& state) {
    std::shared_ptr<sim_stream> stream;
    if (CUresult r = resolve_stream(state, stream_handle, stream); r != CUDA_SUCCESS) return r;
    std::shared_ptr<sim_event> event;
    if (CUresult r = find_event(state, event_handle, event); r != CUDA_SUCCESS) return r;
    // CU_EVENT_WAIT_EXTERNAL is only valid during stream capture, which is not modelled.
    if (flags != CU_EVENT_WAIT_DEFAULT) return CUDA_ERROR_INVALID_VALUE;
    stream_wait_count.fetch_add(1, std::memory_order_relaxed);
    // The record as of now; a later record of the event does not move this wait.
    // The event may be of another device, as in CUDA.
    auto record = event->last_record();
    if (!record) return CUDA_SUCCESS;
    if (record->reached()) {
      // Nothing to wait for, but the stream's later work is now ordered after
      // the record (the pools' REUSE_FOLLOW_EVENT_DEPENDENCIES sees it).
      stream->merge(*record);
      return CUDA_SUCCESS;
    }
    // An empty work item whose prerequisite stalls the stream's later work.
    return enqueue(stream, [] {}, {std::move(*record)});
  });
}

}  // namespace gpumem::detail::simulator
