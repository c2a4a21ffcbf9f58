// W6 grow: grow one buffer from 2 MiB by doubling, and in +64 MiB steps, writing
// the new bytes with device work (cuMemsetD8Async) at each step; the stream is
// synchronized at the end, inside the timed region. Figures: total ms for each
// growth pattern, and peak device memory used / final size.
//
// The gpumem vmm_pool_resource row grows a growable_buffer (maps pages at the
// end, no copy); every other row grows the way a program without virtual memory
// must: allocate the new size from the resource, copy the old bytes
// (cuMemcpyAsync), free the old block. The raw VMM reference (cuMemCreate +
// cuMemMap into one pre-reserved range) is measured once and printed as a note.
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
#include "workloads/registry.hpp"

namespace gpumem::bench {
namespace {

constexpr std::size_t mib = std::size_t{1} << 20;
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
};

growth grow_buffer(int device, stream& st, const std::vector<std::size_t>& sizes) {
  const std::size_t base = device_used(device);
  growth g;
  const auto t0 = clock_type::now();
  {
    growable_buffer b(device, st);
    std::size_t old = 0;
    for (std::size_t n : sizes) {
      b.resize(n);
      fill(static_cast<char*>(b.data()) + old, n - old, st);
      old = n;
      g.peak = std::max(g.peak, device_used(device) - base);
    }
    st.synchronize();
    g.ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
  }
  vmm::reclaim(true);
  return g;
}

growth grow_by_copy(memory_resource& mr, int device, stream& st, const std::vector<std::size_t>& sizes) {
  const std::size_t base = device_used(device);
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
      g.peak = std::max(g.peak, device_used(device) - base);
      if (cur != nullptr) mr.deallocate(cur, old, st);
      cur = next;
      old = n;
    }
    st.synchronize();
    g.ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
  } catch (...) {
    if (cur != nullptr) mr.deallocate(cur, old, st);
    throw;
  }
  mr.deallocate(cur, old, st);
  st.synchronize();
  return g;
}

// The reference: one pre-reserved range, a handle per step mapped at the end.
double raw_vmm_ms(int device, const std::vector<std::size_t>& sizes) {
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

  std::string method(const options&) const override {
    return "one repetition after one warm-up growth (host steady_clock)";
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
      auto run = [&](bool doubling) {
        const auto sizes = steps(final, doubling);
        if (vmm_row) return grow_buffer(ctx.device, st, sizes);
        return grow_by_copy(mr, ctx.device, st, sizes);
      };
      run(true);  // warm-up
      const growth d = run(true);
      const growth a = run(false);
      cell doubling, add, peak;
      doubling.reps = {d.ms};
      doubling.iterations = 1;
      add.reps = {a.ms};
      add.iterations = 1;
      peak.reps = {static_cast<double>(std::max(d.peak, a.peak)) / static_cast<double>(final)};
      peak.iterations = 1;
      return {doubling, add, peak};
    });
  }

  std::vector<std::string> notes(const workload_result& result) const override {
    std::vector<std::string> out;
    int device = 0;
    try {
      const std::size_t final = last_final_ != 0 ? last_final_ : final_bytes(device, false);
      out.push_back("final size " + size_label(final) + "; the " + std::string(vmm_pool_subject_name) +
                    " row grows a growable_buffer (no copy), the others allocate, copy and free");
      if (vmm::supported(device)) {
        out.push_back("raw VMM reference (one reserved range, a handle mapped per step), doubling: " +
                      std::to_string(raw_vmm_ms(device, steps(final, true))) + " ms; +64 MiB steps: " +
                      std::to_string(raw_vmm_ms(device, steps(final, false))) + " ms");
      }
    } catch (const std::exception& e) {
      out.push_back(std::string("raw VMM reference failed: ") + e.what());
    }
    (void)result;
    return out;
  }

 private:
  mutable std::size_t last_final_ = 0;  // what measure() grew to, for the notes
};

}  // namespace

const workload& w6_grow() {
  static const grow_workload w;
  return w;
}

}  // namespace gpumem::bench
