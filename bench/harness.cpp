// Timing, calibration and per-cell error handling for gpumem-bench (harness.hpp).
#include "harness.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <new>
#include <stdexcept>

#include "gpumem/error.hpp"
#include "plot.hpp"

namespace gpumem::bench {
namespace {

using clock_type = std::chrono::steady_clock;

double seconds_of(const std::function<void(std::uint64_t)>& body, std::uint64_t n) {
  const auto t0 = clock_type::now();
  body(n);
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

}  // namespace

double cell::median() const {
  if (reps.empty()) return 0.0;
  std::vector<double> v = reps;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : (v[m - 1] + v[m]) / 2.0;
}

std::string workload::method(const options& opts) const {
  return "median of " + std::to_string(opts.reps) + " repetition" + (opts.reps == 1 ? "" : "s") +
         " after a warm-up (host steady_clock)";
}

bool workload::has_row_for(const subject&) const { return true; }

std::vector<std::string> workload::notes(const workload_result&) const { return {}; }

std::vector<chart> workload::charts(const workload_result&, const std::string&) const { return {}; }

int reps_within_budget(const options& opts, double seconds_per_rep, cell& c) {
  if (opts.cell_budget_seconds <= 0 || seconds_per_rep <= 0) return opts.reps;
  const double fit = std::floor(opts.cell_budget_seconds / seconds_per_rep);
  if (fit >= opts.reps) return opts.reps;
  c.cut_by_budget = true;
  return std::max(1, static_cast<int>(fit));
}

double cell::min() const {
  return reps.empty() ? 0.0 : *std::min_element(reps.begin(), reps.end());
}

double cell::max() const {
  return reps.empty() ? 0.0 : *std::max_element(reps.begin(), reps.end());
}

std::uint64_t calibrate(const std::function<void(std::uint64_t)>& body, double target_seconds,
                        std::uint64_t max_iterations) {
  const double long_enough = target_seconds / 5;
  // The first run pays for first use (a pool's or a stream's set-up, page
  // faults: milliseconds on a GPU) and says nothing about the steady state.
  (void)seconds_of(body, 1);
  std::uint64_t n = 1;
  double t = seconds_of(body, n);
  for (;;) {
    if (t >= long_enough) {
      // One long run could still be a cold one; the count rests on two.
      const double again = seconds_of(body, n);
      if (again >= long_enough) {
        t = std::min(t, again);
        break;
      }
      t = again;
    }
    if (n >= max_iterations) break;
    // Jump while a run is far too short to time well; double near the end.
    n = std::min(max_iterations, t < target_seconds / 100 ? n * 8 : n * 2);
    t = seconds_of(body, n);
  }
  const double per_iteration = t / static_cast<double>(n);
  if (per_iteration <= 0) return max_iterations;
  const double wanted = std::round(target_seconds / per_iteration);
  return static_cast<std::uint64_t>(std::clamp(wanted, 1.0, static_cast<double>(max_iterations)));
}

std::vector<double> repeat_ns_per_iteration(const std::function<void(std::uint64_t)>& body,
                                            std::uint64_t n, int reps) {
  std::vector<double> out;
  out.reserve(static_cast<std::size_t>(reps));
  for (int r = 0; r < reps; ++r) {
    out.push_back(seconds_of(body, n) * 1e9 / static_cast<double>(n));
  }
  return out;
}

void warm_up(const subject& s, const context& ctx, double seconds) {
  try {
    stream st(ctx.device, stream::flags::non_blocking);
    std::shared_ptr<memory_resource> mr = s.make(ctx.device);
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    constexpr std::size_t sizes[] = {256, std::size_t{1} << 20, std::size_t{8} << 20};
    while (std::chrono::steady_clock::now() < until) {
      for (std::size_t bytes : sizes) {
        for (int i = 0; i < 1000; ++i) mr->deallocate(mr->allocate(bytes, st), bytes, st);
      }
    }
    st.synchronize();
  } catch (const std::exception&) {  // the row itself says what fails
  }
}

cell failed_cell(cell_status status, std::string message) {
  cell c;
  c.status = status;
  c.message = std::move(message);
  return c;
}

cell run_cell(const subject& s, const context& ctx,
              const std::function<cell(memory_resource&, stream&)>& fn) {
  return run_cells(s, ctx, 1,
                   [&](memory_resource& mr, stream& st) { return std::vector<cell>{fn(mr, st)}; })
      .front();
}

std::vector<cell> run_cells(const subject& s, const context& ctx, std::size_t columns,
                            const std::function<std::vector<cell>(memory_resource&, stream&)>& fn) {
  const auto failed = [columns](cell_status status, std::string message) {
    return std::vector<cell>(columns, failed_cell(status, std::move(message)));
  };
  if (ctx.out_of_time()) return std::vector<cell>(columns, time_limit_cell(ctx.opts));
  try {
    // Destroyed in reverse order: the stream is drained (even when fn threw)
    // before the resource goes, and outlives it, since a resource may free into it.
    stream st(ctx.device, stream::flags::non_blocking);
    std::shared_ptr<memory_resource> mr = s.make(ctx.device);
    struct drain_on_exit {
      stream& st;
      ~drain_on_exit() {
        try {
          st.synchronize();
        } catch (...) {  // already failing; the cell says why
        }
      }
    } drain{st};
    return fn(*mr, st);
  } catch (const out_of_memory& e) {
    return failed(cell_status::failed, e.what());
  } catch (const cuda_error& e) {
    return failed(cell_status::failed, e.what());
  } catch (const std::bad_alloc& e) {
    // Peers (RMM, later) throw their own bad_alloc-derived out-of-memory.
    return failed(cell_status::failed, std::string("out of memory: ") + e.what());
  } catch (const std::exception& e) {
    return failed(cell_status::error, e.what());
  } catch (...) {
    return failed(cell_status::error, "unknown exception");
  }
}

cell skipped_cell(std::string why) { return failed_cell(cell_status::skipped, std::move(why)); }

cell time_limit_cell(const options& opts) {
  return skipped_cell("not run: the run reached --time-limit-s " +
                      std::to_string(static_cast<long long>(opts.time_limit_seconds)));
}

void add_round(cell& so_far, cell round_cell, int round) {
  if (so_far.status != cell_status::ok) return;  // the first round that went wrong is the one reported
  if (round_cell.status == cell_status::skipped) {
    // Not run this round (a W3 thread count judged not to fit the budget): what the
    // earlier rounds measured stands, with fewer repetitions than asked.
    so_far.cut_by_budget = true;
    return;
  }
  if (round_cell.status != cell_status::ok) {
    round_cell.message = "round " + std::to_string(round) + ": " + round_cell.message;
    // A failure has no figure, unless it is itself the result, timed (W4's "OOM").
    if (round_cell.outcome.empty()) round_cell.reps.clear();
    so_far = std::move(round_cell);
    return;
  }
  so_far.reps.insert(so_far.reps.end(), round_cell.reps.begin(), round_cell.reps.end());
  so_far.cut_by_budget = so_far.cut_by_budget || round_cell.cut_by_budget;
}

std::optional<std::string> out_of_memory_from(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::bad_alloc& e) {
    return std::string(e.what());
  } catch (const cuda_error& e) {
    if (e.result() != CUDA_ERROR_OUT_OF_MEMORY) throw;
    return std::string(e.what());
  }
  return std::nullopt;
}

std::string size_label(std::size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (u < 4 && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++u;
  }
  return std::to_string(bytes) + " " + units[u];
}

}  // namespace gpumem::bench
