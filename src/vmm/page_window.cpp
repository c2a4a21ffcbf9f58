// vmm_pool_resource's growth: the place in a stream's segments that needs the
// fewest new pages for a request no free block fits, and filling it. The arena's
// lock and the growth mutex are held throughout (vmm_pool_impl.hpp).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include "vmm/virtual_memory.hpp"
#include "vmm/vmm_pool_impl.hpp"

namespace gpumem {
namespace vm = detail::vmm;

// Note [Growing by the fewest pages]
// The engine asks for growth when no free block of the arena fits (free blocks
// are all mapped: Note [Pages under the blocks], page_blocks.cpp). Growth looks
// at the runs of adjacent free, unmapped and alias blocks of the arena's
// segments, and in them at the windows of the request's length that start or
// end at a block's edge. A window's pages cost:
//   - nothing where a free block has them;
//   - nothing but bookkeeping where an alias has them whose pages' primary
//     places are free pages of the same arena: the window takes them back
//     (primary and alias swap places; no driver call);
//   - a page each where it is unmapped: a page then comes, frugal first, from
//     (1) the arena's own whole free pages (its stream orders their reuse; the
//     smallest free blocks first), (2) other streams' settled whole free pages,
//     (3) the device, within maximum_bytes, and (4) when the device or the
//     budget refuses, other streams' fenced free pages, the arena's stream
//     waiting for their fences on the device.
// The cheapest window wins: fewest new pages, then fewest swaps. An alias whose
// pages' primary places lie inside the window cannot be taken back into it (the
// window would hold one page twice), so such a window is not considered. When
// no run is long enough, the arena's settled aliases are unmapped (their
// addresses join the runs) and, failing that, a new segment is reserved.
//
// So a stream holds new memory only when none of its own and no settled memory
// of other streams can move there; two streams are tied by a device-side wait
// only when memory is short; and a loop that asks for the same sizes in the
// same order finds, after its first steps, every window it needs made of free
// blocks and aliases it can take back: no driver call at all. Pages obtained are
// mapped even when too few came (the window is then partly filled and the next
// attempt needs fewer); the engine then synchronises the device, which settles
// every free, and grows once more before it fails.

namespace {

std::size_t overlap(std::uintptr_t a0, std::uintptr_t a1, std::uintptr_t b0, std::uintptr_t b1) {
  const std::uintptr_t lo = std::max(a0, b0), hi = std::min(a1, b1);
  return hi > lo ? hi - lo : 0;
}

}  // namespace

bool vmm_pool_resource::impl::find_window(arena& a, std::size_t need, window& out) {
  // Pages of a's segments wholly inside a free block: where an alias can take its page back.
  std::unordered_map<const chunk*, std::vector<char>> free_pages;
  for (chunk* c : a.chunks) {
    std::vector<char>& f = free_pages[c];
    f.assign(c->pages.size(), 0);
    for (const block* b = c->first; b != nullptr; b = b->next_in_chunk) {
      if (!b->free) continue;
      for (std::uintptr_t p = vm::round_up(b->address, page); p + page <= b->address + b->size; p += page) {
        f[page_index(*c, p)] = 1;
      }
    }
  }
  // An alias block that can take all its pages back: the lowest and highest
  // addresses of their primary places in its own segment (none: 0, 0).
  struct alias_info {
    bool revivable = false;
    std::uintptr_t lo = 0, hi = 0;
  };
  auto inspect_alias = [&](const block* b) {
    alias_info info{true, std::numeric_limits<std::uintptr_t>::max(), 0};
    const chunk& c = *b->owner;
    for (std::size_t i = page_index(c, b->address), k = 0; k < b->size / page; ++i, ++k) {
      const page_ref& home = homes.at(c.pages[i]).primary;
      auto it = free_pages.find(home.c);
      if (it == free_pages.end() || it->second[home.index] == 0) return alias_info{};
      if (home.c == &c) {
        info.lo = std::min(info.lo, page_address(home));
        info.hi = std::max(info.hi, page_address(home) + page);
      }
    }
    if (info.hi == 0) info.lo = 0;
    return info;
  };

  bool found = false;
  std::size_t best_cost = std::numeric_limits<std::size_t>::max();
  std::vector<block*> run;
  std::vector<alias_info> infos;
  std::unordered_set<std::uint64_t> seen;  // a window's alias pages' handles
  auto evaluate = [&](chunk* c) {
    if (run.empty()) return;
    const std::uintptr_t run_begin = run.front()->address;
    const std::uintptr_t run_end = run.back()->address + run.back()->size;
    if (run_end - run_begin < need) return;
    auto consider = [&](std::size_t k, std::uintptr_t begin) {
      const std::uintptr_t end = begin + need;
      const std::uintptr_t plo = begin / page * page, phi = vm::round_up(end, page);
      std::size_t new_pages = 0, swaps = 0;
      seen.clear();
      std::size_t j = k;
      while (j > 0 && run[j]->address > begin) --j;
      for (; j < run.size() && run[j]->address < end; ++j) {
        const block* b = run[j];
        const std::size_t pages = overlap(b->address, b->address + b->size, plo, phi) / page;
        if (b->unmapped) new_pages += pages;
        if (b->alias && pages != 0) {
          if (infos[j].hi > infos[j].lo && overlap(infos[j].lo, infos[j].hi, plo, phi) != 0) return;
          // Two aliases of one page cannot both take it back.
          const std::uintptr_t from = std::max(b->address, plo);
          for (std::size_t i = page_index(*c, from), n = 0; n < pages; ++i, ++n) {
            if (!seen.insert(c->pages[i]).second) return;
          }
          swaps += pages;
        }
      }
      const std::size_t cost = new_pages * (std::size_t{1} << 32) + swaps;
      if (!found || cost < best_cost) {
        found = true;
        best_cost = cost;
        std::size_t f = k;
        while (f > 0 && run[f]->address > begin) --f;
        while (run[f]->address + run[f]->size <= begin) ++f;
        out = {.c = c, .first = run[f], .begin = begin, .new_pages = new_pages, .swaps = swaps};
      }
    };
    for (std::size_t k = 0; k < run.size(); ++k) {
      const block* b = run[k];
      if (b->address + need <= run_end) consider(k, b->address);
      if (b->address + b->size >= run_begin + need) consider(k, b->address + b->size - need);
    }
  };
  std::size_t dbg_alias = 0, dbg_rev = 0, dbg_blocks = 0;
  for (chunk* c : a.chunks) {
    run.clear();
    infos.clear();
    for (block* b = c->first; b != nullptr; b = b->next_in_chunk) {
      alias_info info;
      ++dbg_blocks;
      if (b->alias) { info = inspect_alias(b); ++dbg_alias; dbg_rev += info.revivable; }
      if (b->free || b->unmapped || info.revivable) {
        run.push_back(b);
        infos.push_back(info);
      } else {
        evaluate(c);
        run.clear();
        infos.clear();
      }
    }
    evaluate(c);
  }
  if (getenv("DBG")) fprintf(stderr, "grow need=%zu blocks=%zu alias=%zu revivable=%zu found=%d new=%zu swaps=%zu\n", need/page, dbg_blocks, dbg_alias, dbg_rev, found, found?out.new_pages:0, found?out.swaps:0);
  return found;
}

bool vmm_pool_resource::impl::fill_window(arena& a, const std::vector<arena*>& others, const window& w,
                                          std::size_t need) {
  const std::uintptr_t lo = w.begin, hi = w.begin + need;
  const std::uintptr_t plo = lo / page * page, phi = vm::round_up(hi, page);
  chunk& c = *w.c;
  // 1. The window's blocks leave their indexes, cut to the window: free ones to
  //    [lo, hi) (the rest stays free: an alias's primary page may lie there),
  //    unmapped and alias ones to the pages the window needs. Pieces carry no
  //    index state while they are filled (so nothing merges into them).
  struct piece {
    block* b;
    enum { free, unmapped, alias } kind;
  };
  std::vector<piece> pieces;
  for (block* b = w.first; b != nullptr && b->address < hi;) {
    if (b->address + b->size <= lo) {
      b = b->next_in_chunk;
      continue;
    }
    const auto kind = b->free ? piece::free : b->unmapped ? piece::unmapped : piece::alias;
    const std::uintptr_t from = std::max(b->address, kind == piece::free ? lo : plo);
    const std::uintptr_t to = std::min(b->address + b->size, kind == piece::free ? hi : phi);
    if (kind == piece::free) {
      a.free.remove(b);
    } else if (kind == piece::unmapped) {
      a.unmapped.remove(b);
    } else {
      a.aliases.erase(std::find(a.aliases.begin(), a.aliases.end(), b));
    }
    b = split_piece(a, b, from, to - from);
    b->free = false;
    b->unmapped = false;
    pieces.push_back({b, kind});
    b = b->next_in_chunk;
  }
  // 2. Aliases take their pages back: each page's primary place (a free page of
  //    this arena, outside the window) becomes the alias.
  for (const piece& p : pieces) {
    if (p.kind != piece::alias) continue;
    const std::size_t first = page_index(c, p.b->address);
    const std::size_t n = p.b->size / page;
    for (std::size_t k = 0; k < n;) {
      const page_ref home = homes.at(c.pages[first + k]).primary;
      // The free block holding that page, and how many of the next pages' homes follow it there.
      block* f = home.c->first;
      const std::uintptr_t at = page_address(home);
      while (f->address + f->size <= at) f = f->next_in_chunk;
      std::size_t run = 1;
      while (k + run < n) {
        const page_ref next = homes.at(c.pages[first + k + run]).primary;
        if (next.c != home.c || next.index != home.index + run || at + (run + 1) * page > f->address + f->size) break;
        ++run;
      }
      make_alias(a, f, at, run);
      for (std::size_t r = 0; r < run; ++r) {
        page_home& h = homes.at(c.pages[first + k + r]);
        h.aliases.erase(std::find(h.aliases.begin(), h.aliases.end(), page_ref{&c, first + k + r}));
        h.primary = {&c, first + k + r};
      }
      a.reserved_bytes += run * page;
      pages_revived += run;
      k += run;
    }
    p.b->alias = false;
  }
  // 3. Pages for the unmapped pieces, mapped in address order as far as they go.
  std::size_t wanted = 0;
  for (const piece& p : pieces) {
    if (p.kind == piece::unmapped) wanted += p.b->size / page;
  }
  std::vector<std::uint64_t> handles;
  if (wanted != 0) handles = supply_pages(a, others, wanted);
  std::size_t used = 0;
  bool complete = true;
  for (piece& p : pieces) {
    if (p.kind != piece::unmapped) continue;
    const std::size_t n = p.b->size / page;
    const std::size_t take = std::min(n, handles.size() - used);
    if (take < n) {
      complete = false;
      if (take == 0) {
        add_unmapped(a, p.b);
        p.b = nullptr;
        continue;
      }
      block* rest = p.b;
      p.b = detail::stream_ordered_pool::split_off_front(a, rest, take * page);
      rest->size -= take * page;
      add_unmapped(a, rest);
    }
    p.b->unmapped = false;
    map_pages(a, c, p.b->address,
              std::vector<std::uint64_t>(handles.begin() + static_cast<std::ptrdiff_t>(used),
                                         handles.begin() + static_cast<std::ptrdiff_t>(used + take)));
    used += take;
  }
  // 4. Everything with memory becomes free again and merges: counted as freed on
  //    a's stream now, so another stream takes it after a's next fence.
  const std::uint64_t epoch = ++a.frees;
  for (const piece& p : pieces) {
    if (p.b == nullptr) continue;
    pool.free_into(a, p.b, p.kind == piece::free ? p.b->free_epoch : epoch);
  }
  return complete;
}

}  // namespace gpumem
