// W6 grow: grow one buffer from 2 MiB by doubling, and in +64 MiB steps, writing
// the new bytes with device work (cuMemsetD8Async) at each step; the stream is
// synchronized at the end, inside the timed region. Figures: total ms for each
// growth pattern (median of the repetitions), and peak device memory used / final
// size, taken in the warm-up growths (cuMemGetInfo after each step), so that the
// timed growths make no call that the raw reference does not make.
//
// The gpumem vmm_pool_resource row grows a growable_buffer (maps pages at the
// end, no copy; its address range is reserved before the clock starts, as the
// raw reference's is, without knowing the final size); every other row grows the way a program without virtual memory
// must: allocate the new size from the resource, copy the old bytes
// (cuMemcpyAsync), free the old block. The raw VMM reference (cuMemCreate +
// cuMemMap into one pre-reserved range, reserved before the clock starts) is
// measured the same way (a warm-up, then the median of the repetitions) and printed
// as a note, with the growable_buffer row's ratio to it. Its repetitions alternate
// with the growable_buffer's, in the same cell: the driver's VMM calls cost up to
// 5x more for a while after other rows free gigabytes (8.5 against 1.9 ms for the
// reference's doubling, measured after the cuda_resource row on an H200), so a
// reference timed at another moment than the row would compare two device states.
// The final size is 4 GiB, or less where the device is small (the simulator):
// the largest power of two up to a quarter of the device, so the copying rows
// (old + new at once) fit too.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "driver/driver.hpp"
#include "gpumem/device.hpp"
#include "gpumem/vmm/growable_buffer.hpp"
#include "gpumem/vmm/virtual_memory.hpp"
#include "harness.hpp"
#include "plot.hpp"
#include "report.hpp"
#include "workloads/registry.hpp"

namespace gpumem::bench {
namespace {

constexpr std::size_t mib = std::size_t{1} << 20;
// The vmm row's repetitions, as a multiple of --reps (measure()).
constexpr int reference_rep_factor = 3;
using clock_type = std::chrono::steady_clock;

// --quick (the CI smoke run): 256 MiB, so the copying rows stay short.
std::size_t final_bytes(int device, bool quick) {
  const std::size_t total = device_memory_info(device).total_bytes;
  const std::size_t cap = quick ? 256 * mib : std::size_t{4} << 30;
  std::size_t f = 2 * mib;
  while (f * 2 <= std::min(cap, total / 4)) f *= 2;
  return f;
}

std::size_t device_used(int device) {
  const memory_info m = device_memory_info(device);
  return m.total_bytes - m.free_bytes;
}

// How far the device's use rose above `base`: 0 where it fell (a pool that gave
// memory back during the growth), never an unsigned wrap.
std::size_t used_above(int device, std::size_t base) {
  const std::size_t used = device_used(device);
  return used > base ? used - base : 0;
}

std::vector<std::size_t> steps(std::size_t final, bool doubling) {
  std::vector<std::size_t> out;
  if (doubling) {
    for (std::size_t n = 2 * mib; n <= final; n *= 2) out.push_back(n);
  } else {
    for (std::size_t n = 64 * mib; n <= final; n += 64 * mib) out.push_back(n);
  }
  return out;
}

void fill(void* at, std::size_t bytes, stream_view s) {
  GPUMEM_CU(cuMemsetD8Async, reinterpret_cast<CUdeviceptr>(at), 0x5C, bytes, s.handle());
}

struct growth {
  double ms = 0;
  std::size_t peak = 0;  // device memory used above the start
  // Host ms since the clock started, after each step was issued (the last one
  // after the final synchronisation): the chart's curve.
  std::vector<double> at_ms;
};

double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

// With `track_peak`, device memory is asked for after every step (a driver call
// the timed growths leave out).
growth grow_buffer(int device, stream& st, const std::vector<std::size_t>& sizes, bool track_peak) {
  const std::size_t base = track_peak ? device_used(device) : 0;
  growth g;
  {
    // Its address range is taken before the clock starts, as the raw reference's
    // is: reserve() takes addresses only (the default first range covers the
    // device's memory, whatever the final size), no physical memory.
    growable_buffer b(device, st);
    b.reserve(sizes.front());
    const auto t0 = clock_type::now();
    std::size_t old = 0;
    for (std::size_t n : sizes) {
      b.resize(n);
      fill(static_cast<char*>(b.data()) + old, n - old, st);
      old = n;
      if (track_peak) g.peak = std::max(g.peak, used_above(device, base));
      g.at_ms.push_back(ms_since(t0));
    }
    st.synchronize();
    g.ms = ms_since(t0);
    g.at_ms.back() = g.ms;
  }
  vmm::reclaim(true);
  return g;
}

growth grow_by_copy(memory_resource& mr, int device, stream& st, const std::vector<std::size_t>& sizes,
                    bool track_peak) {
  const std::size_t base = track_peak ? device_used(device) : 0;
  growth g;
  void* cur = nullptr;
  std::size_t old = 0;
  const auto t0 = clock_type::now();
  try {
    for (std::size_t n : sizes) {
      void* next = mr.allocate(n, st);
      if (cur != nullptr) {
        GPUMEM_CU(cuMemcpyAsync, reinterpret_cast<CUdeviceptr>(next), reinterpret_cast<CUdeviceptr>(cur), old,
                  st.handle());
      }
      fill(static_cast<char*>(next) + old, n - old, st);
      if (track_peak) g.peak = std::max(g.peak, used_above(device, base));
      if (cur != nullptr) mr.deallocate(cur, old, st);
      cur = next;
      old = n;
      g.at_ms.push_back(ms_since(t0));
    }
    st.synchronize();
    g.ms = ms_since(t0);
    g.at_ms.back() = g.ms;
  } catch (...) {
    if (cur != nullptr) mr.deallocate(cur, old, st);
    throw;
  }
  mr.deallocate(cur, old, st);
  st.synchronize();
  return g;
}

// The reference: one pre-reserved range, a handle per step mapped at the end.
double raw_vmm_once(int device, const std::vector<std::size_t>& sizes) {
  detail::device_context_guard guard(device);
  stream st(device);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  CUdeviceptr base = 0;
  const std::size_t final = sizes.back();
  GPUMEM_CU(cuMemAddressReserve, &base, final, 0, 0, 0);
  std::vector<std::pair<CUmemGenericAllocationHandle, std::size_t>> handles;
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const auto t0 = clock_type::now();
  std::size_t old = 0;
  for (std::size_t n : sizes) {
    CUmemGenericAllocationHandle h = 0;
    GPUMEM_CU(cuMemCreate, &h, n - old, &prop, 0);
    GPUMEM_CU(cuMemMap, base + old, n - old, 0, h, 0);
    GPUMEM_CU(cuMemSetAccess, base + old, n - old, &access, 1);
    GPUMEM_CU(cuMemsetD8Async, base + old, 0x5C, n - old, st.handle());
    handles.emplace_back(h, n - old);
    old = n;
  }
  st.synchronize();
  const double ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
  std::size_t at = 0;
  for (auto [h, bytes] : handles) {
    GPUMEM_CU(cuMemUnmap, base + at, bytes);
    GPUMEM_CU(cuMemRelease, h);
    at += bytes;
  }
  GPUMEM_CU(cuMemAddressFree, base, final);
  return ms;
}

// The reference's median over `reps` growths after one warm-up.
double raw_vmm_ms(int device, const std::vector<std::size_t>& sizes, int reps) {
  (void)raw_vmm_once(device, sizes);
  cell c;
  for (int r = 0; r < reps; ++r) c.reps.push_back(raw_vmm_once(device, sizes));
  return c.median();
}

class grow_workload final : public workload {
 public:
  std::string_view id() const override { return "W6"; }
  std::string_view name() const override { return "grow"; }
  std::string_view figure() const override {
    return "total ms to grow one buffer (new bytes written each step); peak device memory / final size";
  }

  std::vector<column> columns(const options&) const override {
    return {{"doubling (ms)", "ms", true}, {"+64 MiB steps (ms)", "ms", true}, {"peak/final", "", true}};
  }

  std::string method(const options& opts) const override {
    return "median of " + std::to_string(opts.reps) + " growth" + (opts.reps == 1 ? "" : "s") + " (" +
           std::string(vmm_pool_subject_name) + ": up to " + std::to_string(opts.reps * reference_rep_factor) +
           ", alternating with the raw reference's) after a warm-up growth of each pattern, which also "
           "measures the peak (host steady_clock)";
  }

  std::vector<cell> measure(const subject& s, const context& ctx) const override {
    return run_cells(s, ctx, 3, [&](memory_resource& mr, stream& st) -> std::vector<cell> {
      if (mr.properties().device != ctx.device) {
        const cell skip = skipped_cell("does not hand out device memory");
        return {skip, skip, skip};
      }
      const std::size_t final = final_bytes(ctx.device, ctx.opts.quick);
      last_final_ = final;
      const bool vmm_row = s.name == vmm_pool_subject_name;
      auto run = [&](bool doubling, bool track_peak) {
        const auto sizes = steps(final, doubling);
        if (vmm_row) return grow_buffer(ctx.device, st, sizes, track_peak);
        return grow_by_copy(mr, ctx.device, st, sizes, track_peak);
      };
      // Warm-ups, one per pattern: they take the peaks.
      const growth warm_d = run(true, true);
      const growth warm_a = run(false, true);
      cell doubling, add, peak;
      // The vmm row also times the raw reference in each repetition. Its figure
      // is read against that reference (the W6 target), and single growths of
      // either vary severalfold with the driver's state (docs/benchmarks.md,
      // W6), so it takes up to reference_rep_factor times the repetitions, as
      // many as fit in a second: all of them on a GPU, where a growth takes
      // milliseconds; none more on the simulator, where it takes seconds.
      const double rep_s = (warm_d.ms + warm_a.ms) / 1000 * (vmm_row ? 2 : 1);
      options rep_opts = ctx.opts;
      if (vmm_row && rep_s > 0) {
        const double fit = std::min(1.0 / rep_s, double(ctx.opts.reps * reference_rep_factor));
        rep_opts.reps = std::max(ctx.opts.reps, static_cast<int>(fit));
      }
      const int reps = reps_within_budget(rep_opts, rep_s, doubling);
      add.cut_by_budget = doubling.cut_by_budget;
      growth last_doubling;
      cell raw_d, raw_a;  // the vmm row's reference, interleaved with its growths
      if (vmm_row && vmm::supported(ctx.device)) {
        (void)raw_vmm_once(ctx.device, steps(final, true));
        (void)raw_vmm_once(ctx.device, steps(final, false));
      }
      for (int r = 0; r < reps; ++r) {
        last_doubling = run(true, false);
        doubling.reps.push_back(last_doubling.ms);
        add.reps.push_back(run(false, false).ms);
        if (vmm_row && vmm::supported(ctx.device)) {
          raw_d.reps.push_back(raw_vmm_once(ctx.device, steps(final, true)));
          raw_a.reps.push_back(raw_vmm_once(ctx.device, steps(final, false)));
        }
      }
      if (!last_doubling.at_ms.empty()) {
        series curve;
        curve.name = std::string(s.name);
        for (std::size_t n : steps(final, true)) curve.x.push_back(static_cast<double>(n) / double(mib));
        curve.y = last_doubling.at_ms;
        curve.look = s.kind == subject_kind::gpumem ? series::style::emphasis : series::style::plain;
        doubling.curves.push_back(std::move(curve));
      }
      doubling.iterations = 1;
      add.iterations = 1;
      const std::size_t seen = std::max(warm_d.peak, warm_a.peak);
      if (seen < final / 2) {
        // The buffer itself is `final` bytes at the end: a peak below half of it
        // means the device's free memory did not show the growth (memory reserved
        // before it, as RMM's pools take theirs up front), not a frugal row.
        peak = skipped_cell("the device's free memory did not fall with the growth (memory the row had "
                            "reserved before): not measurable here");
      } else {
        peak.reps = {static_cast<double>(seen) / static_cast<double>(final)};
        peak.iterations = 1;
      }
      if (vmm_row) {
        growable_doubling_ms_ = doubling.median();
        growable_add_ms_ = add.median();
        raw_doubling_ms_ = raw_d.median();
        raw_add_ms_ = raw_a.median();
        raw_reps_ = static_cast<int>(raw_d.reps.size());
      }
      last_reps_ = reps;
      return {doubling, add, peak};
    });
  }

  // Grow time against size: each row's last timed doubling growth, step by step.
  std::vector<chart> charts(const workload_result& result, const std::string& where) const override {
    chart c;
    c.file = "W6-grow.svg";
    c.title = "W6 grow: time to grow one buffer by doubling, against its size";
    c.subtitle = where + "; host ms since the start after each step is issued, the last point after the final "
                         "synchronisation";
    c.x_label = "buffer size (MiB)";
    c.y_label = "ms since the start (lower is better)";
    c.x_scale = axis_scale::log2;
    c.y_scale = axis_scale::log10;
    for (const auto& row : result.rows) {
      if (row.cells.empty() || row.cells[0].status != cell_status::ok) continue;
      for (const series& sr : row.cells[0].curves) c.lines.push_back(sr);
    }
    if (c.lines.empty()) return {};
    c.notes = {std::string("the ") + std::string(vmm_pool_subject_name) +
               " row grows a growable_buffer (maps pages at the end); the others allocate, copy and free"};
    return {c};
  }

  std::vector<std::string> notes(const workload_result& result) const override {
    std::vector<std::string> out;
    int device = 0;
    try {
      const std::size_t final = last_final_ != 0 ? last_final_ : final_bytes(device, false);
      out.push_back("final size " + size_label(final) + "; the " + std::string(vmm_pool_subject_name) +
                    " row grows a growable_buffer (no copy), the others allocate, copy and free");
      if (vmm::supported(device)) {
        // Taken beside the growable_buffer's growths when that row ran, else now.
        const bool beside = raw_doubling_ms_ > 0 && raw_add_ms_ > 0;
        const int reps = std::max(1, beside ? raw_reps_ : last_reps_);
        const double d = beside ? raw_doubling_ms_ : raw_vmm_ms(device, steps(final, true), reps);
        const double a = beside ? raw_add_ms_ : raw_vmm_ms(device, steps(final, false), reps);
        out.push_back("raw VMM reference (one range reserved before the clock starts, a handle mapped per "
                      "step; median of " + std::to_string(reps) + " after a warm-up" +
                      (beside ? ", alternating with the growable_buffer's growths" : "") + "), doubling: " +
                      format_figure(d) + " ms; +64 MiB steps: " + format_figure(a) + " ms");
        if (growable_doubling_ms_ > 0 && d > 0 && a > 0) {
          out.push_back("growable_buffer / raw VMM reference: doubling " + format_ratio(growable_doubling_ms_ / d) +
                        ", +64 MiB steps " + format_ratio(growable_add_ms_ / a));
        }
      }
    } catch (const std::exception& e) {
      out.push_back(std::string("raw VMM reference failed: ") + e.what());
    }
    (void)result;
    return out;
  }

 private:
  mutable std::size_t last_final_ = 0;  // what measure() grew to, for the notes
  mutable int last_reps_ = 0;           // the repetitions it ran
  mutable int raw_reps_ = 0;            // the reference's beside the growable_buffer's
  // The growable_buffer row's medians, set when that row ran.
  mutable double growable_doubling_ms_ = 0;
  mutable double growable_add_ms_ = 0;
  mutable double raw_doubling_ms_ = 0;  // the reference beside it (0: not measured)
  mutable double raw_add_ms_ = 0;
};

}  // namespace

const workload& w6_grow() {
  static const grow_workload w;
  return w;
}

}  // namespace gpumem::bench
