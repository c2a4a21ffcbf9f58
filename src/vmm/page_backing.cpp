// vmm_pool_resource's backing (vmm_pool_impl.hpp): new address segments, where a
// page comes from when a block needs one, and giving pages back. Read Note
// [Pages under the blocks] in page_blocks.cpp first.
#include <algorithm>
#include <limits>
#include <string>
#include <string>

#include "driver/driver.hpp"
#include "gpumem/error.hpp"
#include "vmm/virtual_memory.hpp"
#include "vmm/vmm_pool_impl.hpp"

namespace gpumem {
namespace vm = detail::vmm;

// Note [Pages, frugal first]
// A page a block needs (page_blocks.cpp, make_ready step 3) comes from, in order:
//  1. the arena's own free pages (whole pages inside its free blocks that hold
//     their handle): its stream orders their reuse; the smallest free blocks
//     first, so that fragments go before the large ranges;
//  2. other streams' settled free pages: nothing to wait for;
//  3. the device, within maximum_bytes;
//  4. when the device or the budget refuses, other streams' fenced free pages,
//     the arena's stream waiting for their fences on the device; streams whose
//     free memory is not fenced yet are asked to fence at their next free.
// So the pool asks the device for memory only when none of its own can move
// there, and two streams are tied by a device-side wait only when memory is
// short. One exception keeps loops free of driver calls: while the pool holds
// less than the peak of the bytes in use so far plus 1/16 (and two pages), new
// pages come first. A page taken from another free place is one that place may
// want back at the next step (its alias there can take it back only while the
// page is free), so a loop whose blocks compete for the same pages would move
// them at every step; a new page ends the competition for good. The slack is
// spent on exactly those places, and the pool holds at most the peak, plus
// 1/16, plus the partial pages. A page that moves leaves an alias behind (Note [Pages under the
// blocks]). When even step 4 finds too few, the engine synchronises the device
// (every free is then settled) and tries once more before it fails.
//
// Growth, in the engine's sense (no free block fits the request), only reserves
// addresses: a new segment, one free block without memory.

detail::chunk* vmm_pool_resource::impl::new_segment(arena& a, std::size_t need, bool for_slots) {
  const std::size_t bytes = std::max(segment_bytes, vm::round_up(need, page));
  const CUdeviceptr base = vm::reserve(pool.device, bytes, 0, page);
  if (base == 0) {
    vm::throw_out_of_memory("vmm_pool_resource", pool.device, need, pool.reserved_bytes.load(),
                            "no address range of " + std::to_string(bytes) + " bytes could be reserved");
  }
  address_bytes += bytes;
  try {
    return pool.add_chunk(a, base, bytes, 0, page, for_slots);
  } catch (...) {
    vm::free_addresses(pool.device, base, bytes);
    address_bytes -= bytes;
    throw;
  }
}

void vmm_pool_resource::impl::note_moves(std::size_t moved) {
  pages_moved += moved;
  moved_since_peak += moved;
  // A loop that keeps moving pages without needing more at its peak: half the
  // pool moved since the peak last rose. Double the slack (up to 1/4 of the peak).
  const std::size_t held_pages = pool.reserved_bytes.load() / page;
  if (moved_since_peak > held_pages / 2 + 16) {
    slack = std::min(std::max(2 * slack, peak_used / 16), peak_used / 4);
    moved_since_peak = 0;
  }
}

bool vmm_pool_resource::impl::grow(arena& a, std::size_t need, bool /*memory_short*/) {
  {
    // Addresses are what growth adds: when a free block fits, it was memory that
    // fell short (make_ready), and more addresses would not help.
    std::lock_guard lock(a.lock);
    if (a.free.find(need) != nullptr) return false;
  }
  new_segment(a, need);
  return true;
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
                                                                 std::size_t count, bool create_first) {
  std::vector<std::uint64_t> out;
  out.reserve(count);
  std::size_t created = 0;
  // New pages first for small blocks (create_first), and within the slack above
  // the peak of the bytes in use for slots (Note [Pages, frugal first]).
  const std::size_t slack_limit = peak_used + std::max(slack, peak_used / 32);
  const std::size_t held = pool.reserved_bytes.load();
  if (create_first) {
    created = create_pages(count, out);
  } else if (held < slack_limit) {
    created = create_pages(std::min(count, (slack_limit - held) / page), out);
  }
  // 1. The arena's own free pages.
  if (out.size() < count) take_pages(a, count - out.size(), out, [](const block*) { return true; });
  // 2. Other streams' settled free pages; the others are asked to fence their frees.
  if (out.size() < count && pool.settings.reuse_across_streams) {
    for (arena* s : others) {
      std::lock_guard lock(s->lock);
      settle(*s);
      pool.absorb_completed_pending(*s);  // frees other streams made of its blocks, complete now
      auto settled = [&](const block* b) { return is_settled(*s, b->free_epoch); };
      take_pages(*s, count - out.size(), out, settled);
      if (out.size() < count) take_whole_slots(*s, count - out.size(), out, settled);
      if (s->fenced_frees < s->frees) s->fence_requested.store(true, std::memory_order_relaxed);
      if (out.size() == count) break;
    }
  }
  // The arena's free slots' pages, whole slots first.
  if (out.size() < count) take_whole_slots(a, count - out.size(), out, [](const block*) { return true; });
  // 3. The device, within the budget.
  if (out.size() < count) created += create_pages(count - out.size(), out);
  // 4. Other streams' fenced free pages, after a device-side wait on their fences.
  if (out.size() < count && pool.settings.reuse_across_streams) {
    for (arena* s : others) {
      std::lock_guard lock(s->lock);
      const std::size_t before = out.size();
      auto fenced = [&](const block* b) { return s->is_fenced(b); };
      take_pages(*s, count - out.size(), out, fenced);
      if (out.size() < count) take_whole_slots(*s, count - out.size(), out, fenced);
      if (out.size() > before) pool.wait_for(a, s->fence);
      if (out.size() == count) break;
    }
  }
  note_moves(out.size() - created);
  return out;
}

std::size_t vmm_pool_resource::impl::give_back(bool /*device_synchronized*/) {
  std::size_t released = 0;
  std::shared_lock arenas_lock(pool.arenas_mutex);
  // Every settled alias first (a handle mapped anywhere else stays), then the pages.
  for (auto& [key, s] : pool.arenas) {
    std::lock_guard lock(s->lock);
    pool.flush_quick(*s);
    settle(*s);
    reap_aliases(*s);
  }
  for (auto& [key, s] : pool.arenas) {
    std::lock_guard lock(s->lock);
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
      std::lock_guard lock(s->lock);
      pool.flush_quick(*s);
      settle(*s);
      reap_aliases(*s);
    }
    for (auto& [key, s] : pool.arenas) {
      if (excess < page) break;
      std::lock_guard lock(s->lock);
      excess -= std::min(excess, release_free_pages(*s, excess));
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
                    std::to_string(page) + "-byte pages, " + std::to_string(t.used_bytes) +
                    " bytes of it in use; only whole free pages can move (a page shared with a live "
                    "allocation stays)";
  if (opt.maximum_bytes != 0) {
    why += "; maximum_bytes " + std::to_string(opt.maximum_bytes) + " (the budget) ";
    why += pool.reserved_bytes.load() + page > maximum ? "is reached" : "is not reached";
  }
  why += "; the device could not provide more";
  return why;
}

}  // namespace gpumem
