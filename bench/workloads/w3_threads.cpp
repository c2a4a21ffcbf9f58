// W3 threads: W2's max 4 MiB variant on 1, 4 and 16 threads sharing one
// resource, each thread with its own non-blocking stream and its own op
// sequence (seed 1 + thread index). The figure is aggregate millions of ops per
// second, timed from a start barrier that releases every thread at once to the
// last thread's finish; each thread frees what it still holds and synchronizes
// its stream inside that time. It measures an allocator under contention:
// shared locks, per-stream state, what a thread pays for the others.
//
// A repetition replays each thread's sequence as many times as make it last
// about --rep-ms (judged by the last untimed pass of the warm-up, Note [Warming
// up until the passes settle]): a fast pool
// does 20,000 ops in about a millisecond, where waking 16 threads and the
// scheduler's jitter would be a large share of the figure.
//
// Each thread's list of live allocations is its own: made and reserved on the
// thread, not kept side by side in one array. Vector headers in one array share
// cache lines, and every allocate and free writes its thread's header: that
// false sharing cost a fast pool two thirds of its 4-thread throughput (W3 on an
// H100: 1.3x for 4 threads against 1 before, docs/benchmarks-first-runs.md).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <exception>
#include <iterator>
#include <thread>
#include <utility>

#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "harness.hpp"
#include "plot.hpp"
#include "report.hpp"
#include "workloads/random_ops.hpp"
#include "workloads/registry.hpp"

namespace gpumem::bench {
namespace {

constexpr std::size_t thread_counts[] = {1, 4, 16};
constexpr std::size_t max_bytes = std::size_t{4} << 20;
constexpr std::uint64_t first_seed = 1;

std::size_t ops_per_thread(const options& opts) { return opts.quick ? 2000 : 20000; }

using clock_type = std::chrono::steady_clock;

// Takes a timestamp each time the barrier's phase completes: after the last
// thread arrives and before any is released, so the start stamp is the moment
// all threads go and the finish stamp the moment the last one is done.
struct stamp {
  clock_type::time_point* at;
  void operator()() noexcept { *at = clock_type::now(); }
};

// Threads that run their op sequences on `mr` once per run(), all started by
// one barrier. They live for the whole cell, so the warm-up pays for each
// thread's first use (context, the pool's per-thread cache) and no timed run
// pays for creating threads.
class team {
 public:
  team(memory_resource& mr, int device, std::vector<stream>& streams,
       const std::vector<std::vector<random_op>>& ops)
      : mr_(mr),
        device_(device),
        streams_(streams),
        ops_(ops),
        errors_(ops.size()),
        sync_(static_cast<std::ptrdiff_t>(ops.size() + 1), stamp{&now_}) {
    threads_.reserve(ops.size());
    try {
      for (std::size_t i = 0; i < ops.size(); ++i) threads_.emplace_back([this, i] { work(i); });
    } catch (...) {
      // The threads made so far wait at the start barrier for all the others.
      for (std::size_t i = threads_.size(); i < ops.size(); ++i) sync_.arrive_and_drop();
      stop_and_join();
      throw;
    }
  }

  ~team() { stop_and_join(); }

  team(const team&) = delete;
  team& operator=(const team&) = delete;

  // Each thread replays its sequence this many times per run() (read by the
  // threads after the start barrier, which orders this write before).
  void set_passes(std::size_t passes) noexcept { passes_ = passes; }

  // Seconds from the start barrier to the last thread's finish; rethrows the
  // error of the lowest-numbered thread that failed.
  double run() {
    sync_.arrive_and_wait();  // start: every thread is waiting, all go
    const auto start = now_;
    sync_.arrive_and_wait();  // finish: the last thread is done
    const auto finish = now_;
    for (std::exception_ptr& e : errors_) {
      if (e) std::rethrow_exception(std::exchange(e, nullptr));
    }
    return std::chrono::duration<double>(finish - start).count();
  }

 private:
  void work(std::size_t i) {
    live_allocations live;  // this thread's own (see the note at the top)
    try {
      live.reserve(random_max_live);
      // As a CUDA runtime thread does on its first call; the peers need a current context.
      set_current_device(device_);
    } catch (...) {
      errors_[i] = std::current_exception();
    }
    for (;;) {
      sync_.arrive_and_wait();
      if (stop_.load(std::memory_order_relaxed)) return;
      if (!errors_[i]) {
        try {
          for (std::size_t p = 0; p < passes_; ++p) replay_random_ops(mr_, streams_[i], ops_[i], live);
        } catch (...) {
          errors_[i] = std::current_exception();
        }
      }
      sync_.arrive_and_wait();
    }
  }

  void stop_and_join() {
    if (threads_.empty()) return;
    // The barrier orders the store before the threads read it.
    stop_.store(true, std::memory_order_relaxed);
    sync_.arrive_and_wait();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }

  memory_resource& mr_;
  int device_;
  std::vector<stream>& streams_;
  const std::vector<std::vector<random_op>>& ops_;
  std::vector<std::exception_ptr> errors_;  // one per thread, read after the finish barrier
  clock_type::time_point now_{};
  std::atomic<bool> stop_{false};
  std::size_t passes_ = 1;
  std::barrier<stamp> sync_;  // the threads and run()'s caller
  std::vector<std::thread> threads_;
};

// Note [Warming up until the passes settle]
// W3 measures an allocator's steady state under contention, not its growth. A
// pool that takes its memory in a few large chunks is there after one pass; one
// that maps pages where each thread needs them (the default) spends its first
// pass making pages (3,600 of them for 16 threads on a GPU) and its next one or
// two moving a thousand of them to where the threads' frees left them, after
// which it makes and moves none: on an H100 host, 0.7, 53, then 68-74 Mops/s a
// pass. Timing from the second pass timed that settling. So untimed passes go on
// until one is no longer 10% faster than the one before, at most
// max_settling_passes of them and while they fit in a second (or a quarter of
// --cell-budget-s); a row too slow for that (one pass of the RMM arena at 16
// threads takes seconds) is timed after its first pass, as before. Returns the
// last untimed pass's seconds, which size the repetitions.
constexpr int max_settling_passes = 8;

double settle(team& t, const options& opts) {
  double last = t.run();  // first use: growth
  double spent = last;
  const double budget = std::max(10 * opts.rep_seconds, opts.cell_budget_seconds / 4);
  for (int k = 0; k < max_settling_passes && spent < budget; ++k) {
    const double next = t.run();
    spent += next;
    const bool settled = next > 0.9 * last;
    last = next;
    if (settled) break;
  }
  return last;
}

class threads_workload final : public workload {
 public:
  std::string_view id() const override { return "W3"; }
  std::string_view name() const override { return "threads"; }
  std::string_view figure() const override {
    return "millions of ops (allocate or free) per second, all threads together";
  }

  std::vector<column> columns(const options&) const override {
    std::vector<column> out;
    for (std::size_t n : thread_counts) {
      out.push_back({std::to_string(n) + (n == 1 ? " thread" : " threads"), "Mops/s", false});
    }
    out.push_back({"scaling 16/1", "x", false, true});
    return out;
  }

  std::string method(const options& opts) const override {
    return workload::method(opts) +
           ", from the start barrier to the last thread's finish; each thread replays its op sequence as "
           "often as make a repetition last about --rep-ms";
  }

  std::vector<cell> measure(const subject& s, const context& ctx) const override {
    std::vector<cell> out;
    for (std::size_t threads : thread_counts) {
      // With a cell budget, a thread count whose warm-up and one repetition would
      // not fit, judged by the last count's throughput, is not run at all.
      // The last count measured judges (a skipped one says nothing).
      const auto measured = std::find_if(out.rbegin(), out.rend(), [](const cell& c) {
        return c.status == cell_status::ok && c.median() > 0;
      });
      if (ctx.opts.cell_budget_seconds > 0 && measured != out.rend()) {
        const double ops = static_cast<double>(threads * ops_per_thread(ctx.opts));
        const double estimate = ops / (measured->median() * 1e6);
        if (2 * estimate > ctx.opts.cell_budget_seconds) {
          out.push_back(skipped_cell("about " + format_figure(estimate) +
                                     " s a repetition, judged by the fewer threads' figure: over "
                                     "--cell-budget-s with its warm-up"));
          continue;
        }
      }
      std::vector<std::vector<random_op>> ops;
      for (std::size_t i = 0; i < threads; ++i) {
        ops.push_back(make_random_ops(ops_per_thread(ctx.opts), max_bytes, first_seed + i));
      }
      // The cell's own stream goes unused: every thread brings its own, made
      // before the resource and destroyed after it, as run_cell's stream is (a
      // resource may keep what it knows of a stream until it goes; a row that
      // takes the device's free memory leaves none for streams made after it).
      std::vector<stream> streams;
      try {
        for (std::size_t i = 0; i < threads; ++i) streams.emplace_back(ctx.device, stream::flags::non_blocking);
      } catch (const cuda_error& e) {
        out.push_back(failed_cell(cell_status::failed, e.what()));
        continue;
      }
      out.push_back(run_cell(s, ctx, [&](memory_resource& mr, stream&) {
        if (!mr.properties().thread_safe) {
          return skipped_cell("not thread-safe (properties().thread_safe is false)");
        }
        // Drained (also on error) before the resource goes.
        struct drain_on_exit {
          std::vector<stream>& streams;
          ~drain_on_exit() {
            for (stream& st : streams) {
              try {
                st.synchronize();
              } catch (...) {  // already failing; the cell says why
              }
            }
          }
        } drain{streams};
        team t(mr, ctx.device, streams, ops);
        cell c;
        const double one_pass = settle(t, ctx.opts);
        const std::size_t passes =
            one_pass > 0 ? std::clamp<std::size_t>(
                               static_cast<std::size_t>(std::ceil(ctx.opts.rep_seconds / one_pass)), 1, 1000)
                         : 1;
        t.set_passes(passes);
        c.iterations = passes * threads * ops_per_thread(ctx.opts);
        const double mops = static_cast<double>(c.iterations) / 1e6;
        const int reps = reps_within_budget(ctx.opts, one_pass * static_cast<double>(passes), c);
        for (int r = 0; r < reps; ++r) c.reps.push_back(mops / t.run());
        return c;
      }));
    }
    out.push_back(scaling(out.front(), out.back()));
    return out;
  }

  // Throughput against threads, one line per row.
  std::vector<chart> charts(const workload_result& result, const std::string& where) const override {
    chart c;
    c.file = "W3-threads.svg";
    c.title = "W3 threads: allocation throughput against threads";
    c.subtitle = where + "; W2 max 4 MiB on each thread, own stream each; median of the repetitions";
    c.x_label = "threads (one non-blocking stream each)";
    c.y_label = "millions of ops per second, all threads together (higher is better)";
    c.x_scale = axis_scale::log2;
    c.y_scale = axis_scale::log10;  // peers span three decades on a GPU
    std::vector<std::size_t> cols;
    std::vector<double> xs;
    for (std::size_t i = 0; i < std::size(thread_counts); ++i) {
      cols.push_back(i);
      xs.push_back(static_cast<double>(thread_counts[i]));
      c.x_ticks.emplace_back(xs.back(), std::to_string(thread_counts[i]));
    }
    c.lines = lines_over_columns(result, cols, xs);
    c.notes = notes(result);
    return {c};
  }

  std::vector<std::string> notes(const workload_result&) const override {
    std::vector<std::string> lines = {
        "scaling 16/1: the 16-thread median / the 1-thread median; above 1: more ops/s with 16 "
        "threads"};
    const unsigned host = std::thread::hardware_concurrency();
    if (host < thread_counts[std::size(thread_counts) - 1]) {
      lines.push_back("this host has " + std::to_string(host) +
                      " hardware threads: the threads beyond that take turns on them");
    }
    return lines;
  }

 private:
  static cell scaling(const cell& one, const cell& many) {
    // A row skipped as a whole keeps one reason in every column.
    if (one.status == cell_status::skipped) return one;
    if (one.status != cell_status::ok || many.status != cell_status::ok || one.median() <= 0) {
      return skipped_cell("no scaling without both the 1- and the 16-thread figure");
    }
    cell c;
    c.reps = {many.median() / one.median()};
    return c;
  }
};

}  // namespace

const workload& w3_threads() {
  static const threads_workload w;
  return w;
}

}  // namespace gpumem::bench
