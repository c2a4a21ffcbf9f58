// run_vmm_pool_program (vmm_pool_program.hpp).
#include "fuzz/vmm_pool_program.hpp"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "fuzz/program_contents.hpp"
#include "fuzz/program_input.hpp"
#include "fuzz/vmm_program_checks.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/stream.hpp"
#include "gpumem/vmm/virtual_memory.hpp"
#include "gpumem/vmm_pool_resource.hpp"
#include "pool/pool_inspector.hpp"

namespace gpumem::test {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

}  // namespace

std::string run_vmm_pool_program(const std::uint8_t* data, std::size_t size) {
  program_reader in(data, size);
  vmm_pool_options o;
  const std::size_t granule = vmm::granularity(0);
  o.page_bytes = granule << (in.byte() % 3);  // 1, 2 or 4 granules
  if (in.byte() % 2 == 0) o.segment_bytes = (64 * MiB) << (in.byte() % 4);  // several segments per stream
  if (in.byte() % 4 == 0) o.maximum_bytes = (256 * MiB) << (in.byte() % 4);
  if (in.byte() % 2 == 0) o.fence_interval = 1 + in.byte() % 32;
  o.quick_cache = in.byte() % 4 != 0;
  o.reuse_across_streams = in.byte() % 4 != 0;
  if (in.byte() % 4 == 0) o.release_threshold_bytes = static_cast<std::size_t>(in.byte() % 4) * 16 * MiB;
  auto& streams = program_streams();
  program_contents contents(o.page_bytes, {streams[0], streams[1], streams[2]});
  warm_streams(streams);
  const std::size_t device_free_before = device_free_bytes();
  program_model model;
  auto& live = model.live;
  auto& order = model.order;
  {
    vmm_pool_resource pool(0, o);
    auto check_statistics = [&]() -> std::string {
      const vmm_pool_statistics st = pool.statistics();
      // Slots (requests of a page or more, aligned to at most a page) are whole
      // pages; everything else 256-byte granules.
      const std::size_t page = pool.page_bytes();
      std::size_t used = 0;
      for (const auto& [a, al] : live) {
        const bool slot = al.bytes >= page && al.alignment <= page;
        used += slot ? (al.bytes + page - 1) / page * page : (al.bytes + 255) / 256 * 256;
      }
      if (st.allocations != live.size()) return "statistics count the wrong number of allocations";
      if (st.used_bytes != used) return "statistics give the wrong used bytes";
      if (st.used_bytes > st.mapped_bytes) return "more used than mapped";
      if (o.maximum_bytes != 0 && st.mapped_bytes > o.maximum_bytes) return "the pool holds more than maximum_bytes";
      if (std::string v = detail::pool_inspector::violations(pool); !v.empty()) return v;
      return {};
    };
    for (int step = 0; !in.empty() && step < 300; ++step) {
      const std::uint8_t op = in.byte() % 8;
      stream& s = streams[in.byte() % 3];
      if (op <= 3) {  // allocate: from a few bytes to 1 GiB, mostly small
        const std::size_t bytes = 1 + (static_cast<std::size_t>(in.u16()) << (in.byte() % 15));
        // 256 bytes to 8 KiB, now and then a page or two (such a request is a block, not a slot).
        const unsigned shift = in.byte() % 4 == 0 ? in.byte() % 8 : 0;
        const std::size_t alignment = shift < 6 ? std::size_t{256} << shift : pool.page_bytes() << (shift - 6);
        // Half the time without waiting first (Note [Allocating without waiting]).
        void* p = (in.byte() & 1U) ? pool.try_allocate_now(bytes, s, alignment) : nullptr;
        try {
          if (p == nullptr) p = pool.allocate(bytes, s, alignment);
        } catch (const out_of_memory& e) {
          // Frugal by default: a failure is allowed only where the pages the live
          // allocations can pin (each rounded out to whole pages, plus one page it may
          // share) and the request's would not fit what the device had free.
          const std::size_t page = pool.page_bytes();
          std::size_t pinned = pages_pinned(bytes, alignment, page);
          for (const auto& [a, al] : live) pinned += pages_pinned(al.bytes, 0, page);
          const std::size_t capacity = std::min(o.maximum_bytes != 0 ? o.maximum_bytes : device_free_before,
                                                device_free_before) / page;
          if (o.reuse_across_streams && pinned <= capacity) {
            return "an allocation of " + std::to_string(bytes) + " bytes failed with room for it: " + e.what();
          }
          continue;
        }
        if (std::string bad = model.add(p, bytes, alignment); !bad.empty()) return bad;
        contents.stamp(p, bytes, s);
        const auto pieces = pool.physical_pieces(p, bytes);
        if (pieces.empty()) return "a live allocation has no physical pieces";
        if (pieces.front().address > reinterpret_cast<std::uintptr_t>(p) ||
            pieces.back().address + pieces.back().bytes < reinterpret_cast<std::uintptr_t>(p) + bytes) {
          return "the physical pieces do not cover the allocation";
        }
      } else if (op <= 5 && !order.empty()) {  // free, on any stream; sometimes a wrong size first
        const std::size_t k = in.u16() % order.size();
        const program_allocation al = live.at(order[k]);
        if (in.byte() % 8 == 0) {
          const std::size_t wrong = al.bytes > 4 * MiB ? al.bytes / 2 + 1 : al.bytes + 64 * MiB;
          if (pool.try_deallocate_now(al.ptr, wrong, s, al.alignment)) {
            return "a free with the wrong size was taken without waiting";
          }
          try {
            pool.deallocate(al.ptr, wrong, s, al.alignment);
            return "a free with the wrong size was accepted";
          } catch (const logic_error&) {
          }
        }
        contents.read_before_free(al.ptr, s, in.byte() % 4 == 0 ? 2U * in.byte() : 0U);
        if (!(in.byte() & 1U) || !pool.try_deallocate_now(al.ptr, al.bytes, s, al.alignment)) {
          pool.deallocate(al.ptr, al.bytes, s, al.alignment);
        }
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
        if (std::string v = contents.check(); !v.empty()) return v;
        if (in.byte() % 4 == 0) pool.release();
      }
    }
    if (std::string v = check_statistics(); !v.empty()) return v;
    for (auto& [a, al] : live) {
      contents.read_before_free(al.ptr, streams[0], 0);
      pool.deallocate(al.ptr, al.bytes, streams[0], al.alignment);
    }
    live.clear();
    if (std::string v = contents.check(); !v.empty()) return v;
    if (std::string v = released_to_nothing(pool); !v.empty()) return v;
  }
  return device_memory_kept(device_free_before);
}

}  // namespace gpumem::test
