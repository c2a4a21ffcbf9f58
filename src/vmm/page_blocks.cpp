// vmm_pool_resource: the page-level edits of an arena's blocks. Taking whole free
// pages out of free blocks, unmapping old mappings once their frees are
// settled, keeping free addresses without memory apart, and giving pages back.
// The arena's lock is held throughout (vmm_pool_impl.hpp).
#include <algorithm>

#include "driver/driver.hpp"
#include "gpumem/error.hpp"
#include "vmm/virtual_memory.hpp"
#include "vmm/vmm_pool_impl.hpp"

namespace gpumem {
namespace vm = detail::vmm;

// Note [Pages under the blocks]
// Each stream's arena owns segments: address ranges reserved once (a chunk of
// the engine each, segment_bytes long) and carved into blocks exactly as
// pool_resource carves upstream chunks, by the same engine and hot path.
// Physical memory comes in pages of `page` bytes, one handle each, mapped at
// page-aligned addresses of segments; chunk::pages holds the handle mapped at
// each page (0: none). A handle has one primary place, where blocks use it, and
// may have aliases, older places it is still mapped at (`homes` says where). A
// block is in one of these states:
//
//   live, cached, pending  every page it touches is mapped there as primary;
//   free                   likewise; in the arena's good-fit index (`free`),
//                          which the hot path searches;
//   unmapped               no page it touches is mapped; page-aligned at both
//                          ends; in the arena's `unmapped` index;
//   alias                  every page it covers is mapped there, as an alias of
//                          a page whose primary place is elsewhere; page-aligned;
//                          in the arena's `aliases` list; never handed out.
//
// So the hot path never meets an address without memory of its own, and a free
// block merges only with free neighbours (unmapped and alias ones are not
// `free`). A page shared by a free block and a live one is never taken: only
// the whole pages inside a free block move. The physical floor is therefore the
// live bytes rounded out to whole pages, run by run.
//
// A page moves by mapping its handle at the new place (cuMemMap; a handle may be
// mapped at several addresses at once) and setting access there; its old place
// becomes an alias. Its new user must run after the work queued before the
// frees that made the page free:
//  - a page freed on the taker's own stream: stream order gives it;
//  - another stream's page: only when the host has seen that stream's fence
//    covering the free complete (settled: nothing to wait for), or, when the
//    device refuses more, when the fence covers it (the taker's stream then
//    waits for the fence on the device, cuStreamWaitEvent; never the host).
// An alias is never carved or handed out, so no address is handed out twice; a
// use after free through it reaches the page's new user instead of faulting (as
// with any allocator that reuses memory). It stays mapped for two reasons:
//  - cuMemUnmap does not wait for work in flight, so the old place may be
//    unmapped only once the host has seen its frees complete (settled);
//  - a range that gave its pages away is often wanted again in its old shape (a
//    training step frees and asks for the same sizes in the same order). When
//    the pages' primary places are free again, growth takes them back by
//    swapping primary and alias (no driver call: Note [Growing by the fewest
//    pages], page_window.cpp). This is how a loop settles into a layout that
//    needs no mapping at all, where moving pages back and forth would cost
//    ~25-40 us of driver calls per page per step.
// Aliases whose pages now belong to another stream (which cannot swap them
// back) are unmapped once settled, at growth; every settled alias is unmapped
// by trim() and release(), and before an address range is found lacking.
//
// Settled: arena::settled_frees is the free count of the arena's last fence
// record that cuEventQuery found complete (or everything before a device
// synchronisation). A block is settled when its free_epoch is at or below it.

void vmm_pool_resource::impl::settle(arena& a) {
  if (a.fence == nullptr || a.fenced_frees <= a.settled_frees) return;
  const CUresult r = detail::driver().cuEventQuery(a.fence);
  if (r == CUDA_SUCCESS) {
    a.settled_frees = a.fenced_frees;
  } else if (r != CUDA_ERROR_NOT_READY) {
    detail::check(r, "cuEventQuery", __FILE__, __LINE__);
  }
}

void vmm_pool_resource::impl::add_unmapped(arena& s, block* b) {
  b->free = false;
  b->alias = false;
  b->unmapped = true;
  if (block* prev = b->prev_in_chunk; prev != nullptr && prev->unmapped) {
    s.unmapped.remove(prev);
    prev->size += b->size;
    prev->next_in_chunk = b->next_in_chunk;
    if (b->next_in_chunk != nullptr) b->next_in_chunk->prev_in_chunk = prev;
    s.slab.recycle(b);
    b = prev;
  }
  if (block* next = b->next_in_chunk; next != nullptr && next->unmapped) {
    s.unmapped.remove(next);
    b->size += next->size;
    b->next_in_chunk = next->next_in_chunk;
    if (next->next_in_chunk != nullptr) next->next_in_chunk->prev_in_chunk = b;
    s.slab.recycle(next);
  }
  s.unmapped.insert(b);
}

vmm_pool_resource::impl::block* vmm_pool_resource::impl::split_piece(arena& s, block* b, std::uintptr_t at,
                                                                      std::size_t bytes) {
  const std::uintptr_t end = b->address + b->size;
  auto put_back = [&](block* part) {
    if (part->free) s.free.insert(part);
    else if (part->unmapped) s.unmapped.insert(part);
    else if (part->alias) s.aliases.push_back(part);
  };
  if (at > b->address) {
    block* front = detail::stream_ordered_pool::split_off_front(s, b, at - b->address);
    b->size -= front->size;
    front->free = b->free;
    front->unmapped = b->unmapped;
    front->alias = b->alias;
    front->free_epoch = b->free_epoch;
    put_back(front);
  }
  if (at + bytes < end) {
    block* middle = detail::stream_ordered_pool::split_off_front(s, b, bytes);
    b->size -= bytes;
    middle->free = b->free;
    middle->unmapped = b->unmapped;
    middle->alias = b->alias;
    middle->free_epoch = b->free_epoch;
    put_back(b);
    return middle;
  }
  return b;
}

vmm_pool_resource::impl::block* vmm_pool_resource::impl::make_alias(arena& s, block* b, std::uintptr_t at,
                                                                     std::size_t n) {
  s.free.remove(b);
  block* taken = split_piece(s, b, at, n * page);
  taken->free = false;
  taken->alias = true;
  s.aliases.push_back(taken);
  s.reserved_bytes -= n * page;
  chunk& c = *taken->owner;
  for (std::size_t i = page_index(c, at), k = 0; k < n; ++i, ++k) homes.at(c.pages[i]).aliases.push_back({&c, i});
  return taken;
}

std::size_t vmm_pool_resource::impl::take_pages(arena& s, std::size_t count, std::vector<std::uint64_t>& out,
                                                const std::function<bool(const block*)>& accept) {
  std::size_t got = 0;
  auto has_whole_page = [this](const block* b) {
    return vm::round_up(b->address, page) + page <= b->address + b->size;
  };
  // The smallest classes first: fragments go before the large free ranges that
  // repeated requests of the same sizes will want back whole.
  while (got < count) {
    block* b = s.free.find_if(page, [&](const block* x) { return has_whole_page(x) && accept(x); });
    if (b == nullptr) break;
    const std::uintptr_t last = (b->address + b->size) / page * page;
    const std::size_t n = std::min(count - got, (last - vm::round_up(b->address, page)) / page);
    block* taken = make_alias(s, b, last - n * page, n);
    chunk& c = *taken->owner;
    for (std::size_t i = page_index(c, taken->address), k = 0; k < n; ++i, ++k) out.push_back(c.pages[i]);
    got += n;
  }
  return got;
}

void vmm_pool_resource::impl::unmap_alias(arena& s, block* b) {
  vm::unmap(pool.device, b->address, b->size);
  chunk& c = *b->owner;
  for (std::size_t i = page_index(c, b->address), k = 0; k < b->size / page; ++i, ++k) {
    auto& aliases = homes.at(c.pages[i]).aliases;
    aliases.erase(std::find(aliases.begin(), aliases.end(), page_ref{&c, i}));
    c.pages[i] = 0;
  }
  add_unmapped(s, b);
}

void vmm_pool_resource::impl::reap_aliases(arena& s, bool foreign_only) {
  if (s.aliases.empty()) return;
  settle(s);
  for (std::size_t i = 0; i < s.aliases.size();) {
    block* b = s.aliases[i];
    bool reap = is_settled(s, b);
    if (reap && foreign_only) {
      const chunk& c = *b->owner;
      const page_ref& home = homes.at(c.pages[page_index(c, b->address)]).primary;
      reap = home.c->owner != &s;
    }
    if (reap) {
      s.aliases[i] = s.aliases.back();
      s.aliases.pop_back();
      b->alias = false;
      unmap_alias(s, b);
    } else {
      ++i;
    }
  }
}

void vmm_pool_resource::impl::map_pages(arena& a, chunk& c, std::uintptr_t at,
                                        const std::vector<std::uint64_t>& handles) {
  const std::size_t first = page_index(c, at);
  std::size_t mapped = 0;
  try {
    for (; mapped < handles.size(); ++mapped) {
      vm::map(pool.device, at + mapped * page, page, handles[mapped]);
    }
    vm::set_access(pool.device, at, handles.size() * page, opt.peer_devices);
  } catch (...) {
    // A driver failure (not a shortage): undo, and give the handles back.
    if (mapped > 0) (void)detail::driver().cuMemUnmap(at, mapped * page);
    for (std::uint64_t h : handles) {
      (void)detail::driver().cuMemRelease(h);
      homes.erase(h);
    }
    pool.reserved_bytes -= handles.size() * page;
    throw;
  }
  for (std::size_t k = 0; k < handles.size(); ++k) {
    c.pages[first + k] = handles[k];
    homes[handles[k]].primary = {&c, first + k};
  }
  a.reserved_bytes += handles.size() * page;
}

std::size_t vmm_pool_resource::impl::release_free_pages(arena& s, std::size_t at_most) {
  std::size_t released = 0;
  auto releasable = [&](const chunk& c, std::size_t i) { return homes.at(c.pages[i]).aliases.empty(); };
  // Visit every settled free block with a whole page; release its runs of pages
  // that no alias maps any more.
  std::vector<block*> candidates;
  s.free.find_if(page, [&](const block* b) {
    if (vm::round_up(b->address, page) + page <= b->address + b->size && is_settled(s, b)) {
      candidates.push_back(const_cast<block*>(b));
    }
    return false;
  });
  for (block* b : candidates) {
    // Each release splits b; the pages above the run just released stay in the
    // block that keeps b's upper part, so go on from there.
    std::uintptr_t at = vm::round_up(b->address, page);
    const std::uintptr_t last = (b->address + b->size) / page * page;
    block* rest = b;
    while (at < last && released + page <= at_most) {
      chunk& c = *rest->owner;
      std::size_t i = page_index(c, at);
      if (!releasable(c, i)) {
        at += page;
        continue;
      }
      std::size_t n = 1;
      while (at + n * page < last && releasable(c, i + n) && released + (n + 1) * page <= at_most) ++n;
      const std::uintptr_t run_end = at + n * page;
      const std::uintptr_t rest_end = rest->address + rest->size;
      s.free.remove(rest);
      // split_piece leaves the part above the run in `rest` (back in the free
      // index) and returns the run, or `rest` itself when the run ends it.
      block* run = split_piece(s, rest, at, n * page);
      run->free = false;
      vm::unmap(pool.device, at, n * page);
      for (std::size_t k = 0; k < n; ++k, ++i) {
        vm::release(pool.device, c.pages[i]);
        homes.erase(c.pages[i]);
        c.pages[i] = 0;
      }
      s.reserved_bytes -= n * page;
      pool.reserved_bytes -= n * page;
      pages_released += n;
      released += n * page;
      add_unmapped(s, run);
      if (run_end >= rest_end) break;
      at = run_end;
    }
  }
  return released;
}

}  // namespace gpumem
