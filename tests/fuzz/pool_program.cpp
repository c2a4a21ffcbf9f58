// run_pool_program (pool_program.hpp).
#include "fuzz/pool_program.hpp"

#include <map>
#include <memory>
#include <sstream>
#include <vector>

#include "fuzz/program_contents.hpp"
#include "fuzz/program_input.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/error.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/stream.hpp"
#include "pool/pool_inspector.hpp"

namespace gpumem::test {

std::string run_pool_program(const std::uint8_t* data, std::size_t size) {
  program_reader in(data, size);
  cuda_resource upstream(0);
  pool_options o;
  o.min_chunk_bytes = std::size_t{1} << (18 + in.byte() % 4);   // 256 KiB .. 2 MiB
  o.max_chunk_bytes = o.min_chunk_bytes << (in.byte() % 4);
  // 0: the default, fences on demand only; else a periodic fence every 1..8 frees.
  if (const unsigned every = in.byte() % 9; every != 0) o.fence_interval = every;
  o.reuse_across_streams = (in.byte() & 1U) != 0;
  if ((in.byte() & 3U) == 0) o.maximum_bytes = o.max_chunk_bytes * (1 + in.byte() % 4);
  auto& streams = program_streams();
  // pool_resource has no pages: stamps every 2 MiB, where its chunks could meet.
  program_contents contents(std::size_t{2} << 20, {streams[0], streams[1], streams[2]});
  program_model model;
  auto& live = model.live;
  auto& order = model.order;
  std::ostringstream why;
  {
    pool_resource pool(upstream, o);
    auto check = [&](const char* after) -> bool {
      const std::string v = detail::pool_inspector::violations(pool);
      if (!v.empty()) {
        why << "after " << after << ": " << v;
        return false;
      }
      return true;
    };
    for (int step = 0; !in.empty() && step < 400; ++step) {
      const std::uint8_t op = in.byte() % 8;
      stream& s = streams[in.byte() % 3];
      if (op <= 3) {  // allocate
        const std::size_t bytes = 1 + (static_cast<std::size_t>(in.u16()) << (in.byte() % 6));
        const std::size_t alignment = std::size_t{256} << (in.byte() % 3 == 0 ? in.byte() % 8 : 0);
        // Half the time without waiting first (Note [Allocating without waiting]).
        void* p = (in.byte() & 1U) ? pool.try_allocate_now(bytes, s, alignment) : nullptr;
        try {
          if (p == nullptr) p = pool.allocate(bytes, s, alignment);
        } catch (const out_of_memory&) {
          if (!check("a failed allocation")) return why.str();
          continue;
        }
        if (std::string bad = model.add(p, bytes, alignment); !bad.empty()) return bad;
        contents.stamp(p, bytes, s);
        if (!check("allocate")) return why.str();
      } else if (op <= 5 && !order.empty()) {  // free, on any stream
        const std::size_t k = in.u16() % order.size();
        const program_allocation al = live.at(order[k]);
        contents.read_before_free(al.ptr, s, in.byte() % 4 == 0 ? 2U * in.byte() : 0U);
        if (!(in.byte() & 1U) || !pool.try_deallocate_now(al.ptr, al.bytes, s, al.alignment)) {
          pool.deallocate(al.ptr, al.bytes, s, al.alignment);
        }
        live.erase(order[k]);
        order[k] = order.back();
        order.pop_back();
        if (!check("deallocate")) return why.str();
      } else if (op == 6) {
        if (in.byte() & 1U) {
          pool.trim(s);
        } else {
          pool.trim();
        }
        if (!check("trim")) return why.str();
      } else {
        const pool_statistics st = pool.statistics();
        if (st.allocations != live.size()) return "statistics count the wrong number of allocations";
        if (st.used_bytes + st.free_bytes != st.reserved_bytes) return "used + free != reserved";
        if (o.maximum_bytes != 0 && st.reserved_bytes > o.maximum_bytes) return "reserved past maximum";
        if (std::string v = contents.check(); !v.empty()) return v;
        if (in.byte() % 4 == 0) {
          pool.release();
          if (!check("release")) return why.str();
        }
      }
    }
    for (auto& [a, al] : live) {
      contents.read_before_free(al.ptr, streams[0], 0);
      pool.deallocate(al.ptr, al.bytes, streams[0], al.alignment);
    }
    if (!check("freeing everything")) return why.str();
    if (std::string v = contents.check(); !v.empty()) return v;
    pool.release();
    const pool_statistics st = pool.statistics();
    if (st.reserved_bytes != 0 || st.chunks != 0) return "release() kept chunks with nothing live";
  }
  if (upstream.allocated_bytes() != 0) return "the pool lost upstream memory";
  return {};
}

}  // namespace gpumem::test
