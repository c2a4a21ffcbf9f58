// vmm_pool_resource's backing (vmm_pool_impl.hpp): new address segments, where a
// page comes from when a block needs one, and giving pages back. Read Note
// [Pages under the blocks] in page_blocks.cpp first.
#include <algorithm>
#include <chrono>
#include <limits>
#include <string>

#include "driver/driver.hpp"
#include "gpumem/error.hpp"
#include "vmm/move_budget.hpp"
#include "vmm/virtual_memory.hpp"
#include "vmm/vmm_pool_impl.hpp"

namespace gpumem {
namespace vm = detail::vmm;

// Note [Pages, frugal first]
// A page a block needs (page_blocks.cpp, make_ready step 3; page_slots.cpp for
// slots) comes from, in order:
//  0. the device, while the pool holds less than the peak of the bytes in use
//     so far plus the slack: 1/16 of it, and two pages (below), and what Note
//     [A time budget for moves] adds. Where streams of different threads work
//     at once, "the peak" is the larger of the peak of their sum and the sum
//     of their own peaks (idle streams count what they use; a stream waiting
//     for the growth mutex is not idle; the streams of one thread count as one,
//     Note [Streams that take turns]): each stream holds its own peak, so one
//     that peaks while another does not is not left to move its own free pages
//     under its blocks at every step (docs/benchmarks-history-2026-11-25.md, W3
//     and the default pool);
//  1. the arena's own free pages (whole pages inside its free blocks that hold
//     their handle; the most recently freed first): its stream orders their reuse;
//  2. idle streams' settled free pages (a stream that has freed nothing for
//     idle_stream_ms, 200 ms by default; settled: nothing to wait for). Every
//     other stream is asked to fence its frees, so that its pages settle for a
//     later look;
//  3. the arena's free slots' pages, whole slots first (a new slot is stitched
//     from whole free slots the same way: page_slots.cpp);
//  4. the fenced free pages of the other streams this thread drives, the
//     arena's stream waiting for their fences on the device (Note [Streams
//     that take turns], swaps_across_streams.cpp);
//  5. the device, within maximum_bytes;
//  6. when the device or the budget refuses: busy streams' settled free pages,
//  7. then other streams' fenced free pages, the arena's stream waiting for
//     their fences on the device (cuStreamWaitEvent; never the host).
// When even step 7 finds too few, the engine synchronises the device (every
// free is then settled) and tries once more before it fails.
//
// The pool asks the device for memory only when none of its own can move
// there, and one stream takes from another that is still working only when
// memory is short. Each move is a map and an access call (tens of microseconds:
// docs/benchmarks.md) and, later, an alias unmap; so is each new page, plus a create. So a step
// of a loop that needs a driver call is slow, whatever the call:
//  - the slack buys new pages for places whose competition for the same pages
//    would otherwise move them at every step: 1/16 of the peak, as the memory
//    target is 1.10 x the peak live bytes and rounding to pages takes some of
//    the rest;
//  - streams of different threads keep what they freed (steps 6 and 7 only
//    under pressure): taking a busy stream's pages makes it take pages back a
//    moment later, a move for each, and ties the streams' speed to the growth
//    mutex. The pool then holds about the sum of the streams' own peaks rather
//    than the peak of their sum, as per-stream pools do, until memory runs
//    short (docs/benchmarks.md has both measured);
//  - a stream is idle only after idle_stream_ms without a free: threads that
//    pause between bursts (a barrier, a host-side step) keep their pages for
//    their next burst rather than losing them to the others and taking them
//    back, two moves a page (docs/benchmarks-history-2026-11-25.md, W3 and the idle time);
//  - loops whose steps vary (other sizes, other orders) still move some pages
//    at every step (docs/vmm.md, "Where the pool is slow").
//
// Growth, in the engine's sense (no free block fits the request), only reserves
// addresses: a new segment, one free block without memory.

// Note [When addresses run short]
// A segment reserves segment_bytes of addresses (the device's memory by
// default) for each arena and kind (blocks, slots), and keeps them for life,
// so that a stream's blocks grow in place and its slots keep their places. A
// process whose pools serve many streams, or that shares the GPU's address
// space with other reservations, can use it up while the device still has
// memory: the driver would then serve a request that the pool could not (on
// the simulator, whose address space is a fixed multiple of its memory, the
// seventeenth stream's first request failed so). So when a reservation fails,
// the pool first gives back every segment that holds nothing (no block in use,
// pending or quick-cached, no page mapped: its settled free pages and aliases
// are unmapped first), then asks for smaller ranges, halving down to the
// request's own pages. Only when even that fails does growth fail; the engine
// then goes on down its slow path (another stream's memory, a device
// synchronisation after which every free is settled, and so every empty
// segment can go) before it reports the shortage, which names the addresses.
// Segments come back only under this shortage, so a program that never meets
// it keeps every segment, as before.
detail::chunk* vmm_pool_resource::impl::new_segment(arena& a, std::size_t need, bool for_slots) {
  const std::size_t least = vm::round_up(need, page);
  std::size_t bytes = std::max(segment_bytes, least);
  CUdeviceptr base = vm::reserve(pool.device, bytes, 0, page);
  if (base == 0) {
    give_back_addresses();
    base = vm::reserve(pool.device, bytes, 0, page);
    while (base == 0 && bytes > least) {
      bytes = std::max(least, vm::round_up(bytes / 2, page));
      base = vm::reserve(pool.device, bytes, 0, page);
    }
    if (base == 0) {
      addresses_short.store(bytes, std::memory_order_relaxed);
      return nullptr;
    }
  }
  addresses_short.store(0, std::memory_order_relaxed);
  address_bytes += bytes;
  try {
    return pool.add_chunk(a, base, bytes, 0, page, for_slots);
  } catch (...) {
    vm::free_addresses(pool.device, base, bytes);
    address_bytes -= bytes;
    throw;
  }
}

// A free slot of `s` that waits on a page of `c` (Note [Slots known to wait])
// holds a pointer to that page's busy mark: before `c` goes, such a slot
// forgets its wait (it is looked at again when next offered).
void vmm_pool_resource::impl::forget_waits_on(arena& s, const chunk& c) {
  if (c.uses.empty()) return;
  const auto lo = reinterpret_cast<std::uintptr_t>(&c.uses.front().busy_mark);
  const auto hi = reinterpret_cast<std::uintptr_t>(&c.uses.back().busy_mark);
  bool forgot = false;
  s.slots.for_each_until([&](block* y) {
    const auto word = reinterpret_cast<std::uintptr_t>(y->wait_seen.word);
    if (word >= lo && word <= hi) {
      y->wait_seen = {};
      forgot = true;
    }
    return false;
  });
  if (forgot) s.slots.wake();
}

std::size_t vmm_pool_resource::impl::give_back_addresses() {
  give_back(false);  // the settled free pages and aliases: a segment holding either is mapped
  std::vector<std::pair<CUdeviceptr, std::size_t>> ranges;
  {
    std::shared_lock arenas_lock(pool.arenas_mutex);
    std::unique_lock dir(pool.chunks_mutex);
    for (auto& [key, s] : pool.arenas) {
      std::lock_guard lock(s->lock);
      for (std::size_t i = 0; i < s->chunks.size();) {
        chunk* c = s->chunks[i];
        block* b = c->first;
        // One block over the whole segment, free (blocks) or vacant (slots):
        // nothing is in use there, pending or cached, and no slot holds it.
        const bool empty = b->next_in_chunk == nullptr && (c->for_slots ? b->vacant : b->free);
        const bool unmapped = std::all_of(c->mapped.begin(), c->mapped.end(), [](std::uint64_t w) { return w == 0; });
        if (!empty || !unmapped) {
          ++i;
          continue;
        }
        if (!c->for_slots) {
          s->free.remove(b);
          forget_waits_on(*s, *c);
        }
        s->slab.recycle(b);
        s->chunks[i] = s->chunks.back();
        s->chunks.pop_back();
        ranges.emplace_back(c->base, c->size);
        pool.chunks.erase(c->base);  // the segment's record goes with it
      }
    }
  }
  std::size_t bytes = 0;
  for (const auto& [base, size] : ranges) {
    vm::free_addresses(pool.device, base, size);
    address_bytes -= size;
    bytes += size;
  }
  return bytes;
}

// Note [A time budget for moves]
// A page moved costs a map and an access call, tens of microseconds under the
// growth mutex. A program whose steps keep moving pages (sizes that vary from
// step to step, threads whose peaks come at different times: W2, W3, W5's
// training logs) would spend a large share of its time there for the last few
// percent of memory. So moves get a budget: 1% of the time. The pool counts the
// pages it moves; when, over a window of at least 10 ms, they cost more than 1%
// of the window (at what mapping a page has cost so far), the slack grows by
// 1/16 of the peak in use, up to 1/4: more new pages, fewer moves. When a
// window's moves cost under 0.1%, it shrinks by the same step. Memory is traded
// for time only where moves cost time, and the pool still fails only when the
// device or the budget has no pages (every step of Note [Pages, frugal first]
// runs before it does).
void vmm_pool_resource::impl::note_map_time(std::int64_t ns, std::size_t pages) {
  if (pages == 0) return;
  const std::int64_t per_page = ns / static_cast<std::int64_t>(pages);
  map_ns_per_page = map_ns_per_page == 0 ? per_page : (7 * map_ns_per_page + per_page) / 8;
}

void vmm_pool_resource::impl::note_moved(std::size_t pages) {
  if (pages == 0) return;
  pages_moved += pages;
  const std::int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  if (window_start_ns == 0) window_start_ns = now;
  window_moves += pages;
  const std::int64_t elapsed = now - window_start_ns;
  constexpr std::int64_t window_ns = 10'000'000;
  if (elapsed < window_ns) return;
  extra_slack = detail::budgeted_slack(extra_slack, peak_used, window_moves, map_ns_per_page, elapsed);
  window_start_ns = now;
  window_moves = 0;
}

bool vmm_pool_resource::impl::grow(arena& a, std::size_t need, bool /*memory_short*/) {
  {
    // Addresses are what growth adds: when a free block fits, it was memory that
    // fell short (make_ready), and more addresses would not help.
    std::lock_guard lock(a.lock);
    if (a.free.find(need) != nullptr) return false;
  }
  return new_segment(a, need) != nullptr;
}

std::size_t vmm_pool_resource::impl::create_pages(std::size_t count, std::vector<std::uint64_t>& out) {
  std::size_t made = 0;
  while (made < count) {
    if (pool.reserved_bytes.load() + page > maximum) break;
    const std::optional<CUmemGenericAllocationHandle> h = vm::create(pool.device, page, opt.posix_fd_shareable);
    if (!h) break;
    out.push_back(*h);
    pool.reserved_bytes += page;
    pool.note_reserved();
    ++pages_created;
    ++made;
  }
  return made;
}

std::vector<std::uint64_t> vmm_pool_resource::impl::supply_pages(arena& a, const std::vector<arena*>& others,
                                                                 std::size_t count) {
  std::vector<std::uint64_t> out;
  out.reserve(count);
  std::size_t created = 0;
  // 0. New pages within the slack.
  const std::size_t slack_limit = std::max(peak_used, busy_peaks) + slack_bytes();
  const std::size_t held = pool.reserved_bytes.load();
  if (held < slack_limit) created = create_pages(std::min(count, (slack_limit - held) / page), out);
  // 1. The arena's own free pages.
  if (out.size() < count) take_pages(a, count - out.size(), out, [](const block*) { return true; });
  // 2. Idle streams' settled free pages; every other stream is asked to fence its frees.
  auto take_settled = [&](arena* s) {
    settle(*s);
    pool.absorb_completed_pending(*s);  // frees other streams made of its blocks, complete now
    auto settled = [&](const block* b) { return is_settled(*s, b->free_epoch); };
    take_pages(*s, count - out.size(), out, settled);
    if (out.size() < count) take_whole_slots(*s, count - out.size(), out, settled);
    if (s->fenced_frees < s->frees) s->fence_requested.store(true, std::memory_order_relaxed);
  };
  // Fenced free pages of s, a's stream waiting for s's fence on the device.
  auto take_fenced = [&](arena* s) {
    const std::size_t before = out.size();
    bool wait = false;
    auto fenced = [&](const block* b) {
      if (b->slot && b->freed_by == &a) return true;  // a's own stream freed it
      if (!s->is_fenced(b)) return false;
      wait = wait || !is_settled(*s, b->free_epoch);
      return true;
    };
    take_pages(*s, count - out.size(), out, fenced);
    if (out.size() < count) take_whole_slots(*s, count - out.size(), out, fenced);
    if (out.size() > before && wait) {
      pool.wait_for(a, s->fence);
      a.note_waited(s, s->fenced_frees);
    }
  };
  const bool across = pool.settings.reuse_across_streams;
  if (out.size() < count && across) {
    const std::int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
    for (arena* s : others) {
      std::lock_guard lock(s->lock);
      if (!is_busy(*s, now)) take_settled(s);
      if (out.size() == count) break;
    }
  }
  // 3. The arena's free slots' pages, whole slots first.
  if (out.size() < count) take_whole_slots(a, count - out.size(), out, [](const block*) { return true; });
  // 4. The fenced free pages of the streams this thread drives (Note [Streams that take turns]).
  for (arena* s : others) {
    if (out.size() == count || !across) break;
    if (!take_turns(a, *s)) continue;
    std::lock_guard lock(s->lock);
    take_fenced(s);
    if (s->fenced_frees < s->frees) s->fence_requested.store(true, std::memory_order_relaxed);
  }
  // 5. The device, within the budget.
  if (out.size() < count) created += create_pages(count - out.size(), out);
  // 6. Busy streams' settled free pages.
  for (arena* s : others) {
    if (out.size() == count || !across) break;
    std::lock_guard lock(s->lock);
    take_settled(s);
  }
  // 7. Other streams' fenced free pages, after a device-side wait on their fences.
  for (arena* s : others) {
    if (out.size() == count || !across) break;
    std::lock_guard lock(s->lock);
    take_fenced(s);
  }
  note_moved(out.size() - created);
  return out;
}

void vmm_pool_resource::impl::reap_every_alias() {
  for (auto& [key, s] : pool.arenas) {
    std::lock_guard lock(s->lock);
    pool.flush_quick(*s);
    settle(*s);
    reap_aliases(*s);
  }
}

std::size_t vmm_pool_resource::impl::give_back(bool /*device_synchronized*/) {
  std::size_t released = 0;
  std::shared_lock arenas_lock(pool.arenas_mutex);
  reap_every_alias();  // first: a handle mapped anywhere else stays
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
    reap_every_alias();
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
  if (const std::size_t short_by = addresses_short.load(std::memory_order_relaxed); short_by != 0) {
    why += "; no address range of " + std::to_string(short_by) +
           " bytes could be reserved, even after the pool gave back every segment that held nothing "
           "(the process's GPU address space is used up)";
  }
  return why;
}

}  // namespace gpumem
