// W4 fragmentation: allocate 64 MiB blocks until 90% of the device's memory is
// held, free every other one, then time one allocation of 25% of total memory
// and find by bisection the largest allocation that still succeeds. Figures:
// milliseconds for the 25% allocation (running out is a result: "OOM" and how
// long failing took), and largest / (total - live). It measures what an
// allocator can make of memory that is free but scattered: a pool that keeps
// its chunks cannot join the holes; one that hands memory back to the driver,
// or remaps it, can. A third figure is the driver's floor for the 25% request
// where its memory is mapped with the virtual memory API: its handles mapped
// again at fresh addresses and made accessible (access_floor below).
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "driver/driver.hpp"
#include "gpumem/device.hpp"
#include "gpumem/vmm/virtual_memory.hpp"
#include "harness.hpp"
#include "workloads/registry.hpp"

namespace gpumem::bench {
namespace {

constexpr std::size_t mib = std::size_t{1} << 20;
constexpr std::size_t block_bytes = 64 * mib;

using clock_type = std::chrono::steady_clock;

// The largest multiple of `grain_mib` MiB, up to `limit_mib`, that `mr` can
// allocate now: bisection, each probe freed at once and the stream synchronized,
// so the state probed stays the same and no probe meets the last one's free in
// flight. `probes` counts the allocations tried. Returns MiB.
std::size_t largest_mib(memory_resource& mr, stream& st, std::size_t limit_mib, std::size_t grain_mib,
                        std::uint64_t& probes) {
  std::size_t fits = 0, fails = limit_mib / grain_mib + 1;  // in grains: fits succeeds (0: trivially), fails does not
  auto probe = [&](std::size_t grains) {
    const std::size_t bytes = grains * grain_mib * mib;
    ++probes;
    return !out_of_memory_from([&] {
      void* p = mr.allocate(bytes, st);
      mr.deallocate(p, bytes, st);
      st.synchronize();
    });
  };
  // The limit first: a row that can use all of what is free (a virtual-memory
  // pool) answers in one probe instead of a bisection's, each of which maps
  // most of the device anew.
  if (fails > 1 && probe(fails - 1)) return (fails - 1) * grain_mib;
  if (fails > 1) --fails;
  while (fails - fits > 1) {
    const std::size_t mid = fits + (fails - fits) / 2;
    (probe(mid) ? fits : fails) = mid;
  }
  return fits * grain_mib;
}

// The quick run bisects over 64 MiB steps (10 probes on an 80 GB device, not 16):
// each probe of a paged pool maps tens of thousands of pages.
std::size_t search_grain_mib(const options& opts) { return opts.quick ? 64 : 1; }

// The driver's floor for the handles under [p, p + bytes): the time to map them
// again at fresh addresses and make that range accessible (one cuMemMap per
// handle, one cuMemSetAccess over the range: what the pool's make_ready does,
// without its bookkeeping). Setting access again where they are mapped already
// is no measure: the driver answers that in ~0.3 us a handle (measured on an
// H100), where a new mapping costs ~25 us. The handles are taken from the range
// (cuMemRetainAllocationHandle), one per granule; a cell that is skipped where
// the range is not mapped through the virtual memory API or its handles are
// larger than a granule.
cell access_floor(void* p, std::size_t bytes, int device) {
  cell floor;
  floor.iterations = 1;
  if (!vmm::supported(device)) return skipped_cell("no virtual memory management on the device");
  const std::size_t g = vmm::granularity(device);
  const auto at = reinterpret_cast<CUdeviceptr>(p);
  if (at % g != 0) return skipped_cell("not mapped through the virtual memory API (unaligned)");
  const std::size_t n = (bytes + g - 1) / g;
  detail::device_context_guard guard(device);
  const auto& d = detail::driver();
  std::vector<CUmemGenericAllocationHandle> handles;
  handles.reserve(n);
  auto release_all = [&] {
    for (CUmemGenericAllocationHandle h : handles) (void)d.cuMemRelease(h);
  };
  for (std::size_t k = 0; k < n; ++k) {
    CUmemGenericAllocationHandle h = 0;
    if (d.cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(at + k * g)) != CUDA_SUCCESS) {
      release_all();
      return skipped_cell("not mapped through the virtual memory API");
    }
    handles.push_back(h);
  }
  CUdeviceptr fresh = 0;
  if (d.cuMemAddressReserve(&fresh, n * g, g, 0, 0) != CUDA_SUCCESS) {
    release_all();
    return skipped_cell("no address range for the floor");
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  std::size_t mapped = 0;
  const auto t0 = clock_type::now();
  for (; mapped < n; ++mapped) {
    if (d.cuMemMap(fresh + mapped * g, g, 0, handles[mapped], 0) != CUDA_SUCCESS) break;
  }
  const bool ok = mapped == n && d.cuMemSetAccess(fresh, n * g, &access, 1) == CUDA_SUCCESS;
  const auto t1 = clock_type::now();
  if (mapped > 0) GPUMEM_CU(cuMemUnmap, fresh, mapped * g);
  GPUMEM_CU(cuMemAddressFree, fresh, n * g);
  release_all();
  if (!ok) return skipped_cell("its handles are larger than a granule");
  floor.reps = {std::chrono::duration<double, std::milli>(t1 - t0).count()};
  return floor;
}

class fragmentation_workload final : public workload {
 public:
  std::string_view id() const override { return "W4"; }
  std::string_view name() const override { return "fragmentation"; }
  std::string_view figure() const override {
    return "ms to allocate 25% of total memory; largest allocation that succeeds / (total - live)";
  }

  std::vector<column> columns(const options&) const override {
    return {{"25% alloc (ms)", "ms", true},
            {"largest/(total-live)", "", false},
            {"access floor (ms)", "ms", true}};
  }

  // No warm-up and no repetitions: a run takes 90% of the device, and what a
  // second one measured would depend on what the first left cached.
  std::string method(const options&) const override {
    return "one repetition, no warm-up (host steady_clock)";
  }

  // Fragmentation does not depend on how the hot path checks for captures, and each
  // row fills the device: the capture-check variants would repeat their base rows.
  bool has_row_for(const subject& s) const override { return !s.capture_check_variant; }

  std::vector<cell> measure(const subject& s, const context& ctx) const override {
    return run_cells(s, ctx, 3, [&](memory_resource& mr, stream& st) -> std::vector<cell> {
      if (mr.properties().device != ctx.device) {
        const cell skip = skipped_cell("does not hand out device " + std::to_string(ctx.device) +
                                       "'s memory, which W4 fills");
        return {skip, skip, skip};
      }
      const std::size_t total = device_memory_info(ctx.device).total_bytes;
      std::vector<void*> blocks;  // held by the workload; freed on every way out
      try {
        // Fill to 90%, or until the resource runs out first (then less is live).
        while (blocks.size() * block_bytes * 10 < total * 9) {
          void* p = nullptr;
          if (out_of_memory_from([&] { p = mr.allocate(block_bytes, st); })) break;
          blocks.push_back(p);
        }
        // Free the second, fourth, ... block: live blocks and 64 MiB holes alternate.
        std::size_t kept = 0;
        for (std::size_t i = 0; i < blocks.size(); ++i) {
          if (i % 2 == 0) {
            blocks[kept++] = std::exchange(blocks[i], nullptr);
          } else {
            void* p = std::exchange(blocks[i], nullptr);
            mr.deallocate(p, block_bytes, st);
          }
        }
        blocks.resize(kept);
        // The frees are complete before the clock starts: the timed allocation
        // meets fragmented memory, not frees still in flight.
        st.synchronize();
        const std::size_t live = blocks.size() * block_bytes;

        cell quarter;
        quarter.iterations = 1;
        const std::size_t quarter_bytes = total / 4;
        void* big = nullptr;
        const auto t0 = clock_type::now();
        const auto oom = out_of_memory_from([&] { big = mr.allocate(quarter_bytes, st); });
        const auto t1 = clock_type::now();
        quarter.reps = {std::chrono::duration<double, std::milli>(t1 - t0).count()};
        cell floor = skipped_cell("the 25% request failed");
        if (oom) {
          quarter.status = cell_status::failed;
          quarter.outcome = "OOM";
          quarter.message = *oom;
        } else {
          floor = access_floor(big, quarter_bytes, ctx.device);
          mr.deallocate(big, quarter_bytes, st);
          st.synchronize();
        }

        cell largest;
        const std::size_t free_bytes = total - live;
        const std::size_t found =
            largest_mib(mr, st, free_bytes / mib, search_grain_mib(ctx.opts), largest.iterations) * mib;
        largest.reps = {static_cast<double>(found) / static_cast<double>(free_bytes)};

        while (!blocks.empty()) {
          mr.deallocate(blocks.back(), block_bytes, st);
          blocks.pop_back();
        }
        st.synchronize();
        return {quarter, largest, floor};
      } catch (...) {
        // Leave the resource empty before it is destroyed; the first error is the one reported.
        for (void* p : blocks) {
          try {
            if (p != nullptr) mr.deallocate(p, block_bytes, st);
          } catch (...) {
          }
        }
        throw;
      }
    });
  }

  std::vector<std::string> notes(const workload_result&) const override {
    return {
        "set-up: 64 MiB blocks until 90% of total memory is held, then every other one "
        "freed (live: those still held) and the stream synchronized",
        "largest: bisection over whole MiB (64 MiB steps with --quick) up to total - live, each probe "
        "freed at once",
        "access floor: the 25% request's own handles mapped again at fresh addresses, one "
        "cuMemMap each and one cuMemSetAccess over the range: the least the driver charges to "
        "map them"};
  }
};

}  // namespace

const workload& w4_fragmentation() {
  static const fragmentation_workload w;
  return w;
}

}  // namespace gpumem::bench
