// gpumem-replay's engine (replay.hpp).
//
// Note [Replaying in order]
// The log's seq numbers are one total order of every event from every thread
// (Note [Sequence numbers and reuse] in src/adaptors/logging.cpp). Replay runs one
// thread per logged thread and one stream per logged stream, so that the resource
// sees the same threads and streams, and in seq order it hands a turn from event
// to event: an event runs only when the turn counter reaches its index. The
// resource therefore sees exactly the logged sequence of calls, and the live
// bytes it holds after each call are those of the original run: the peak of live
// bytes is reproduced exactly. (What the resource *reserves* depends on it, not
// on the log: that is what replaying against another resource measures.)
// In thread order each thread runs its own events back to back and a free waits
// only until its allocation has been made, which measures throughput with the
// original concurrency rather than the original interleaving.
//
// Allocations are matched to frees before anything runs: each allocation gets an
// id (its index), each free the id of the live allocation with its pointer at that
// point of the log, so a pointer the original allocator reused is no ambiguity.
#include "replay/replay.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "gpumem/adaptors/resource_adaptor.hpp"
#include "gpumem/config.hpp"
#include "gpumem/error.hpp"
#include "gpumem/stream.hpp"
#include "replay/replay_threads.hpp"

namespace gpumem::tools {
namespace {

constexpr std::size_t no_match = static_cast<std::size_t>(-1);

// Exact current and peak bytes with atomics. (statistics_adaptor's peak is exact
// only from one thread; replay runs many, and a replay's figures must be exact.)
struct peak_counter {
  std::atomic<std::uint64_t> current{0};
  std::atomic<std::uint64_t> peak{0};
  void add(std::uint64_t n) {
    const std::uint64_t now = current.fetch_add(n, std::memory_order_relaxed) + n;
    std::uint64_t p = peak.load(std::memory_order_relaxed);
    while (now > p && !peak.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
    }
  }
  void remove(std::uint64_t n) { current.fetch_sub(n, std::memory_order_relaxed); }
};

// Counts what the stack takes from the driver.
class counting_adaptor final : public resource_adaptor {
 public:
  counting_adaptor(std::shared_ptr<memory_resource> up, peak_counter& c)
      : resource_adaptor(std::move(up), "counting_adaptor"), counter_(c) {}

 private:
  void* do_allocate(std::size_t bytes, stream_view s, std::size_t alignment) override {
    void* p = upstream_allocate(bytes, s, alignment);
    counter_.add(bytes);
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes, stream_view s, std::size_t alignment) override {
    upstream_deallocate(p, bytes, s, alignment);
    counter_.remove(bytes);
  }
  peak_counter& counter_;
};

struct step {
  const logged_event* event;
  std::size_t index;       // position in the replayed sequence (the turn)
  std::size_t allocation;  // for a free: the index of its allocation; no_match if none
  stream_view stream;
};

}  // namespace

stream_view replay_stream(replay_stream_set& set, std::uint64_t logged, int device) {
  if (logged == 0) return stream_view{};
  if (logged == reinterpret_cast<std::uintptr_t>(CU_STREAM_LEGACY)) return stream_view::legacy_default();
  if (logged == reinterpret_cast<std::uintptr_t>(CU_STREAM_PER_THREAD)) return stream_view::per_thread();
  auto& s = set.by_logged[logged];
  if (!s) s = std::make_unique<stream>(device);
  return s->view();
}

void make_replay_streams(replay_stream_set& set, const std::vector<logged_event>& events, int device,
                         const std::string& source) {
  for (const logged_event& e : events) {
    if (e.source == source && e.ok()) (void)replay_stream(set, e.stream, device);
  }
}

replay_result replay_events_on(const std::vector<logged_event>& events, memory_resource& mr,
                               const replay_options& options, const replay_observer& observer) {
  replay_result result;
  result.events_in_log = events.size();

  // ---- the original peaks, and which rows are replayed ----
  std::vector<const logged_event*> chosen;
  std::vector<std::size_t> match;  // per chosen row: for frees, the chosen index of the allocation
  {
    std::unordered_map<std::uint64_t, std::size_t> live_by_ptr;  // ptr -> chosen index
    std::uint64_t live = 0, reserved = 0;
    std::unordered_map<std::uint64_t, std::uint64_t> reserved_by_ptr;
    for (const logged_event& e : events) {
      if (e.source == "upstream") {  // the original resource's own requests: reserved bytes
        if (e.ok() && e.allocate) {
          reserved += e.bytes;
          reserved_by_ptr[e.ptr] = e.bytes;
          result.log_peak_reserved_bytes = std::max(result.log_peak_reserved_bytes, reserved);
        } else if (e.ok()) {
          auto it = reserved_by_ptr.find(e.ptr);
          if (it != reserved_by_ptr.end()) {
            reserved -= it->second;
            reserved_by_ptr.erase(it);
          }
        }
      }
      if (e.source != options.source || !e.ok()) {
        ++result.skipped;
        continue;
      }
      if (e.allocate) {
        live_by_ptr[e.ptr] = chosen.size();
        live += e.bytes;
        result.log_peak_live_bytes = std::max(result.log_peak_live_bytes, live);
        chosen.push_back(&e);
        match.push_back(no_match);
      } else {
        auto it = live_by_ptr.find(e.ptr);
        if (it == live_by_ptr.end()) {  // allocated before the log began
          ++result.skipped;
          continue;
        }
        live -= chosen[it->second]->bytes;
        chosen.push_back(&e);
        match.push_back(it->second);
        live_by_ptr.erase(it);
      }
    }
  }

  peak_counter live;

  // ---- streams and threads as logged ----
  replay_stream_set own_streams;
  replay_stream_set& stream_set = options.streams != nullptr ? *options.streams : own_streams;
  auto& streams = stream_set.by_logged;
  auto view_of = [&](std::uint64_t logged) { return replay_stream(stream_set, logged, options.device); };
  std::map<std::uint32_t, std::vector<step>> per_thread;
  std::set<std::uint64_t> logged_streams;
  for (std::size_t k = 0; k < chosen.size(); ++k) {
    logged_streams.insert(chosen[k]->stream);
    per_thread[chosen[k]->thread].push_back({chosen[k], k, match[k], view_of(chosen[k]->stream)});
  }
  result.threads = per_thread.size();
  result.streams = logged_streams.size();

  // ---- replay ----
  std::vector<void*> pointer(chosen.size(), nullptr);  // per allocation index; written once
  std::vector<std::atomic<int>> state(chosen.size());  // 0 not yet, 1 allocated, 2 failed
  std::mutex done_mutex;
  std::condition_variable done_cv;  // thread order: an allocation happened
  std::mutex results_mutex;

  // One OS thread per logged thread, up to max_replay_threads; beyond that, logged
  // threads share them, each worker taking its threads' calls in seq order (a log of
  // a program with 20,000 threads cannot have 20,000 here: thread creation fails, or
  // handing the turn among them takes minutes). Both orders stay deadlock-free: a
  // worker only ever waits for an event of smaller seq.
  std::vector<std::vector<step>> work(std::min(per_thread.size(), max_replay_threads));
  std::vector<std::uint32_t> owner(chosen.size());  // the worker of each event
  {
    std::size_t k = 0;
    for (auto& [thread, steps] : per_thread) {
      const std::size_t w = k++ % work.size();
      for (const step& st : steps) owner[st.index] = static_cast<std::uint32_t>(w);
      work[w].insert(work[w].end(), steps.begin(), steps.end());
    }
    for (auto& w : work) std::sort(w.begin(), w.end(), [](const step& a, const step& b) { return a.index < b.index; });
  }
  // Seq order: each worker waits on its own word for the index of the event it may
  // run next, raised by the worker that ran the event before it (Note [Handing the
  // turn over] in replay_threads.cpp). A word to itself, so that a worker waiting
  // for its turn reads a line that nobody writes until the turn comes.
  struct alignas(64) turn_word {
    std::atomic<std::size_t> next{0};
  };
  std::vector<turn_word> turn(work.size());
  const bool may_spin = work.size() < std::max(2U, std::thread::hardware_concurrency());
  auto give_up = [&] {  // after an error: every waiting worker stops
    for (turn_word& t : turn) {
      t.next.store(static_cast<std::size_t>(-1) / 2, std::memory_order_release);
      t.next.notify_all();
    }
  };
  struct alignas(64) tally {  // a line of its own: each worker writes its own at every call
    std::size_t replayed = 0, allocations = 0, failures = 0, skipped = 0;
  };
  std::vector<tally> tallies(work.size());

  // Runs worker w's steps; returns early when another gave up.
  auto run = [&](std::size_t w) {
    const std::vector<step>& steps = work[w];
    tally& count = tallies[w];
    for (std::size_t i = 0; i < steps.size(); ++i) {
      const step& s = steps[i];
      const logged_event& e = *s.event;
      const bool ran_the_one_before = i > 0 && steps[i - 1].index + 1 == s.index;
      if (options.order == replay_order::seq && !ran_the_one_before &&
          await_at_least(turn[w].next, s.index, may_spin) != s.index) {
        return;
      }
      if (e.allocate) {
        try {
          pointer[s.index] = mr.allocate(e.bytes, s.stream, e.alignment);
          live.add(e.bytes);
          ++count.allocations;
          state[s.index].store(1, std::memory_order_release);
        } catch (const std::exception& err) {  // out_of_memory, or a driver error
          ++count.failures;
          state[s.index].store(2, std::memory_order_release);
          std::lock_guard lock(results_mutex);
          if (result.failure_messages.size() < 5) {
            result.failure_messages.push_back("seq " + std::to_string(e.seq) + ": " + err.what());
          }
        }
        ++count.replayed;
        if (options.order == replay_order::thread) {
          std::lock_guard lock(done_mutex);
          done_cv.notify_all();
        }
      } else {
        if (options.order == replay_order::thread) {
          std::unique_lock lock(done_mutex);
          done_cv.wait(lock, [&] { return state[s.allocation].load(std::memory_order_acquire) != 0; });
        }
        if (state[s.allocation].load(std::memory_order_acquire) == 1) {
          live.remove(e.bytes);
          mr.deallocate(pointer[s.allocation], e.bytes, s.stream, e.alignment);
          state[s.allocation].store(3, std::memory_order_release);  // freed
          ++count.replayed;
        } else {
          ++count.skipped;  // its allocation failed here
        }
      }
      if (observer) observer(s.index, live.current.load(std::memory_order_relaxed));
      const std::size_t next = s.index + 1;
      if (options.order == replay_order::seq && next < chosen.size() && owner[next] != w) {
        turn[owner[next]].next.store(next, std::memory_order_release);
        turn[owner[next]].next.notify_all();
      }
    }
  };

  // The timed region runs from the moment the last worker is ready to the moment
  // the last one is done and the streams are synchronized, both seen by a worker:
  // neither the threads' start nor the caller's wake-up is the resource's time.
  std::atomic<std::size_t> ready{0}, started{0}, finished{0};
  std::chrono::steady_clock::time_point t0, t1;
  std::exception_ptr worker_error;
  std::mutex error_mutex;
  auto keep_error = [&] {
    std::lock_guard lock(error_mutex);
    if (!worker_error) worker_error = std::current_exception();
  };
  const std::function<void(std::size_t)> body = [&](std::size_t k) {
    if (ready.fetch_add(1, std::memory_order_acq_rel) + 1 == work.size()) {
      t0 = std::chrono::steady_clock::now();
      started.store(1, std::memory_order_release);
      started.notify_all();
    } else {
      await_at_least(started, 1, may_spin);
    }
    try {
      run(k);
    } catch (...) {
      keep_error();
      give_up();
    }
    if (finished.fetch_add(1, std::memory_order_acq_rel) + 1 == work.size()) {
      try {
        for (auto& [handle, st] : streams) st->synchronize();
      } catch (...) {
        keep_error();
      }
      t1 = std::chrono::steady_clock::now();
    }
  };
  replay_threads own_threads;
  replay_threads& threads = options.threads != nullptr ? *options.threads : own_threads;
  try {
    threads.run(work.size(), body);
  } catch (const std::system_error& e) {  // no more threads: nothing ran
    throw std::runtime_error("gpumem-replay: could not start thread " + std::to_string(threads.size() + 1) + " of " +
                             std::to_string(work.size()) + ": " + e.what());
  }
  result.seconds = std::chrono::duration<double>(t1 - t0).count();

  // What the log never freed. After a worker's error the resource may fail here
  // too (a broken context fails every call); the worker's error is the one that
  // says what went wrong, so the clean-up's own is dropped then.
  const auto free_what_is_left = [&] {
    for (std::size_t k = 0; k < chosen.size(); ++k) {
      if (chosen[k]->allocate && state[k].load() == 1) {
        ++result.left_live;
        mr.deallocate(pointer[k], chosen[k]->bytes, view_of(chosen[k]->stream), chosen[k]->alignment);
      }
    }
    for (auto& [handle, s] : streams) s->synchronize();
  };
  if (worker_error) {
    try {
      free_what_is_left();
    } catch (...) {
    }
    std::rethrow_exception(worker_error);
  }
  free_what_is_left();

  for (const tally& t : tallies) {
    result.replayed += t.replayed;
    result.allocations += t.allocations;
    result.failures += t.failures;
    result.skipped += t.skipped;
  }
  result.peak_live_bytes = live.peak.load();
  return result;
}

replay_result replay_events(const std::vector<logged_event>& events, const replay_options& options) {
  // The stack, with what it takes from the driver counted.
  peak_counter reserved;
  config_hooks hooks;
  bool counted = false;
  hooks.wrap_device_memory = [&](std::shared_ptr<memory_resource> r) {
    counted = true;
    return std::shared_ptr<memory_resource>(std::make_shared<counting_adaptor>(std::move(r), reserved));
  };
  std::shared_ptr<memory_resource> stack = make_resource_from_config(options.resource, options.device, hooks);
  replay_result result = replay_events_on(events, *stack, options);
  stack.reset();  // a pool gives its chunks back: the peak is final
  result.peak_reserved_bytes = reserved.peak.load();
  result.reserved_counted = counted;
  return result;
}

}  // namespace gpumem::tools
