// run_vmm_pool_program (vmm_pool_program.hpp).
#include "fuzz/vmm_pool_program.hpp"

#include <map>
#include <string>
#include <vector>

#include "fuzz/program_input.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/stream.hpp"
#include "gpumem/vmm_pool_resource.hpp"

namespace gpumem::test {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

}  // namespace

std::string run_vmm_pool_program(const std::uint8_t* data, std::size_t size) {
  program_reader in(data, size);
  vmm_pool_options o;
  const std::size_t arena_max[] = {0, 64 << 10, 4 * MiB};
  o.arena_max_bytes = arena_max[in.byte() % 3];
  o.arena_chunk_bytes = (2 * MiB) << (in.byte() % 5);  // 2 .. 32 MiB
  o.max_handle_bytes = (2 * MiB) << (in.byte() % 10);  // 2 MiB .. 1 GiB
  o.fence_interval = 1 + in.byte() % 32;
  if (in.byte() % 4 == 0) o.release_threshold_bytes = static_cast<std::size_t>(in.byte() % 4) * 16 * MiB;
  // The driver keeps some device memory for what a process makes first (its
  // streams, its first events): made once here, before the count starts.
  {
    vmm_pool_resource warm(0);
    for (stream& s : program_streams()) {
      void* p = warm.allocate(1, s);
      warm.deallocate(p, 1, program_streams()[0]);
      warm.trim(s);
    }
  }
  const std::size_t device_free_before = device_memory_info(0).free_bytes;
  program_model model;
  auto& live = model.live;
  auto& order = model.order;
  {
    vmm_pool_resource pool(0, o);
    auto check_statistics = [&]() -> std::string {
      const vmm_pool_statistics st = pool.statistics();
      std::size_t used = 0;
      for (const auto& [a, al] : live) used += (al.bytes + 255) / 256 * 256;
      if (st.allocations != live.size()) return "statistics count the wrong number of allocations";
      if (st.used_bytes != used) return "statistics give the wrong used bytes";
      if (st.used_bytes > st.mapped_bytes) return "more used than mapped";
      return {};
    };
    for (int step = 0; !in.empty() && step < 300; ++step) {
      const std::uint8_t op = in.byte() % 8;
      stream& s = program_streams()[in.byte() % 3];
      if (op <= 3) {  // allocate: from a few bytes to 1 GiB, mostly small
        const std::size_t bytes = 1 + (static_cast<std::size_t>(in.u16()) << (in.byte() % 15));
        const std::size_t alignment = std::size_t{256} << (in.byte() % 4 == 0 ? in.byte() % 6 : 0);
        void* p = nullptr;
        try {
          p = pool.allocate(bytes, s, alignment);
        } catch (const out_of_memory&) {
          continue;
        }
        if (std::string bad = model.add(p, bytes, alignment); !bad.empty()) return bad;
        if (pool.physical_pieces(p, bytes).empty()) return "a live allocation has no physical pieces";
      } else if (op <= 5 && !order.empty()) {  // free, on any stream; sometimes a wrong size first
        const std::size_t k = in.u16() % order.size();
        const program_allocation al = live.at(order[k]);
        if (in.byte() % 8 == 0) {
          const std::size_t wrong = al.bytes > 4 * MiB ? al.bytes / 2 + 1 : al.bytes + 64 * MiB;
          try {
            pool.deallocate(al.ptr, wrong, s, al.alignment);
            return "a free with the wrong size was accepted";
          } catch (const logic_error&) {
          }
        }
        pool.deallocate(al.ptr, al.bytes, s, al.alignment);
        live.erase(order[k]);
        order[k] = order.back();
        order.pop_back();
        if (in.byte() % 8 == 0) {
          try {
            pool.deallocate(al.ptr, al.bytes, s, al.alignment);
            return "a double free was accepted";
          } catch (const logic_error&) {
          }
        }
      } else if (op == 6) {
        if (in.byte() & 1U) {
          pool.trim(s);
        } else {
          pool.trim();
        }
      } else {
        if (std::string v = check_statistics(); !v.empty()) return v;
        if (in.byte() % 4 == 0) pool.release();
      }
    }
    if (std::string v = check_statistics(); !v.empty()) return v;
    for (auto& [a, al] : live) pool.deallocate(al.ptr, al.bytes, program_streams()[0], al.alignment);
    live.clear();
    pool.release();
    const vmm_pool_statistics st = pool.statistics();
    if (st.allocations != 0 || st.used_bytes != 0) return "allocations left after freeing everything";
    if (st.mapped_bytes != 0 || st.handles != 0) return "release() kept physical memory with nothing live";
  }
  const std::size_t device_free_after = device_memory_info(0).free_bytes;
  if (device_free_after != device_free_before) {
    return "the pool lost device memory: " + std::to_string(device_free_before) + " bytes free before, " +
           std::to_string(device_free_after) + " after";
  }
  return {};
}

}  // namespace gpumem::test
