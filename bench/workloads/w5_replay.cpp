// W5 replay: replays recorded allocation logs (gpumem's CSV event log,
// docs/observability.md) against every row, with gpumem-replay's engine
// (tools/replay). Three figures per log, one table each:
//
//   time          microseconds per replayed call (allocate or free), the streams
//                 synchronized at the end inside the timed region, as in W2;
//   memory        peak reserved / peak live: the most device memory the row took
//                 while replaying, over the most the log had live at once;
//   out of memory the allocations that fail when the device has only 1.10 x the
//                 log's peak live bytes free (a ballast of raw cuMemAlloc memory
//                 holds the rest, on the GPU and on the simulator alike).
//
// Reserved bytes are what the device's free memory fell by (cuMemGetInfo),
// sampled after the replayed calls of a first, untimed pass: the one measure
// that sees every row the same way, peers and their private pools included. That
// pass is also the warm-up; the timed repetitions follow on the same resource,
// as a training loop's later steps run on a warm allocator. Each log's calls are
// replayed in the log's order (seq), one thread per logged thread and one stream
// per logged stream (Note [Replaying in order] in tools/replay/replay.cpp).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/event_log_reader.hpp"
#include "gpumem/device.hpp"
#include "harness.hpp"
#include "peers/peers.hpp"
#include "plot.hpp"
#include "replay/replay.hpp"
#include "report.hpp"
#include "workloads/registry.hpp"

#ifndef GPUMEM_BENCH_TRACE_DIR
#define GPUMEM_BENCH_TRACE_DIR "bench/traces"
#endif

namespace gpumem::bench {
namespace {

constexpr double oom_headroom = 1.10;     // free memory in the out-of-memory run, x peak live
constexpr std::size_t max_curve_points = 800;  // per curve, for the charts and the JSON
constexpr std::size_t ballast_granule = std::size_t{2} << 20;

const std::string time_group = "time (us per call)";
const std::string memory_group = "peak reserved / peak live";
const std::string oom_group = "failed allocations with 1.10 x peak live free";

struct trace {
  std::string name;  // the file's stem: the column label
  std::string path;
  std::vector<tools::logged_event> events;
  std::uint64_t peak_live_bytes = 0;  // of the rows replayed
  std::size_t calls = 0;              // rows replayed
  std::string error;                  // the log could not be read
};

// The log's own peak of live bytes over the rows W5 replays (source app, ok).
void summarize(trace& t) {
  std::uint64_t live = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> open;  // ptr, bytes
  for (const tools::logged_event& e : t.events) {
    if (e.source != "app" || !e.ok()) continue;
    if (e.allocate) {
      open.emplace_back(e.ptr, e.bytes);
      live += e.bytes;
      t.peak_live_bytes = std::max(t.peak_live_bytes, live);
      ++t.calls;
    } else {
      auto it = std::find_if(open.rbegin(), open.rend(), [&](const auto& o) { return o.first == e.ptr; });
      if (it == open.rend()) continue;
      live -= it->second;
      open.erase(std::next(it).base());
      ++t.calls;
    }
  }
}

std::vector<std::filesystem::path> trace_files(const options& opts) {
  std::vector<std::string> wanted = opts.traces;
  if (wanted.empty()) wanted.push_back(GPUMEM_BENCH_TRACE_DIR);
  std::vector<std::filesystem::path> out;
  for (const std::string& w : wanted) {
    std::error_code ec;
    if (std::filesystem::is_directory(w, ec)) {
      std::vector<std::filesystem::path> in_dir;
      for (const auto& entry : std::filesystem::directory_iterator(w, ec)) {
        if (entry.is_regular_file() && entry.path().extension() == ".csv") in_dir.push_back(entry.path());
      }
      std::sort(in_dir.begin(), in_dir.end());
      out.insert(out.end(), in_dir.begin(), in_dir.end());
    } else {
      out.emplace_back(w);  // a file; a missing one becomes a column saying so
    }
  }
  return out;
}

// The logs, read once per run (columns() and every measure() ask).
const std::vector<trace>& traces(const options& opts) {
  static std::mutex mutex;
  static std::vector<trace> cache;
  static bool loaded = false;
  std::lock_guard lock(mutex);
  if (loaded) return cache;
  loaded = true;
  for (const auto& path : trace_files(opts)) {
    trace t;
    t.name = path.stem().string();
    t.path = path.string();
    try {
      t.events = tools::read_event_log(t.path);
      summarize(t);
      if (t.calls == 0) t.error = t.path + ": no successful app allocations to replay";
    } catch (const std::exception& e) {
      t.error = e.what();
    }
    // Two logs with one name (bench/traces/x.csv and a GPU run's x.csv): keep both apart.
    for (const trace& other : cache) {
      if (other.name == t.name) t.name += " (" + path.parent_path().filename().string() + ")";
    }
    cache.push_back(std::move(t));
  }
  return cache;
}

// Keeps at most max_curve_points of a curve sampled at every call, taking each
// bucket's largest value so that no peak is lost.
std::vector<double> bucket_max(const std::vector<double>& v, std::size_t buckets) {
  if (v.size() <= buckets) return v;
  std::vector<double> out(buckets, 0);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::size_t b = i * buckets / v.size();
    out[b] = std::max(out[b], v[i]);
  }
  return out;
}

std::vector<double> bucket_x(std::size_t n, std::size_t buckets) {
  std::vector<double> out;
  const std::size_t k = std::min(n, buckets);
  for (std::size_t b = 0; b < k; ++b) {
    out.push_back(static_cast<double>(n <= buckets ? b : b * n / buckets));  // first call of the bucket
  }
  return out;
}

std::string first_failure(const tools::replay_result& r) {
  return std::to_string(r.failures) + " of " + std::to_string(r.allocations + r.failures) +
         " allocations failed" + (r.failure_messages.empty() ? "" : ": " + r.failure_messages.front());
}

// Raw cuMemAlloc memory that leaves about `keep_free` bytes of the device free,
// held for the object's life: what the out-of-memory column replays beside.
class ballast {
 public:
  ballast(int device, std::size_t keep_free) {
    const std::size_t free_now = device_memory_info(device).free_bytes;
    if (free_now <= keep_free + ballast_granule) return;
    bytes_ = (free_now - keep_free) / ballast_granule * ballast_granule;
    raw_ = peers::make_raw_cumemalloc(device);
    ptr_ = raw_->allocate(bytes_, stream_view{});
  }
  ~ballast() {
    if (ptr_ != nullptr) {
      try {
        raw_->deallocate(ptr_, bytes_, stream_view{});
      } catch (...) {
      }
    }
  }
  ballast(const ballast&) = delete;
  ballast& operator=(const ballast&) = delete;

 private:
  std::size_t bytes_ = 0;
  std::shared_ptr<memory_resource> raw_;
  void* ptr_ = nullptr;
};

// What the replay itself costs: a resource that hands out addresses from a counter
// and keeps nothing, replayed as the rows are. Every row's time includes it.
class no_op_resource final : public memory_resource {
 public:
  explicit no_op_resource(int device) : device_(device) {}
  resource_properties properties() const noexcept override {
    return {.device = device_, .device_accessible = true, .host_accessible = false, .thread_safe = true};
  }

 private:
  void* do_allocate(std::size_t bytes, stream_view, std::size_t) override {
    return reinterpret_cast<void*>(next_.fetch_add(bytes / 256 * 256 + 256, std::memory_order_relaxed));
  }
  void do_deallocate(void*, std::size_t, stream_view, std::size_t) override {}
  int device_;
  std::atomic<std::uintptr_t> next_{std::uintptr_t{1} << 40};
};

// The replay's own time per call for each log (median of five replays after one),
// measured once per run beside the first row; read by the notes.
struct replay_floor {
  std::mutex mutex;
  std::vector<std::pair<std::string, double>> us_per_call;  // by log
  bool measured = false;
};
replay_floor& floor_of_run() {
  static replay_floor f;
  return f;
}

void measure_replay_floor(const std::vector<trace>& ts, int device) {
  replay_floor& f = floor_of_run();
  std::lock_guard lock(f.mutex);
  if (f.measured) return;
  f.measured = true;
  for (const trace& t : ts) {
    if (!t.error.empty()) continue;
    no_op_resource none(device);
    tools::replay_stream_set streams;
    tools::replay_threads threads;
    tools::replay_options o;
    o.device = device;
    o.order = tools::replay_order::seq;
    o.streams = &streams;
    o.threads = &threads;
    tools::replay_events_on(t.events, none, o);
    std::vector<double> us;
    for (int r = 0; r < 5; ++r) {
      const tools::replay_result again = tools::replay_events_on(t.events, none, o);
      us.push_back(again.seconds * 1e6 / static_cast<double>(std::max<std::size_t>(again.replayed, 1)));
    }
    std::sort(us.begin(), us.end());
    f.us_per_call.emplace_back(t.name, us[us.size() / 2]);
  }
}

class replay_workload final : public workload {
 public:
  std::string_view id() const override { return "W5"; }
  std::string_view name() const override { return "replay"; }
  std::string_view figure() const override {
    return "recorded allocation logs replayed: us per call; peak reserved / peak live; allocations "
           "failed with 1.10 x peak live free";
  }

  std::vector<column> columns(const options& opts) const override {
    std::vector<column> out;
    const auto& ts = traces(opts);
    if (ts.empty()) return {{"no logs", "", true, false, time_group}};
    for (const trace& t : ts) out.push_back({t.name, "us", true, false, time_group});
    for (const trace& t : ts) out.push_back({t.name, "", true, false, memory_group});
    for (const trace& t : ts) out.push_back({t.name, "failed", true, false, oom_group});
    return out;
  }

  std::string method(const options& opts) const override {
    return "time: median of " + std::to_string(opts.reps) +
           " replays after a measuring one (host steady_clock); memory: that measuring replay, "
           "the device's free memory after each call that allocated; failures: one replay on a "
           "fresh resource";
  }

  std::vector<cell> measure(const subject& s, const context& ctx) const override {
    const auto& ts = traces(ctx.opts);
    if (ts.empty()) {
      return {skipped_cell("no allocation logs found (--traces, default " +
                           std::string(GPUMEM_BENCH_TRACE_DIR) + ")")};
    }
    measure_replay_floor(ts, ctx.device);
    std::vector<cell> time(ts.size()), memory(ts.size()), oom(ts.size());
    for (std::size_t k = 0; k < ts.size(); ++k) {
      const trace& t = ts[k];
      if (!t.error.empty()) {
        time[k] = memory[k] = oom[k] = skipped_cell("cannot replay: " + t.error);
        continue;
      }
      auto pair = measure_time_and_memory(s, ctx, t);
      time[k] = std::move(pair[0]);
      memory[k] = std::move(pair[1]);
      oom[k] = measure_oom(s, ctx, t);
    }
    std::vector<cell> out;
    for (auto* group : {&time, &memory, &oom}) {
      for (cell& c : *group) out.push_back(std::move(c));
    }
    return out;
  }

  std::vector<std::string> notes(const workload_result&) const override {
    std::string floor = "time: the replay alone (a resource that does no work) takes";
    {
      replay_floor& f = floor_of_run();
      std::lock_guard lock(f.mutex);
      for (std::size_t k = 0; k < f.us_per_call.size(); ++k) {
        floor += (k == 0 ? " " : ", ") + f.us_per_call[k].first + " " + format_figure(f.us_per_call[k].second) + " us";
      }
    }
    floor += " per call; every row's time includes it";
    return {floor,
            "reserved: how far the device's free memory fell below what it was before the row's "
            "resource was made, the most over a replay (peers' own pools included); live: the "
            "log's own bytes",
            "failures: the rest of the device held by a raw cuMemAlloc ballast, the resource made "
            "after it (a pool sized from free memory sees the smaller device)"};
  }

  // One chart per log: its live bytes and every row's reserved bytes over the calls.
  std::vector<chart> charts(const workload_result& result, const std::string& where) const override {
    std::vector<chart> out;
    std::size_t memory_begin = 0;
    while (memory_begin < result.columns.size() && result.columns[memory_begin].group != memory_group) {
      ++memory_begin;
    }
    for (std::size_t col = memory_begin; col < result.columns.size(); ++col) {
      if (result.columns[col].group != memory_group) break;
      chart c;
      const std::string& trace_name = result.columns[col].label;
      c.file = "W5-replay-" + file_safe(trace_name) + ".svg";
      c.title = "W5 replay of " + trace_name + ": reserved and live bytes";
      c.subtitle = where + "; each row replays the log on a fresh resource";
      c.x_label = "call in the log (allocate or free)";
      double peak = 0;
      for (const auto& row : result.rows) {
        const cell& cl = row.cells[col];
        for (const series& sr : cl.curves) {
          for (double y : sr.y) peak = std::max(peak, y);
        }
      }
      const bool gib = peak >= double(1 << 30);
      const double unit = gib ? double(1 << 30) : double(1 << 20);
      c.y_label = std::string("bytes (") + (gib ? "GiB" : "MiB") + ")";
      bool have_live = false;
      for (const auto& row : result.rows) {
        const cell& cl = row.cells[col];
        if (cl.status != cell_status::ok) continue;
        for (const series& sr : cl.curves) {
          const bool live = sr.name == "live";
          if (live && have_live) continue;
          series scaled = sr;
          for (double& y : scaled.y) y /= unit;
          if (live) {
            scaled.name = "live (the log)";
            scaled.look = series::style::reference;
            have_live = true;
          } else {
            scaled.name = std::string(row.s->name) + " reserved";
            if (!cl.reps.empty()) scaled.name += " (" + format_figure(cl.median()) + "x live)";
            scaled.look = row.s->kind == subject_kind::gpumem ? series::style::emphasis
                                                             : series::style::plain;
          }
          c.lines.push_back(std::move(scaled));
        }
      }
      // The reference line last, drawn over the rows that follow it exactly.
      std::stable_partition(c.lines.begin(), c.lines.end(),
                            [](const series& sr) { return sr.look != series::style::reference; });
      c.notes = {"reserved: the device's free memory before the resource was made, less its free "
                 "memory after each call (largest per point)"};
      out.push_back(std::move(c));
    }
    return out;
  }

 private:
  static tools::replay_options replay_options_for(const context& ctx) {
    tools::replay_options o;
    o.device = ctx.device;
    o.order = tools::replay_order::seq;
    o.source = "app";
    return o;
  }

  // Note [The replay's streams outlive the resource]
  // A stream-ordered allocator may keep what it knows of a stream (memory freed
  // on it, a segment of its own, events recorded there) until it is destroyed,
  // as a program's streams usually outlive its allocator. PyTorch's allocator
  // with expandable segments (2.11, one segment per stream) ended gpumem-bench
  // with a segmentation fault on exactly the logs that use streams of their own,
  // when the replay's streams were destroyed before it was. So the set that holds
  // a log's replay streams lives longer than the row's resource: the streams are
  // destroyed after it. They are also made before it (tools::make_replay_streams):
  // RMM's arena sized from the free memory left too little for cuStreamCreate on
  // data-pipeline when the row's first replay made them, and its row failed.

  // Time and memory from one fresh resource: a measuring replay (the warm-up),
  // then the timed ones.
  static std::vector<cell> measure_time_and_memory(const subject& s, const context& ctx, const trace& t) {
    // One set of streams for every replay on this resource, as a program's steps
    // reuse theirs, made before it and destroyed after it (Note [The replay's
    // streams outlive the resource]).
    tools::replay_stream_set streams;
    tools::make_replay_streams(streams, t.events, ctx.device);
    // Before the resource exists: what a pool takes at construction counts as reserved.
    const std::size_t baseline_free = device_memory_info(ctx.device).free_bytes;
    return run_cells(s, ctx, 2, [&](memory_resource& mr, stream&) -> std::vector<cell> {
      if (mr.properties().device != ctx.device) {
        const cell skip = skipped_cell("does not hand out device " + std::to_string(ctx.device) +
                                       "'s memory, which the logs were recorded from");
        return {skip, skip};
      }
      // The threads, too, stay for every replay on this resource.
      tools::replay_threads threads;
      tools::replay_options o = replay_options_for(ctx);
      o.streams = &streams;
      o.threads = &threads;
      std::vector<double> live_curve, reserved_curve;
      live_curve.reserve(t.calls);
      reserved_curve.reserve(t.calls);
      std::uint64_t peak_reserved = 0, reserved = 0, last_live = 0;
      // Reserved memory grows only at an allocation, so sampling after every call
      // that raised the live bytes finds its peak exactly; after frees (which may
      // give memory back) every 16th call suffices for the curve. cuMemGetInfo
      // costs microseconds on a GPU: this pass is not timed.
      const tools::replay_observer observe = [&](std::size_t index, std::uint64_t live_bytes) {
        if (live_bytes > last_live || index % 16 == 0) {
          const std::size_t free_now = device_memory_info(ctx.device).free_bytes;
          reserved = baseline_free > free_now ? baseline_free - free_now : 0;
          peak_reserved = std::max(peak_reserved, reserved);
        }
        last_live = live_bytes;
        live_curve.push_back(static_cast<double>(live_bytes));
        reserved_curve.push_back(static_cast<double>(reserved));
      };
      const tools::replay_result first = tools::replay_events_on(t.events, mr, o, observe);
      if (first.failures > 0) {
        cell failed;
        failed.status = cell_status::failed;
        failed.message = first_failure(first) + " on the whole device";
        return {failed, failed};
      }
      cell time;
      time.iterations = first.replayed;
      const int reps = reps_within_budget(ctx.opts, first.seconds, time);
      for (int r = 0; r < reps; ++r) {
        const tools::replay_result again = tools::replay_events_on(t.events, mr, o);
        if (again.failures > 0) {
          time.status = cell_status::failed;
          time.message = first_failure(again) + " in a later replay";
          time.reps.clear();
          break;
        }
        time.reps.push_back(again.seconds * 1e6 / static_cast<double>(std::max<std::size_t>(again.replayed, 1)));
      }
      cell memory;
      memory.iterations = first.allocations;
      memory.reps = {first.peak_live_bytes > 0
                         ? static_cast<double>(peak_reserved) / static_cast<double>(first.peak_live_bytes)
                         : 0.0};
      // The device's free memory can only show memory that is resident: managed
      // memory untouched by the replay is not, and a ratio far below 1 is then no
      // measure of the row (the floor is 1).
      if (2 * peak_reserved < first.peak_live_bytes) {
        memory = skipped_cell("the device's free memory did not fall with this row's allocations (memory "
                              "not resident until touched, as managed memory): not measurable here");
      }
      const std::vector<double> xs = bucket_x(live_curve.size(), max_curve_points);
      memory.curves.push_back({"reserved", xs, bucket_max(reserved_curve, max_curve_points)});
      memory.curves.push_back({"live", xs, bucket_max(live_curve, max_curve_points)});
      return {time, memory};
    });
  }

  // One replay on a fresh resource made beside a ballast that leaves 1.10 x the
  // log's peak live bytes of the device free.
  static cell measure_oom(const subject& s, const context& ctx, const trace& t) {
    const std::size_t keep_free = static_cast<std::size_t>(static_cast<double>(t.peak_live_bytes) * oom_headroom);
    // Made before the ballast: the headroom left is the resource's alone (Note
    // [The replay's streams outlive the resource]).
    tools::replay_stream_set streams;
    tools::make_replay_streams(streams, t.events, ctx.device);
    std::unique_ptr<ballast> held;
    try {
      held = std::make_unique<ballast>(ctx.device, keep_free);
    } catch (const std::exception& e) {
      return skipped_cell(std::string("could not place the ballast: ") + e.what());
    }
    return run_cell(s, ctx, [&](memory_resource& mr, stream&) -> cell {
      if (mr.properties().device != ctx.device) {
        return skipped_cell("does not hand out device " + std::to_string(ctx.device) + "'s memory");
      }
      tools::replay_options o = replay_options_for(ctx);
      o.streams = &streams;
      const tools::replay_result r = tools::replay_events_on(t.events, mr, o);
      cell c;
      c.iterations = r.allocations + r.failures;
      c.reps = {static_cast<double>(r.failures)};
      return c;
    });
  }
};

}  // namespace

const workload& w5_replay() {
  static const replay_workload w;
  return w;
}

}  // namespace gpumem::bench
