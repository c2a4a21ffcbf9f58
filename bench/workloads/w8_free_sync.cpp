// W8 free-sync: does freeing through a resource stall unrelated work on the GPU?
// cuMemFree (cudaFree) waits for all work in flight on the device; VMM unmap and
// release, and a pool's stream-ordered free, do not (docs/benchmarks-method.md).
//
// Eight launcher threads, each with its own non-blocking stream, launch a short
// spin kernel (one thread spinning a fixed number of device clock cycles, about
// 50 us) in batches of four, waiting for their stream after each batch, for a
// fixed wall time; the figure is the kernels completed per second. Each
// repetition runs that twice: alone (the baseline), and with a ninth thread that
// allocates and frees through the subject on its own non-blocking stream (W2's
// sequence, sizes uniform in [1, 4 MiB], up to 1000 live, replayed from the start
// when it ends). Columns: kernels/s with the allocator / kernels/s alone (1 = no
// interference), the allocator's ops/s, and the baseline's kernels/s.
//
// The kernel is PTX embedded below (kernels.hpp says why).
// The simulator runs no kernels: there every cell is skipped.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "driver/driver.hpp"
#include "gpumem/backend.hpp"
#include "gpumem/device.hpp"
#include "harness.hpp"
#include "kernels.hpp"
#include "plot.hpp"
#include "report.hpp"
#include "workloads/random_ops.hpp"
#include "workloads/registry.hpp"

namespace gpumem::bench {
namespace {

constexpr std::size_t launcher_count = 8;
constexpr int batch = 4;                // kernels a launcher queues before it waits for its stream
constexpr double spin_us = 50;          // what one kernel spins for, at the device's typical clock
constexpr std::size_t max_bytes = std::size_t{4} << 20;
constexpr std::size_t op_count = 20000;  // W2's sequence length; replayed while the window lasts
constexpr std::uint64_t seed = 1;
constexpr const char* kernel_name = "gpumem_bench_spin";

// One thread spins until %clock64 has advanced by the parameter. Written for PTX
// ISA 8.0 and sm_75 (the oldest target CUDA 13 knows); the driver JIT-compiles it
// for the device. ctest gpumem_bench_w8_ptx checks it with ptxas where there is one.
constexpr const char spin_ptx[] = R"ptx(
.version 8.0
.target sm_75
.address_size 64

.visible .entry gpumem_bench_spin(
	.param .u64 gpumem_bench_spin_cycles
)
{
	.reg .pred 	%p<2>;
	.reg .b64 	%rd<5>;

	ld.param.u64 	%rd1, [gpumem_bench_spin_cycles];
	mov.u64 	%rd2, %clock64;
$Lspin:
	mov.u64 	%rd3, %clock64;
	sub.s64 	%rd4, %rd3, %rd2;
	setp.lt.u64 	%p1, %rd4, %rd1;
	@%p1 bra 	$Lspin;
	ret;
}
)ptx";

using clock_type = std::chrono::steady_clock;

// The spin kernel, loaded into the device's primary context.
class spin_kernel {
 public:
  explicit spin_kernel(int device) : module_(device, spin_ptx), function_(module_.function(kernel_name)) {
    int khz = 0;
    GPUMEM_CU(cuDeviceGetAttribute, &khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, device);
    cycles_ = static_cast<std::uint64_t>(std::max(khz, 1)) * static_cast<std::uint64_t>(spin_us) / 1000;
  }

  // The calling thread must have the device's context current.
  void launch(CUstream s) const {
    std::uint64_t cycles = cycles_;
    void* args[] = {&cycles};
    GPUMEM_CU(cuLaunchKernel, function_, 1, 1, 1, 1, 1, 1, 0, s, args, nullptr);
  }
  std::uint64_t cycles() const { return cycles_; }

  // Microseconds one kernel takes on `s` on its own (event time over 16 back to
  // back, after one untimed).
  double measured_us(CUstream s) const {
    detail::device_context_guard guard(module_.device());
    launch(s);
    constexpr int n = 16;
    const double ms = elapsed_ms(module_.device(), s, [&] {
      for (int i = 0; i < n; ++i) launch(s);
    });
    return ms * 1000.0 / n;
  }

 private:
  ptx_module module_;
  CUfunction function_;
  std::uint64_t cycles_ = 0;
};

struct phase_result {
  std::uint64_t kernels = 0;
  double kernel_seconds = 0;  // start to the last launcher's last batch
  std::uint64_t alloc_ops = 0;
  double alloc_seconds = 0;   // start to the allocator's last op before the deadline
};

// The launchers and the allocator, alive for the whole cell (the warm-up pays for
// each thread's first use), started together by one barrier for each phase.
class crew {
 public:
  crew(memory_resource& mr, stream& alloc_stream, std::vector<stream>& streams, int device,
       const spin_kernel& kernel, const std::vector<random_op>& ops)
      : mr_(mr),
        alloc_stream_(alloc_stream),
        streams_(streams),
        device_(device),
        kernel_(kernel),
        ops_(ops),
        errors_(launcher_count + 1),
        kernels_(launcher_count, 0),
        ends_(launcher_count),
        sync_(static_cast<std::ptrdiff_t>(launcher_count + 2)) {
    live_.reserve(random_max_live);
    threads_.reserve(launcher_count + 1);
    try {
      for (std::size_t i = 0; i < launcher_count; ++i) threads_.emplace_back([this, i] { launcher(i); });
      threads_.emplace_back([this] { allocator(); });
    } catch (...) {
      for (std::size_t i = threads_.size(); i < launcher_count + 1; ++i) sync_.arrive_and_drop();
      stop_and_join();
      throw;
    }
  }
  ~crew() { stop_and_join(); }
  crew(const crew&) = delete;
  crew& operator=(const crew&) = delete;

  // One phase of `seconds`, with or without the allocating thread. Rethrows the
  // first thread's error.
  phase_result run(double seconds, bool with_allocator) {
    with_allocator_ = with_allocator;
    start_ = clock_type::now();
    deadline_ = start_ + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(seconds));
    sync_.arrive_and_wait();  // all go
    sync_.arrive_and_wait();  // all done
    for (std::exception_ptr& e : errors_) {
      if (e) std::rethrow_exception(std::exchange(e, nullptr));
    }
    phase_result r;
    clock_type::time_point last = start_;
    for (std::size_t i = 0; i < launcher_count; ++i) {
      r.kernels += kernels_[i];
      last = std::max(last, ends_[i]);
    }
    r.kernel_seconds = std::chrono::duration<double>(last - start_).count();
    r.alloc_ops = alloc_ops_;
    r.alloc_seconds = std::chrono::duration<double>(alloc_end_ - start_).count();
    return r;
  }

 private:
  void launcher(std::size_t i) {
    try {
      set_current_device(device_);
    } catch (...) {
      errors_[i] = std::current_exception();
    }
    const CUstream s = streams_[i].handle();
    for (;;) {
      sync_.arrive_and_wait();
      if (stop_.load(std::memory_order_relaxed)) return;
      kernels_[i] = 0;
      ends_[i] = start_;
      if (!errors_[i]) {
        try {
          while (clock_type::now() < deadline_) {
            for (int k = 0; k < batch; ++k) kernel_.launch(s);
            GPUMEM_CU(cuStreamSynchronize, s);
            kernels_[i] += batch;
            ends_[i] = clock_type::now();
          }
        } catch (...) {
          errors_[i] = std::current_exception();
        }
      }
      sync_.arrive_and_wait();
    }
  }

  void allocator() {
    std::exception_ptr& error = errors_[launcher_count];
    try {
      set_current_device(device_);
    } catch (...) {
      error = std::current_exception();
    }
    for (;;) {
      sync_.arrive_and_wait();
      if (stop_.load(std::memory_order_relaxed)) return;
      alloc_ops_ = 0;
      alloc_end_ = start_;
      if (with_allocator_ && !error) {
        try {
          allocate_and_free();
        } catch (...) {
          error = std::current_exception();
        }
        // What is still live goes back after the window, untimed (also after an error).
        while (!live_.empty()) {
          const auto [p, bytes] = live_.back();
          live_.pop_back();
          try {
            mr_.deallocate(p, bytes, alloc_stream_);
          } catch (...) {
            if (!error) error = std::current_exception();
          }
        }
      }
      sync_.arrive_and_wait();
    }
  }

  // W2's sequence from an empty live set, again and again, until the deadline.
  void allocate_and_free() {
    std::size_t next = 0;
    while (clock_type::now() < deadline_) {
      const random_op& op = ops_[next];
      if (op.bytes > 0) {
        live_.emplace_back(mr_.allocate(op.bytes, alloc_stream_), op.bytes);
      } else {
        const auto [p, bytes] = live_[op.index];
        live_[op.index] = live_.back();
        live_.pop_back();
        mr_.deallocate(p, bytes, alloc_stream_);
      }
      ++alloc_ops_;
      alloc_end_ = clock_type::now();
      if (++next == ops_.size()) {
        // The sequence starts from an empty live set: free the rest (counted as ops) and begin again.
        while (!live_.empty()) {
          const auto [p, bytes] = live_.back();
          live_.pop_back();
          mr_.deallocate(p, bytes, alloc_stream_);
          ++alloc_ops_;
        }
        next = 0;
        alloc_end_ = clock_type::now();
      }
    }
  }

  void stop_and_join() {
    if (threads_.empty()) return;
    stop_.store(true, std::memory_order_relaxed);  // ordered before the reads by the barrier
    sync_.arrive_and_wait();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }

  memory_resource& mr_;
  stream& alloc_stream_;
  std::vector<stream>& streams_;
  int device_;
  const spin_kernel& kernel_;
  const std::vector<random_op>& ops_;
  // Written by run() before the start barrier, read by the threads after it; the
  // threads' results are read by run() after the finish barrier.
  bool with_allocator_ = false;
  clock_type::time_point start_{}, deadline_{};
  std::vector<std::exception_ptr> errors_;  // launchers, then the allocator
  std::vector<std::uint64_t> kernels_;
  std::vector<clock_type::time_point> ends_;
  std::uint64_t alloc_ops_ = 0;
  clock_type::time_point alloc_end_{};
  live_allocations live_;
  std::atomic<bool> stop_{false};
  std::barrier<> sync_;  // the launchers, the allocator and run()'s caller
  std::vector<std::thread> threads_;
};

// How long each phase lasts: 2.5 repetition lengths (250 ms by default, 25 ms with --quick).
double window_seconds(const options& opts) { return std::max(0.005, 2.5 * opts.rep_seconds); }

class free_sync_workload final : public workload {
 public:
  std::string_view id() const override { return "W8"; }
  std::string_view name() const override { return "free-sync"; }
  std::string_view figure() const override {
    return "kernel throughput of 8 streams while a 9th thread allocates and frees through the row / without "
           "that thread (1 = no interference); the allocating thread's ops/s";
  }

  std::vector<column> columns(const options&) const override {
    return {{"kernels/s with / without", "x", false},
            {"allocator ops/s", "kops/s", false},
            // No allocating thread: the same run in every row (its ratio shows the run-to-run spread).
            {"kernels/s without", "k/s", false}};
  }

  std::string method(const options& opts) const override {
    return "median of " + std::to_string(opts.reps) + " repetition" + (opts.reps == 1 ? "" : "s") +
           " after a warm-up; a repetition is " + format_figure(window_seconds(opts) * 1000) +
           " ms without the allocating thread, then " + format_figure(window_seconds(opts) * 1000) +
           " ms with it (host steady_clock)";
  }

  std::vector<cell> measure(const subject& s, const context& ctx) const override {
    if (current_backend() == backend_kind::sim) {
      const cell skip = skipped_cell("needs a GPU (kernels): the simulator runs none");
      return {skip, skip, skip};
    }
    const std::vector<random_op> ops = make_random_ops(op_count, max_bytes, seed);
    const double window = window_seconds(ctx.opts);
    return run_cells(s, ctx, 3, [&](memory_resource& mr, stream& st) -> std::vector<cell> {
      const spin_kernel kernel(ctx.device);
      std::vector<stream> streams;
      for (std::size_t i = 0; i < launcher_count; ++i) streams.emplace_back(ctx.device, stream::flags::non_blocking);
      struct drain_on_exit {
        std::vector<stream>& streams;
        ~drain_on_exit() {
          for (stream& x : streams) {
            try {
              x.synchronize();
            } catch (...) {  // already failing; the cell says why
            }
          }
        }
      } drain{streams};
      kernel_us_ = kernel.measured_us(streams.front().handle());
      kernel_cycles_ = kernel.cycles();
      crew c(mr, st, streams, ctx.device, kernel, ops);
      // Warm-up: each thread's first launch, the allocator's first use of the resource.
      (void)c.run(window / 2, false);
      (void)c.run(window / 2, true);
      cell ratio, alloc, alone;
      const int reps = reps_within_budget(ctx.opts, 2 * window, ratio);
      alloc.cut_by_budget = alone.cut_by_budget = ratio.cut_by_budget;
      for (int r = 0; r < reps; ++r) {
        const phase_result without = c.run(window, false);
        const phase_result with = c.run(window, true);
        const double base = rate(without.kernels, without.kernel_seconds);
        const double loaded = rate(with.kernels, with.kernel_seconds);
        ratio.reps.push_back(base > 0 ? loaded / base : 0);
        alloc.reps.push_back(rate(with.alloc_ops, with.alloc_seconds) / 1e3);
        alone.reps.push_back(base / 1e3);
        ratio.iterations = with.kernels;
        alloc.iterations = with.alloc_ops;
        alone.iterations = without.kernels;
      }
      return {ratio, alloc, alone};
    });
  }

  std::vector<std::string> notes(const workload_result&) const override {
    std::vector<std::string> out = {
        "8 launcher threads, one non-blocking stream each, launch a 1-thread spin kernel in batches of " +
            std::to_string(batch) + " and wait for their stream after each; the allocating thread runs W2's "
            "sequence (max " + size_label(max_bytes) + ", seed 1) on its own non-blocking stream"};
    if (kernel_us_ > 0) {
      out.push_back("spin kernel: " + std::to_string(kernel_cycles_) + " clock cycles, " +
                    format_figure(kernel_us_) + " us each on its own stream (cuEventElapsedTime)");
    }
    return out;
  }

  // The ratio per row, as bars around the 1 = no interference line.
  std::vector<chart> charts(const workload_result& result, const std::string& where) const override {
    chart c;
    c.file = "W8-free-sync.svg";
    c.title = "W8 free-sync: kernel throughput while another thread allocates and frees";
    c.subtitle = where + "; 8 streams of spin kernels; median of the repetitions";
    c.x_label = "kernels/s with the allocating thread / without (1 = no interference)";
    for (const auto& row : result.rows) {
      const cell& x = row.cells[0];
      if (x.status != cell_status::ok || x.reps.empty()) continue;
      c.bars.push_back({std::string(row.s->name), x.median(), row.s->kind == subject_kind::gpumem});
    }
    if (c.bars.empty()) return {};  // nothing measured (the simulator): no chart
    c.bar_reference = 1.0;
    c.notes = notes(result);
    return {c};
  }

 private:
  static double rate(std::uint64_t count, double seconds) {
    return seconds > 0 ? static_cast<double>(count) / seconds : 0;
  }

  // For the notes: the last cell's kernel.
  mutable double kernel_us_ = 0;
  mutable std::uint64_t kernel_cycles_ = 0;
};

}  // namespace

const workload& w8_free_sync() {
  static const free_sync_workload w;
  return w;
}

}  // namespace gpumem::bench
