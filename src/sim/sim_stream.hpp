// Streams: FIFO queues of work, each run asynchronously by its own host worker
// thread, the legacy default stream's implicit synchronization rules, and the
// ordering knowledge (stream clocks) the stream-ordered pools reuse memory by.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include <cuda.h>

namespace gpumem::detail::simulator {

class sim_context;
class sim_state;
class sim_stream;

// Note [Stream clocks]
// A stream clock says which positions of other streams a stream's work is
// ordered after: entry (id, n) means "everything queued here from now on runs
// after the first n items of stream `id`". It grows when work is queued with
// prerequisites (cuStreamWaitEvent, the legacy default stream's rules) and
// merges the prerequisite's own clock, so the knowledge is transitive: A waits
// for B which waited for C makes A ordered after C. Streams are named by a
// unique id, never by address: a destroyed stream's address is reused by new
// ones, and a stale entry must not make an unrelated stream look ordered.
// The pools use it for CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, and
// synchronizations use it to say which frees the host has now seen complete.
using stream_clock = std::vector<std::pair<std::uint64_t, std::uint64_t>>;  // (stream id, sequence), by id

// Whether `clock` (may be null) holds (id, >= sequence).
bool clock_covers(const stream_clock* clock, std::uint64_t id, std::uint64_t sequence);

// A point in a stream's work: reached once the stream has completed its first
// `sequence` items. Events record positions; waits and the legacy rules wait for them.
struct stream_position {
  std::shared_ptr<sim_stream> stream;
  std::uint64_t sequence = 0;
  // What the position is ordered after on other streams (null: nothing).
  std::shared_ptr<const stream_clock> clock;

  bool reached() const;
  void wait() const;
  // Whether this position is at or after (id, sequence) in stream order.
  bool covers(std::uint64_t id, std::uint64_t sequence) const;
};

enum class stream_kind {
  legacy_default,  // handle 0 / CU_STREAM_LEGACY (and CU_STREAM_PER_THREAD, see docs/simulator.md)
  blocking,        // CU_STREAM_DEFAULT: synchronizes with the legacy default stream
  non_blocking,    // CU_STREAM_NON_BLOCKING: does not
};

class sim_stream : public std::enable_shared_from_this<sim_stream> {
  struct passkey {};

 public:
  using work = std::function<void()>;

  // Creates a stream and starts its worker. The caller registers it with the context.
  static std::shared_ptr<sim_stream> start(sim_context& context, stream_kind kind);
  sim_stream(sim_context& context, stream_kind kind, passkey);

  sim_context& context() const { return context_; }
  int device() const;
  stream_kind kind() const { return kind_; }
  // Unique for the life of the process (see Note [Stream clocks]).
  std::uint64_t id() const { return id_; }

  // Appends `w`, to run once every prerequisite is reached and all earlier work
  // of this stream is done. Returns the position just after it, or nullopt if
  // the stream was destroyed (closed) meanwhile.
  std::optional<stream_position> submit(std::vector<stream_position> prerequisites, work w);

  // The position after the work queued so far, or nullopt when all of it is done.
  std::optional<stream_position> pending_tail();
  // The position after the work queued so far, done or not.
  stream_position tail();
  // Later work is ordered after `p` without queuing anything (a wait on a
  // position already reached).
  void merge(const stream_position& p);
  // Whether work queued on this stream from now on runs after (id, sequence).
  bool ordered_after(std::uint64_t id, std::uint64_t sequence) const;

  bool idle() const;
  bool has_reached(std::uint64_t sequence) const;
  void wait_for(std::uint64_t sequence) const;
  // Waits for the work queued so far (not for work queued meanwhile).
  void synchronize();

  // cuStreamDestroy: no more work is accepted; the worker finishes what is
  // queued, leaves the context's stream list and ends.
  void close();

  // Stream capture (cuStreamBeginCapture/EndCapture): the simulator builds no
  // graphs, so work queued while capturing is refused (see enqueue).
  // As with the driver, a call that is not permitted on a capturing stream (a
  // query, a synchronization) fails and invalidates the capture: its end fails too.
  bool capturing() const { return capturing_.load(std::memory_order_acquire); }
  void set_capturing(bool on) {
    capture_invalidated_.store(false, std::memory_order_release);
    capturing_.store(on, std::memory_order_release);
  }
  bool capture_invalidated() const { return capture_invalidated_.load(std::memory_order_acquire); }
  void invalidate_capture() { capture_invalidated_.store(true, std::memory_order_release); }
  // The allocation nodes of the capture in progress (cuMemAllocAsync under capture);
  // its end hands them to the graph.
  struct graph_node {
    CUdeviceptr pointer;
    int device;
    std::uint64_t id;
  };
  void add_captured_allocation(graph_node p) {
    std::lock_guard lock(mutex_);
    captured_allocations_.push_back(p);
  }
  std::vector<graph_node> take_captured_allocations() {
    std::lock_guard lock(mutex_);
    return std::exchange(captured_allocations_, {});
  }
  // The graph the capture in progress builds (sim_graph.hpp), and the capture's id.
  void set_capture_graph(CUgraph graph, std::uint64_t id) {
    std::lock_guard lock(mutex_);
    capture_graph_ = graph;
    capture_id_ = id;
  }
  CUgraph capture_graph(std::uint64_t* id = nullptr) const {
    std::lock_guard lock(mutex_);
    if (id != nullptr) *id = capture_id_;
    return capture_graph_;
  }
  CUgraph take_capture_graph() {
    std::lock_guard lock(mutex_);
    return std::exchange(capture_graph_, nullptr);
  }

 private:
  struct queued_work {
    std::vector<stream_position> prerequisites;
    work run;
  };
  void run_worker();
  void merge_locked(const stream_position& p);

  sim_context& context_;
  const stream_kind kind_;
  const std::uint64_t id_;

  mutable std::mutex mutex_;
  std::condition_variable work_available_;
  mutable std::condition_variable progress_;
  std::deque<queued_work> queue_;
  std::uint64_t submitted_ = 0;
  std::uint64_t completed_ = 0;
  bool closed_ = false;
  std::atomic<bool> capturing_{false};
  std::atomic<bool> capture_invalidated_{false};
  std::vector<graph_node> captured_allocations_;
  CUgraph capture_graph_ = nullptr;
  std::uint64_t capture_id_ = 0;
  std::shared_ptr<const stream_clock> clock_;  // copied on write: positions share snapshots
};

inline CUstream to_handle(sim_stream* stream) { return reinterpret_cast<CUstream>(stream); }

// 0, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD: the current context's legacy default stream.
bool is_default_stream_handle(CUstream handle);

// The stream behind a handle. CUDA_ERROR_INVALID_CONTEXT for a default-stream
// handle without a current context, CUDA_ERROR_INVALID_HANDLE for a handle that
// is not a live stream.
CUresult resolve_stream(sim_state& state, CUstream handle, std::shared_ptr<sim_stream>& out);

// Queues work on a stream under the legacy default stream's rules: work on the
// legacy stream also waits for all work queued before it on the context's
// blocking streams, and work on a blocking stream also waits for the work queued
// before it on the legacy stream. CUDA_ERROR_INVALID_HANDLE if the stream was
// destroyed meanwhile.
CUresult enqueue(const std::shared_ptr<sim_stream>& stream, sim_stream::work w,
                 std::vector<stream_position> prerequisites = {},
                 stream_position* position = nullptr);

// The point in `stream`'s order that an operation issued now (cuMemFreeAsync)
// takes effect at: after all work queued on it so far and, under the legacy
// rules, after the work it implicitly waits for. Queues an empty marker only
// when such implicit work is pending. CUDA_ERROR_INVALID_HANDLE if the stream
// was destroyed meanwhile.
CUresult order_point(const std::shared_ptr<sim_stream>& stream, stream_position* position);

// Whether the next work queued on `stream` runs after (id, sequence): through
// its clock, or through the legacy rules' implicit waits.
bool next_work_ordered_after(const std::shared_ptr<sim_stream>& stream, std::uint64_t id,
                             std::uint64_t sequence);

}  // namespace gpumem::detail::simulator
