// vmm_pool_resource's physical side: handles sized to the need, mapped under the
// blocks handed out; free handles moved under a request when the device has too
// little memory; the old mappings of moved handles unmapped later; giving
// handles back. The pool's mutex is held throughout (see vmm_pool_impl.hpp).
#include <algorithm>
#include <cstdio>
#include <exception>
#include <limits>
#include <map>

#include "driver/driver.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "vmm/vmm_pool_impl.hpp"

namespace gpumem {
namespace vm = detail::vmm;
using detail::device_context_guard;

// Note [Handles sized to the need]
// Every VMM driver call costs per handle, almost whatever the handle's size
// (H200, driver 580, 8 GiB mapped per row; microseconds per handle):
//
//   handle   create  map  access  unmap  release
//   2 MiB     14.2   1.9   38.7   21.8    13.2
//   64 MiB    10.6   0.9   25.8   16.7    37.6
//   1 GiB     22.1   0.9   60.5   26.2   327.8
//
// and cuMemSetAccess or cuMemUnmap over many handles in one call costs the same
// per handle as one call each. So the number of handles touched decides the
// time. The pool therefore maps each missing contiguous run of a request with
// as few handles as it can: fresh ones of up to max_handle_bytes (1 GiB) from
// the device, else free handles of the pool moved there whole. A handle is the
// unit that moves (the whole handle, mapped from offset 0, so
// cuMemRetainAllocationHandle on a mapping's address always names the handle
// and physical_pieces() stays exact), and it can move only when its whole
// address range lies in one settled free block (Note [When a physical handle
// may be unmapped]). The price: one live block anywhere on a large handle pins
// all of it, for moving and for giving back; free memory is then joined at the
// granularity of the handles that hold it.
//
// Note [Mapping on demand, and moving free handles]
// For each run of [at, at + size) (rounded out to the mapping unit) with no
// handle under it, in this order, cheapest first:
//  1. fresh handles from the device: cuMemGetInfo says how much it has. A
//     create that fails anyway is slow, so the first failure moves on to step
//     2; halving the size down to one unit is tried only when steps 2 and 3
//     found nothing (the pool holds no free handle);
//  2. a settled free handle of the pool no larger than what is left of the
//     run, the largest first (fewest handles): mapped here, ~27 us each for
//     map + access, where giving it back and creating anew would cost more;
//  3. when only larger free handles are left: the smallest goes back to the
//     device (unmap + release), then step 1 makes what is needed;
//  4. wait for the pool's fences (those streams' work only), then synchronise
//     the device once, each followed by steps 1-3 again. An allocation fails
//     only when the device and the pool's free handles together lack the memory.
// Access is set once per contiguous run of new mappings.
//
// Note [Deferred unmapping of moved handles]
// A moved handle is not unmapped at its old address during the request: a
// handle may be mapped at two addresses at once, and the unmap (~17 us per
// handle) would be most of the request's time after the map. Instead the old
// range becomes a `stale` block: not free, so no request is ever carved from
// it, nothing is mapped there, and nothing can be handed out at an address
// whose physical memory now belongs to the moved handle's new block. (Only a
// use after free through the old address would reach the new block, where an
// unmapped range would fault.) The stale mappings are unmapped, and their
// addresses become free again, at the next trim()/release(), when an address
// range is not found, and before the next request moves handles: so a handle
// has at most one stale mapping, and the stale ranges hold at most the
// device's memory in addresses.

namespace {

struct piece {
  std::uintptr_t at = 0;
  std::size_t bytes = 0;
  CUmemGenericAllocationHandle handle = 0;
  std::uintptr_t from = 0;  // where a moved handle is still mapped; 0: a new handle
};

}  // namespace

bool vmm_pool_resource::impl::fully_mapped(std::uintptr_t at, std::size_t size) const {
  std::uintptr_t cur = at / gran * gran;
  const std::uintptr_t hi = vm::round_up(at + size, gran);
  while (cur < hi) {
    auto it = maps.upper_bound(cur);
    if (it == maps.begin()) return false;
    --it;
    if (it->first + it->second.bytes <= cur) return false;
    cur = it->first + it->second.bytes;
  }
  return true;
}

bool vmm_pool_resource::impl::map_range(std::uintptr_t at, std::size_t size, front& caller) {
  const std::uintptr_t lo = at / gran * gran;
  const std::uintptr_t hi = vm::round_up(at + size, gran);
  // The runs of [lo, hi) with no handle mapped under them.
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> gaps;
  {
    std::uintptr_t cur = lo;
    auto it = maps.upper_bound(lo);
    if (it != maps.begin()) {
      auto p = std::prev(it);
      cur = std::max(cur, p->first + p->second.bytes);
    }
    while (cur < hi) {
      if (it == maps.end() || it->first >= hi) {
        gaps.emplace_back(cur, hi);
        break;
      }
      if (it->first > cur) gaps.emplace_back(cur, it->first);
      cur = std::max(cur, it->first + it->second.bytes);
      ++it;
    }
  }
  if (gaps.empty()) return true;

  constexpr std::size_t unknown = std::numeric_limits<std::size_t>::max();
  std::vector<piece> pieces;
  std::multimap<std::size_t, std::uintptr_t> movable;  // settled free handles by size
  bool listed = false;
  // A failed cuMemCreate is slow (the driver searches before it gives up), so the
  // first failure sends the search to the pool's free handles; smaller fresh
  // handles (halving) are tried only when the pool has none left to move.
  bool halve_creates = false;
  std::size_t device_free = unknown;  // what the device can still give, as far as known
  int stage = 0;  // 0: as is; 1: after waiting on the fences; 2: after a device synchronisation
  std::size_t gi = 0;
  std::uintptr_t cur = gaps[0].first;
  while (gi < gaps.size()) {
    if (cur >= gaps[gi].second) {
      if (++gi < gaps.size()) cur = gaps[gi].first;
      continue;
    }
    const std::size_t rem = gaps[gi].second - cur;
    // 1. fresh handles from the device
    if (device_free == unknown) device_free = device_memory_info(device).free_bytes / gran * gran;
    std::size_t want = std::min({rem, opt.max_handle_bytes, device_free});
    bool created = false;
    while (want >= gran) {
      if (auto h = vm::create(device, want, opt.posix_fd_shareable)) {
        pieces.push_back({cur, want, *h, 0});
        ++handles_created;
        mapped += want;
        device_free -= std::min(device_free, want);
        cur += want;
        created = true;
        break;
      }
      if (!halve_creates) break;
      want = want / 2 / gran * gran;
    }
    if (created) continue;
    device_free = 0;
    // 2. a settled free handle that fits what is left, the largest first
    if (!listed) {
      if (!stale.empty()) unmap_stale();
      movable.clear();
      for (const auto& [a, mp] : maps) {
        if (range_settled_free(a, mp.bytes)) movable.emplace(mp.bytes, a);
      }
      listed = true;
    }
    if (auto mv = movable.upper_bound(rem); mv != movable.begin()) {
      --mv;
      const std::uintptr_t from = mv->second;
      const std::size_t bytes = mv->first;
      movable.erase(mv);
      auto mp = maps.find(from);
      const CUmemGenericAllocationHandle h = mp->second.handle;
      maps.erase(mp);
      auto b = blocks.upper_bound(from);
      --b;
      b = split_out(b, from, bytes);
      erase_free(b->first, b->second);
      b->second = blk{.size = bytes, .free = false, .stale = true};
      stale.emplace_back(from, bytes);
      pieces.push_back({cur, bytes, h, from});
      cur += bytes;
      ++remapped;
      continue;
    }
    // 3. only larger free handles: the smallest goes back, the device makes what is needed
    if (!movable.empty()) {
      auto mv = movable.begin();
      const std::uintptr_t from = mv->second;
      const std::size_t bytes = mv->first;
      movable.erase(mv);
      auto mp = maps.find(from);
      vm::unmap(device, from, bytes);
      vm::release(device, mp->second.handle);
      maps.erase(mp);
      refresh_mapped(from, bytes);
      mapped -= bytes;
      ++released;
      device_free = unknown;
      continue;
    }
    // 4. smaller fresh handles, then wait for the frees: the fences' streams, then the device
    if (!halve_creates) {
      halve_creates = true;
      device_free = unknown;
      continue;
    }
    if (stage == 0) {
      settle(true, &caller);
    } else if (stage == 1) {
      {
        device_context_guard g(device);
        GPUMEM_CU(cuCtxSynchronize);
      }
      settle(false, &caller, true);
    } else {
      break;
    }
    ++stage;
    listed = false;
    device_free = unknown;
  }

  // Map what was found, in address order; access once per contiguous run. Short
  // or not, what is mapped stays as the pool's (the caller frees the block).
  std::size_t placed = 0;
  auto set_access_runs = [&] {
    for (std::size_t k = 0; k < placed;) {
      std::size_t j = k + 1;
      while (j < placed && pieces[j].at == pieces[j - 1].at + pieces[j - 1].bytes) ++j;
      vm::set_access(device, pieces[k].at, pieces[j - 1].at + pieces[j - 1].bytes - pieces[k].at,
                     opt.peer_devices);
      k = j;
    }
  };
  // The free neighbours of the request that new mappings reach (the rounding out
  // to whole units) are mapped now.
  auto refresh_placed = [&] {
    for (std::size_t k = 0; k < placed; ++k) refresh_mapped(pieces[k].at, pieces[k].bytes);
  };
  try {
    for (; placed < pieces.size(); ++placed) {
      const piece& p = pieces[placed];
      vm::map(device, p.at, p.bytes, p.handle);
      maps.emplace(p.at, mapping{p.bytes, p.handle});
    }
    set_access_runs();
    refresh_placed();
  } catch (...) {
    // What was not mapped goes back where it came from: new handles to the
    // device, moved ones to their old mapping (still in place).
    for (std::size_t k = placed; k < pieces.size(); ++k) {
      const piece& p = pieces[k];
      if (p.from == 0) {
        if (detail::driver().cuMemRelease(p.handle) == CUDA_SUCCESS) mapped -= p.bytes;
        continue;
      }
      maps.emplace(p.from, mapping{p.bytes, p.handle});
      std::erase(stale, std::pair{p.from, p.bytes});
      auto b = blocks.find(p.from);
      b->second = blk{.size = p.bytes, .mapped = true};
      insert_free(b->first, b->second);
      coalesce(b);
    }
    try {
      set_access_runs();
      refresh_placed();
    } catch (...) {
      // The first error is the one reported.
    }
    throw;
  }
  return gi >= gaps.size();
}

void vmm_pool_resource::impl::unmap_stale() {
  while (!stale.empty()) {
    const auto [a, bytes] = stale.back();
    vm::unmap(device, a, bytes);
    stale.pop_back();
    auto it = blocks.find(a);
    it->second = blk{.size = bytes};
    insert_free(a, it->second);
    coalesce(it);
  }
}

std::size_t vmm_pool_resource::impl::release_free_handles(std::size_t keep) {
  unmap_stale();
  std::size_t freed = 0;
  for (auto it = maps.begin(); it != maps.end() && mapped - used > keep;) {
    if (!range_settled_free(it->first, it->second.bytes)) {
      ++it;
      continue;
    }
    const std::uintptr_t a = it->first;
    const std::size_t bytes = it->second.bytes;
    vm::unmap(device, a, bytes);
    vm::release(device, it->second.handle);
    mapped -= bytes;
    freed += bytes;
    ++released;
    it = maps.erase(it);
    refresh_mapped(a, bytes);
  }
  return freed;
}

void vmm_pool_resource::impl::release_everything() noexcept {
  auto report = [](const std::exception& e) {
    std::fprintf(stderr, "gpumem: vmm_pool_resource: giving memory back failed: %s\n", e.what());
  };
  for (const auto& [a, bytes] : stale) {
    try {
      vm::unmap(device, a, bytes);
    } catch (const std::exception& e) {
      report(e);
    }
  }
  stale.clear();
  for (const auto& [a, mp] : maps) {
    try {
      vm::unmap(device, a, mp.bytes);
      vm::release(device, mp.handle);
    } catch (const std::exception& e) {
      report(e);
    }
  }
  maps.clear();
  mapped = 0;
}

}  // namespace gpumem
