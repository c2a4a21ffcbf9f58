// Streams: workers, FIFO execution, the legacy default stream's rules, stream
// clocks, and the stream entry points (see sim_stream.hpp).
#include "sim/sim_stream.hpp"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "driver/capture_watch_state.hpp"
#include "sim/sim_capture_rules.hpp"
#include "sim/sim_entry_points.hpp"
#include "sim/sim_graph.hpp"
#include "sim/sim_pool.hpp"
#include "sim/sim_state.hpp"

namespace gpumem::detail::simulator {
namespace {

std::atomic<std::uint64_t> next_stream_id{1};
std::atomic<std::uint64_t> next_capture_id{1};

// Raises `clock`'s entry for `id` to at least `sequence`; true if it changed.
bool raise(stream_clock& clock, std::uint64_t id, std::uint64_t sequence) {
  auto it = std::lower_bound(clock.begin(), clock.end(), id,
                             [](const auto& entry, std::uint64_t key) { return entry.first < key; });
  if (it != clock.end() && it->first == id) {
    if (it->second >= sequence) return false;
    it->second = sequence;
    return true;
  }
  clock.insert(it, {id, sequence});
  return true;
}

}  // namespace

bool clock_covers(const stream_clock* clock, std::uint64_t id, std::uint64_t sequence) {
  if (clock == nullptr) return false;
  auto it = std::lower_bound(clock->begin(), clock->end(), id,
                             [](const auto& entry, std::uint64_t key) { return entry.first < key; });
  return it != clock->end() && it->first == id && it->second >= sequence;
}

bool stream_position::reached() const { return stream->has_reached(sequence); }
void stream_position::wait() const { stream->wait_for(sequence); }

bool stream_position::covers(std::uint64_t id, std::uint64_t at) const {
  if (stream != nullptr && stream->id() == id && at <= sequence) return true;
  return clock_covers(clock.get(), id, at);
}

sim_stream::sim_stream(sim_context& context, stream_kind kind, passkey)
    : context_(context), kind_(kind), id_(next_stream_id.fetch_add(1, std::memory_order_relaxed)) {}

std::shared_ptr<sim_stream> sim_stream::start(sim_context& context, stream_kind kind) {
  auto stream = std::make_shared<sim_stream>(context, kind, passkey{});
  // Detached: the worker owns a reference and ends by itself after close();
  // at process exit it may still be blocked waiting for work, which is harmless
  // because nothing it touches is ever destroyed.
  std::thread([stream] { stream->run_worker(); }).detach();
  return stream;
}

int sim_stream::device() const { return context_.device(); }

void sim_stream::run_worker() {
  mark_worker_thread();  // host functions run here and must not call the driver
  for (;;) {
    queued_work item;
    {
      std::unique_lock lock(mutex_);
      work_available_.wait(lock, [&] { return !queue_.empty() || closed_; });
      if (queue_.empty()) break;  // closed and drained
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    // Device-side waits (cuStreamWaitEvent, legacy rules): this stream stalls, the host does not.
    for (const stream_position& p : item.prerequisites) p.wait();
    item.run();
    item = {};  // drop what the work held (other streams, events) before reporting progress
    {
      std::lock_guard lock(mutex_);
      ++completed_;
    }
    progress_.notify_all();
  }
  context_.remove_stream(this);
}

std::optional<stream_position> sim_stream::submit(std::vector<stream_position> prerequisites, work w) {
  std::uint64_t sequence = 0;
  std::shared_ptr<const stream_clock> clock;
  {
    std::lock_guard lock(mutex_);
    if (closed_) return std::nullopt;
    for (const stream_position& p : prerequisites) merge_locked(p);
    queue_.push_back(queued_work{std::move(prerequisites), std::move(w)});
    sequence = ++submitted_;
    clock = clock_;
  }
  work_available_.notify_one();
  return stream_position{shared_from_this(), sequence, std::move(clock)};
}

void sim_stream::merge_locked(const stream_position& p) {
  if (p.stream == nullptr || p.stream.get() == this) return;
  // Copy on write: positions handed out earlier keep the clock they had.
  stream_clock next = clock_ ? *clock_ : stream_clock{};
  bool changed = raise(next, p.stream->id(), p.sequence);
  if (p.clock) {
    for (const auto& [id, sequence] : *p.clock) {
      if (id != id_) changed = raise(next, id, sequence) || changed;
    }
  }
  if (changed) clock_ = std::make_shared<const stream_clock>(std::move(next));
}

void sim_stream::merge(const stream_position& p) {
  std::lock_guard lock(mutex_);
  merge_locked(p);
}

bool sim_stream::ordered_after(std::uint64_t id, std::uint64_t sequence) const {
  if (id == id_) return true;  // FIFO: later work follows everything queued before
  std::lock_guard lock(mutex_);
  return clock_covers(clock_.get(), id, sequence);
}

std::optional<stream_position> sim_stream::pending_tail() {
  std::lock_guard lock(mutex_);
  if (completed_ == submitted_) return std::nullopt;
  return stream_position{shared_from_this(), submitted_, clock_};
}

stream_position sim_stream::tail() {
  std::lock_guard lock(mutex_);
  return stream_position{shared_from_this(), submitted_, clock_};
}

bool sim_stream::idle() const {
  std::lock_guard lock(mutex_);
  return completed_ == submitted_;
}

bool sim_stream::has_reached(std::uint64_t sequence) const {
  std::lock_guard lock(mutex_);
  return completed_ >= sequence;
}

void sim_stream::wait_for(std::uint64_t sequence) const {
  std::unique_lock lock(mutex_);
  progress_.wait(lock, [&] { return completed_ >= sequence; });
}

void sim_stream::synchronize() {
  std::unique_lock lock(mutex_);
  const std::uint64_t target = submitted_;
  progress_.wait(lock, [&] { return completed_ >= target; });
}

void sim_stream::close() {
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
  }
  work_available_.notify_one();
}

bool is_default_stream_handle(CUstream handle) {
  return handle == nullptr || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD;
}

CUresult resolve_stream(sim_state& state, CUstream handle, std::shared_ptr<sim_stream>& out) {
  if (is_default_stream_handle(handle)) {
    sim_context* context = nullptr;
    if (CUresult r = require_current_context(context); r != CUDA_SUCCESS) return r;
    out = context->legacy_stream();
    return CUDA_SUCCESS;
  }
  out = state.streams.find(handle);
  return out != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

namespace {

// The streams whose earlier work the legacy rules make `stream`'s next work wait for.
std::vector<std::shared_ptr<sim_stream>> implicitly_awaited(const sim_stream& stream) {
  std::vector<std::shared_ptr<sim_stream>> out;
  sim_context& context = stream.context();
  switch (stream.kind()) {
    case stream_kind::legacy_default:
      for (auto& other : context.streams()) {
        if (other->kind() == stream_kind::blocking) out.push_back(std::move(other));
      }
      break;
    case stream_kind::blocking:
      if (auto legacy = context.started_legacy_stream()) out.push_back(std::move(legacy));
      break;
    case stream_kind::non_blocking:
      break;
  }
  return out;
}

void add_implicit_prerequisites(const sim_stream& stream, std::vector<stream_position>& prerequisites) {
  // Each position captured here is of work queued before this call, so waits
  // only ever point backwards in submission order and cannot form a cycle.
  for (const auto& other : implicitly_awaited(stream)) {
    if (auto tail = other->pending_tail()) prerequisites.push_back(std::move(*tail));
  }
}

}  // namespace

CUresult enqueue(const std::shared_ptr<sim_stream>& stream, sim_stream::work w,
                 std::vector<stream_position> prerequisites, stream_position* position) {
  if (stream->capturing()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  // no graphs here
  add_implicit_prerequisites(*stream, prerequisites);
  auto queued = stream->submit(std::move(prerequisites), std::move(w));
  if (!queued) return CUDA_ERROR_INVALID_HANDLE;
  if (position != nullptr) *position = std::move(*queued);
  return CUDA_SUCCESS;
}

CUresult order_point(const std::shared_ptr<sim_stream>& stream, stream_position* position) {
  std::vector<stream_position> implicit;
  add_implicit_prerequisites(*stream, implicit);
  if (implicit.empty()) {
    *position = stream->tail();
    return CUDA_SUCCESS;
  }
  auto queued = stream->submit(std::move(implicit), [] {});
  if (!queued) return CUDA_ERROR_INVALID_HANDLE;
  *position = std::move(*queued);
  return CUDA_SUCCESS;
}

bool next_work_ordered_after(const std::shared_ptr<sim_stream>& stream, std::uint64_t id,
                             std::uint64_t sequence) {
  if (stream->ordered_after(id, sequence)) return true;
  for (const auto& other : implicitly_awaited(*stream)) {
    if (other->tail().covers(id, sequence)) return true;
  }
  return false;
}

// ---- entry points ----

namespace {

CUresult create_stream(CUstream* handle, unsigned int flags) {
  return entry_point([&](sim_state& state) {
    sim_context* context = nullptr;
    if (CUresult r = require_current_context(context); r != CUDA_SUCCESS) return r;
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (flags != CU_STREAM_DEFAULT && flags != CU_STREAM_NON_BLOCKING) return CUDA_ERROR_INVALID_VALUE;
    auto stream = sim_stream::start(
        *context, flags == CU_STREAM_NON_BLOCKING ? stream_kind::non_blocking : stream_kind::blocking);
    context->add_stream(stream);
    state.streams.add(stream);
    *handle = to_handle(stream.get());
    return CUDA_SUCCESS;
  });
}

}  // namespace

CUresult stream_create(CUstream* stream, unsigned int flags) { return create_stream(stream, flags); }

CUresult stream_create_with_priority(CUstream* stream, unsigned int flags, int /*priority*/) {
  // Priorities are accepted and not modelled: every stream has its own worker anyway.
  return create_stream(stream, flags);
}

CUresult stream_destroy(CUstream handle) {
  return entry_point([&](sim_state& state) {
    if (is_default_stream_handle(handle)) return CUDA_ERROR_INVALID_HANDLE;
    std::shared_ptr<sim_stream> stream = state.streams.remove(handle);
    if (stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (stream->capturing()) {
      capture_ended(stream.get());  // a capture it never ended forbids nothing more
      CUgraph g = stream->take_capture_graph();
      add_allocation_nodes(g, stream->take_captured_allocations());
      drop_graph(state, g);
    }
    stream->close();  // returns at once; queued work still runs
    return CUDA_SUCCESS;
  });
}

namespace {
// A call the driver does not permit on a capturing stream: it fails and the
// capture is invalidated (its end then fails with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED).
CUresult refuse_under_capture(sim_stream& stream) {
  stream.invalidate_capture();
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}
}  // namespace

CUresult stream_get_device(CUstream handle, CUdevice* device) {
  return entry_point([&](sim_state& state) {
    std::shared_ptr<sim_stream> stream;
    if (CUresult r = resolve_stream(state, handle, stream); r != CUDA_SUCCESS) return r;
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (stream->capturing()) return refuse_under_capture(*stream);
    *device = stream->device();
    return CUDA_SUCCESS;
  });
}

CUresult stream_synchronize(CUstream handle) {
  return entry_point([&](sim_state& state) {
    std::shared_ptr<sim_stream> stream;
    if (CUresult r = resolve_stream(state, handle, stream); r != CUDA_SUCCESS) return r;
    if (stream->capturing()) return refuse_under_capture(*stream);
    if (CUresult r = unsafe_call_permitted(); r != CUDA_SUCCESS) return r;  // sim_capture_rules.hpp
    const stream_position tail = stream->tail();
    tail.wait();
    // The host has now seen this work complete: a synchronization point for the pools.
    observe_synchronization(state, host_observation::of_position(tail));
    return CUDA_SUCCESS;
  });
}

CUresult stream_query(CUstream handle) {
  return entry_point([&](sim_state& state) {
    std::shared_ptr<sim_stream> stream;
    if (CUresult r = resolve_stream(state, handle, stream); r != CUDA_SUCCESS) return r;
    if (stream->capturing()) return refuse_under_capture(*stream);
    if (CUresult r = unsafe_call_permitted(); r != CUDA_SUCCESS) return r;  // sim_capture_rules.hpp
    return stream->idle() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
  });
}

CUresult launch_host_func(CUstream handle, CUhostFn fn, void* user_data) {
  return entry_point([&](sim_state& state) {
    std::shared_ptr<sim_stream> stream;
    if (CUresult r = resolve_stream(state, handle, stream); r != CUDA_SUCCESS) return r;
    if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return enqueue(stream, [fn, user_data] { fn(user_data); });
  });
}

// Stream capture: a state, no graph. The legacy default stream cannot be
// captured (as with the driver); a captured stream refuses work (enqueue), but for
// graph memory (sim_graph.hpp). Begins and ends are reported to the capture watch,
// as CUPTI reports the driver's.

CUresult stream_begin_capture(CUstream handle, CUstreamCaptureMode mode) {
  return entry_point([&](sim_state& state) {
    std::shared_ptr<sim_stream> stream;
    if (CUresult r = resolve_stream(state, handle, stream); r != CUDA_SUCCESS) return r;
    if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (stream->kind() == stream_kind::legacy_default) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (stream->capturing()) return CUDA_ERROR_ILLEGAL_STATE;
    capture_watch_begin_entered();  // as CUPTI reports a begin: before the stream captures
    stream->set_capture_graph(make_graph(), next_capture_id.fetch_add(1, std::memory_order_relaxed));
    stream->set_capturing(true);
    capture_begun(stream, mode);  // what it forbids elsewhere: sim_capture_rules.hpp
    return CUDA_SUCCESS;
  });
}

CUresult stream_end_capture(CUstream handle, CUgraph* graph) {
  return entry_point([&](sim_state& state) {
    std::shared_ptr<sim_stream> stream;
    if (CUresult r = resolve_stream(state, handle, stream); r != CUDA_SUCCESS) return r;
    if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!stream->capturing()) return CUDA_ERROR_ILLEGAL_STATE;
    const bool invalidated = stream->capture_invalidated();
    CUgraph g = stream->take_capture_graph();
    add_allocation_nodes(g, stream->take_captured_allocations());
    stream->set_capturing(false);
    capture_ended(stream.get());
    capture_watch_capture_ended();
    if (invalidated) {
      // The driver destroys the graph: its allocations and user objects go (measured).
      drop_graph(state, g);
      *graph = nullptr;
      return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    *graph = g;
    return CUDA_SUCCESS;
  });
}

CUresult stream_is_capturing(CUstream handle, CUstreamCaptureStatus* status) {
  return entry_point([&](sim_state& state) {
    std::shared_ptr<sim_stream> stream;
    if (CUresult r = resolve_stream(state, handle, stream); r != CUDA_SUCCESS) return r;
    if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *status = !stream->capturing()            ? CU_STREAM_CAPTURE_STATUS_NONE
              : stream->capture_invalidated() ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                              : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    return CUDA_SUCCESS;
  });
}

CUresult stream_get_capture_info(CUstream handle, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                                 const CUgraphNode** dependencies, const CUgraphEdgeData** edge_data,
                                 std::size_t* dependency_count) {
  return entry_point([&](sim_state& state) {
    std::shared_ptr<sim_stream> stream;
    if (CUresult r = resolve_stream(state, handle, stream); r != CUDA_SUCCESS) return r;
    if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!stream->capturing()) {
      *status = CU_STREAM_CAPTURE_STATUS_NONE;
      return CUDA_SUCCESS;
    }
    std::uint64_t capture = 0;
    const CUgraph g = stream->capture_graph(&capture);
    const bool invalidated = stream->capture_invalidated();
    *status = invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    if (id != nullptr) *id = capture;
    if (graph != nullptr) *graph = invalidated ? nullptr : g;  // the driver may drop an invalidated one early
    if (dependencies != nullptr) *dependencies = nullptr;  // no nodes but allocations here
    if (edge_data != nullptr) *edge_data = nullptr;
    if (dependency_count != nullptr) *dependency_count = 0;
    return CUDA_SUCCESS;
  });
}

}  // namespace gpumem::detail::simulator
