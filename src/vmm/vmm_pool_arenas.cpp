// vmm_pool_resource's arenas: small requests served by a pool_resource whose
// upstream is the pool itself, lending whole address ranges.
//
// Note [Arenas over lent ranges]
// The address-wide allocator (vmm_pool_resource.cpp) needs a view of the whole
// pool, hence one lock and ordered maps: fine for large blocks, slow for a
// churn of small random sizes (W2 max 4 MiB) and a wall for many threads (W3).
// pool_resource solves exactly that: per-stream arenas, an O(1) best fit, a
// quick cache, stream ordering by fences on demand. So requests of at most
// arena_max_bytes go to a pool_resource whose upstream (`lender`) borrows
// ranges from the pool: mapped blocks of the reservation, sized by
// pool_resource's growth (one granule, doubling with the arenas' size up to
// arena_chunk_bytes), each under handles of its own size.
//  - To the pool a lent range is one allocated block (blk::lent): never moved,
//    never given back while lent. Its handles stay the unit of physical memory.
//  - The arenas give a range back when it is wholly free: on trim() and
//    release(), and when a request fails. A large request that fails first asks
//    the arenas to release (one device synchronisation, as the pool's own last
//    resort) and tries again, so "fails only if the device and the pool together
//    lack the memory" holds at the granularity of lent ranges.
//  - pool_resource gives a range back either on its maintenance stream after a
//    wait on the arena's fence (take_back fences that stream at once, so the
//    pool settles it by an event query), or with deallocate_sync once every free
//    is complete: the legacy default stream then means "complete".
//  - The cost: free space inside a partly used range serves only small requests,
//    so a checkerboard of small blocks pins up to arena_chunk_bytes per range
//    where the address-wide allocator would pin one handle per growth.
#include <algorithm>
#include <string>

#include "vmm/vmm_pool_impl.hpp"

namespace gpumem {
namespace vm = detail::vmm;

struct vmm_pool_resource::impl::lender final : memory_resource {
  explicit lender(impl& p) : pool(p) {}
  impl& pool;

  resource_properties properties() const noexcept override {
    return resource_properties{.device = pool.device, .device_accessible = true, .host_accessible = false,
                               .thread_safe = true};
  }

 private:
  void* do_allocate(std::size_t bytes, stream_view stream, std::size_t /*alignment*/) override {
    return pool.lend(bytes, stream);
  }
  void do_deallocate(void* ptr, std::size_t bytes, stream_view stream, std::size_t /*alignment*/) override {
    pool.take_back(ptr, bytes, stream, stream.handle() == CU_STREAM_LEGACY);
  }
};

void vmm_pool_resource::impl::make_arenas() {
  // A release threshold is checked on every free by the pool's lock; arenas
  // would keep their free ranges out of its sight.
  if (opt.arena_max_bytes == 0 || !fast_free) return;
  opt.arena_chunk_bytes = vm::round_up(std::max(opt.arena_chunk_bytes, opt.arena_max_bytes), gran);
  pool_options po;
  po.min_chunk_bytes = gran;
  po.max_chunk_bytes = opt.arena_chunk_bytes;
  po.refuse_capture = opt.refuse_capture;
  po.watch_captures = opt.watch_captures;
  arena_upstream = std::make_unique<lender>(*this);
  arenas = std::make_unique<pool_resource>(*arena_upstream, po);
  arena_max = opt.arena_max_bytes;
}

void* vmm_pool_resource::impl::lend(std::size_t bytes, stream_view stream) {
  return allocate_core(bytes, stream, gran, true);
}

void vmm_pool_resource::impl::take_back(void* ptr, std::size_t bytes, stream_view stream, bool complete) {
  const auto at = reinterpret_cast<std::uintptr_t>(ptr);
  front& f = front_for(stream);
  std::lock_guard lock(mutex);
  auto it = blocks.find(at);
  if (it == blocks.end() || !it->second.lent || it->second.requested != bytes) {
    throw logic_error("vmm_pool_resource: the arenas gave back a range the pool did not lend them");
  }
  blk& b = it->second;
  b.lent = false;
  lent_bytes -= b.size;
  --lent_count;
  if (complete) {
    free_block(it, nullptr, 0);
    return;
  }
  std::uint64_t epoch = 0;
  {
    std::lock_guard fl(f.lock);
    epoch = f.frees.load(std::memory_order_relaxed) + 1;
    f.frees.store(epoch, std::memory_order_release);
  }
  free_block(it, &f, epoch);
  record_fence(f);  // so that settle() finds it by an event query, however rarely this stream frees
}

bool vmm_pool_resource::impl::holds_unlent(const void* ptr) const {
  std::lock_guard lock(mutex);
  auto it = blocks.find(reinterpret_cast<std::uintptr_t>(ptr));
  return it != blocks.end() && !it->second.free && !it->second.stale && !it->second.lent;
}

void vmm_pool_resource::impl::throw_arena_oom(std::size_t bytes, const out_of_memory& from_arenas) const {
  throw_oom(bytes, "the arenas for requests up to " + std::to_string(arena_max) +
                       " bytes could not get another range (" + from_arenas.info().reason + ")");
}

}  // namespace gpumem
