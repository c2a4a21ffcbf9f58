// vmm_pool_resource's backing (vmm_pool_impl.hpp): growth by mapping physical
// pages under free addresses, the pages coming from the stream's own free
// memory, other streams' settled free memory, the device, and, when the device
// or the budget refuses, other streams' fenced free memory; giving pages back.
// Read Note [Pages under the blocks] in page_blocks.cpp first.
#include <algorithm>
#include <limits>

#include "driver/driver.hpp"
#include "gpumem/error.hpp"
#include "vmm/virtual_memory.hpp"
#include "vmm/vmm_pool_impl.hpp"

namespace gpumem {
namespace vm = detail::vmm;

detail::chunk* vmm_pool_resource::impl::new_segment(arena& a, std::size_t need) {
  const std::size_t bytes = std::max(segment_bytes, vm::round_up(need, page));
  const CUdeviceptr base = vm::reserve(pool.device, bytes, 0, page);
  if (base == 0) {
    vm::throw_out_of_memory("vmm_pool_resource", pool.device, need, pool.reserved_bytes.load(),
                            "no address range of " + std::to_string(bytes) + " bytes could be reserved");
  }
  address_bytes += bytes;
  try {
    return pool.add_chunk(a, base, bytes, 0, page);
  } catch (...) {
    vm::free_addresses(pool.device, base, bytes);
    address_bytes -= bytes;
    throw;
  }
}

std::size_t vmm_pool_resource::impl::create_pages(std::size_t count, std::vector<std::uint64_t>& out) {
  std::size_t made = 0;
  while (made < count) {
    if (pool.reserved_bytes.load() + page > maximum) break;
    const std::optional<CUmemGenericAllocationHandle> h = vm::create(pool.device, page, opt.posix_fd_shareable);
    if (!h) break;
    out.push_back(*h);
    pool.reserved_bytes += page;
    ++pages_created;
    ++made;
  }
  return made;
}

std::vector<std::uint64_t> vmm_pool_resource::impl::supply_pages(arena& a, const std::vector<arena*>& others,
                                                                 std::size_t count) {
  std::vector<std::uint64_t> out;
  out.reserve(count);
  // 1. The arena's own whole free pages: its stream orders their reuse.
  take_pages(a, count, out, [](const block*) { return true; });
  // 2. Other streams' settled whole free pages: nothing to wait for.
  if (out.size() < count && pool.settings.reuse_across_streams) {
    for (arena* s : others) {
      std::lock_guard lock(s->lock);
      pool.flush_quick(*s);
      settle(*s);
      reap_aliases(*s, true);
      take_pages(*s, count - out.size(), out, [&](const block* b) { return is_settled(*s, b); });
      if (out.size() == count) break;
    }
  }
  // 3. The device, within the budget.
  const std::size_t created = out.size() < count ? create_pages(count - out.size(), out) : 0;
  // 4. The device or the budget refused: other streams' fenced pages, after a
  //    device-side wait on their fences; the others are asked to fence.
  if (out.size() < count && pool.settings.reuse_across_streams) {
    for (arena* s : others) {
      std::lock_guard lock(s->lock);
      const std::size_t before = out.size();
      take_pages(*s, count - out.size(), out, [&](const block* b) { return s->is_fenced(b); });
      if (out.size() > before) pool.wait_for(a, s->fence);
      if (out.size() < count) s->fence_requested.store(true, std::memory_order_relaxed);
      if (out.size() == count) break;
    }
  }
  pages_moved += out.size() - created;
  return out;
}

bool vmm_pool_resource::impl::grow(arena& a, std::size_t need, bool /*memory_short*/) {
  const std::vector<arena*> others = pool.arenas_except(&a);
  std::unique_lock lock(a.lock);
  pool.flush_quick(a);
  reap_aliases(a, true);
  window w;
  bool found = find_window(a, need, w);
  if (!found && !a.aliases.empty()) {
    // Addresses are short: the arena's settled aliases go, and their ranges join the runs.
    if (a.fenced_frees < a.frees) pool.record_fence(a);
    reap_aliases(a, false);
    found = find_window(a, need, w);
  }
  if (!found) {
    lock.unlock();
    new_segment(a, need);
    lock.lock();
    if (!find_window(a, need, w)) return false;  // another thread of the stream took it meanwhile
  }
  const bool complete = fill_window(a, others, w, need);
  lock.unlock();
  enforce_threshold();
  return complete;
}

void vmm_pool_resource::impl::before_last_growth() {
  // Nothing to do: the synchronisation settled every free, so the growth that
  // follows can take every whole free page. Giving pages back to the device
  // first (pool_resource gives chunks back, to get them again as one) would
  // only cost a release and a create per page.
}

std::size_t vmm_pool_resource::impl::give_back(bool /*device_synchronized*/) {
  std::size_t released = 0;
  std::shared_lock arenas_lock(pool.arenas_mutex);
  for (auto& [key, s] : pool.arenas) {
    std::lock_guard lock(s->lock);
    pool.flush_quick(*s);
    settle(*s);
    reap_aliases(*s, false);
    released += release_free_pages(*s, std::numeric_limits<std::size_t>::max());
  }
  return released;
}

void vmm_pool_resource::impl::enforce_threshold() {
  if (opt.release_threshold_bytes == std::numeric_limits<std::size_t>::max()) return;
  std::size_t excess = 0;
  {
    std::shared_lock arenas_lock(pool.arenas_mutex);
    std::size_t used = 0;
    for (auto& [key, s] : pool.arenas) {
      std::lock_guard lock(s->lock);
      used += s->used_bytes;
    }
    const std::size_t held = pool.reserved_bytes.load();
    if (held <= used + opt.release_threshold_bytes) return;
    excess = held - used - opt.release_threshold_bytes;
    for (auto& [key, s] : pool.arenas) {
      if (excess < page) break;
      std::lock_guard lock(s->lock);
      pool.flush_quick(*s);
      settle(*s);
      reap_aliases(*s, false);
      const std::size_t released = release_free_pages(*s, excess);
      excess -= std::min(excess, released);
    }
  }
  // What is not settled yet goes at a later check: every stream fences at its next free.
  if (excess >= page) pool.request_fences();
}

std::string vmm_pool_resource::impl::shortage(std::size_t requested) {
  if (requested > maximum) {
    return requested > device_total || maximum == device_total
               ? "the request is larger than the device's memory"
               : "the request is larger than maximum_bytes " + std::to_string(maximum) + " (the budget)";
  }
  const detail::pool_totals t = pool.collect();
  std::string why = "the pool holds " + std::to_string(pool.reserved_bytes.load()) + " bytes of physical memory in " +
                    std::to_string(page) + "-byte pages, " + std::to_string(t.used_bytes) + " of them in use; " +
                    std::to_string(t.free_bytes) + " bytes are free in blocks, of which only whole pages can move " +
                    "(a page shared with a live allocation stays)";
  if (opt.maximum_bytes != 0) {
    why += "; maximum_bytes " + std::to_string(opt.maximum_bytes) + " (the budget) ";
    why += pool.reserved_bytes.load() + page > maximum ? "is reached" : "is not reached";
  }
  why += "; the device could not provide more";
  return why;
}

}  // namespace gpumem
