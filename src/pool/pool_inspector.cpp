// pool_inspector (pool_inspector.hpp).
#include "pool/pool_inspector.hpp"

#include <algorithm>
#include <sstream>
#include <unordered_set>

#include "pool/pool_impl.hpp"
#include "vmm/vmm_pool_impl.hpp"

namespace gpumem::detail {

std::string pool_inspector::violations(pool_resource& pool) { return engine_violations(pool.impl_->pool, 0); }

std::string pool_inspector::violations(vmm_pool_resource& pool) {
  vmm_pool_resource::impl& m = *pool.impl_;
  std::lock_guard growing(m.pool.growth_mutex);  // no growth half done
  if (std::string v = engine_violations(m.pool, m.page); !v.empty()) return v;
  // Every mapped page is its handle's primary place or one of its aliases, and
  // every handle's places are mapped with it.
  std::shared_lock arenas_lock(m.pool.arenas_mutex);
  std::size_t places = 0;
  for (const auto& [key, a] : m.pool.arenas) {
    std::lock_guard lock(a->lock);
    for (chunk* c : a->chunks) {
      for (std::size_t i = 0; i < c->pages.size(); ++i) {
        if (c->pages[i] == 0) continue;
        ++places;
        auto it = m.homes.find(c->pages[i]);
        if (it == m.homes.end()) return "a mapped page's handle is not among the pool's handles";
        const auto& h = it->second;
        const vmm_pool_resource::impl::page_ref here{c, i};
        if (!(h.primary == here) && std::find(h.aliases.begin(), h.aliases.end(), here) == h.aliases.end()) {
          return "a mapped page is neither its handle's primary place nor one of its aliases";
        }
      }
    }
  }
  std::size_t recorded = 0;
  for (const auto& [handle, h] : m.homes) {
    if (h.primary.c == nullptr || h.primary.c->pages[h.primary.index] != handle) return "a handle's primary place maps another handle";
    for (const auto& al : h.aliases) {
      if (al.c->pages[al.index] != handle) return "a handle's alias maps another handle";
    }
    recorded += 1 + h.aliases.size();
  }
  if (recorded != places) return "the handles' places and the mapped pages disagree";
  if (m.homes.size() * m.page != m.pool.reserved_bytes.load()) return "the pool holds another count of pages than its handles";
  return {};
}

std::string pool_inspector::engine_violations(stream_ordered_pool& p, std::size_t page) {
  std::ostringstream why;
  std::shared_lock arenas_lock(p.arenas_mutex);
  std::shared_lock chunks_lock(p.chunks_mutex);

  std::size_t reserved_total = 0;
  std::uintptr_t previous_end = 0;
  std::unordered_set<const chunk*> owned;
  for (const auto& [key, a] : p.arenas) {
    for (const chunk* c : a->chunks) owned.insert(c);
  }
  for (const auto& [base, c] : p.chunks) {
    if (base < previous_end) return "chunks overlap at " + std::to_string(base);
    previous_end = base + c->size;
    if (page == 0) reserved_total += c->size;
    if (c->owner == nullptr || owned.count(c.get()) == 0) return "a chunk has no owning arena";
  }

  for (const auto& [key, a] : p.arenas) {
    std::lock_guard lock(a->lock);
    std::size_t free_bytes = 0, free_count = 0, used = 0, live = 0, cached = 0, reserved = 0;
    std::size_t unmapped_bytes = 0, unmapped_count = 0, alias_count = 0;
    std::unordered_set<const block*> pending;
    for (const auto& pf : a->pending) pending.insert(pf.freed);
    const std::unordered_set<const block*> aliases(a->aliases.begin(), a->aliases.end());
    for (const chunk* c : a->chunks) {
      if (c->owner != a.get()) return "an arena lists a chunk it does not own";
      if (page == 0) reserved += c->size;
      std::vector<char> needs_page(page != 0 ? c->pages.size() : 0, 0);
      std::uintptr_t at = c->base;
      const block* prev = nullptr;
      for (const block* b = c->first; b != nullptr; prev = b, b = b->next_in_chunk) {
        if (b->owner != c) return "a block points at the wrong chunk";
        if (b->prev_in_chunk != prev) return "broken prev link in a chunk";
        if (b->address != at) return "blocks do not tile their chunk (gap or overlap)";
        if (b->size == 0 || b->size % stream_ordered_pool::granule != 0) return "block size not a granule multiple";
        at += b->size;
        const bool primary = !b->unmapped && !b->alias;
        if ((b->unmapped || b->alias) && (page == 0 || b->address % page != 0 || b->size % page != 0)) {
          return "an unmapped or alias block is not whole pages";
        }
        if (b->unmapped + b->alias + b->free + b->cached > 1) return "a block is in two states at once";
        if (page != 0 && !b->unmapped) {
          for (std::uintptr_t q = (b->address - c->base) / page; q * page < b->address + b->size - c->base; ++q) {
            needs_page[q] = static_cast<char>(primary ? 1 : 2);
          }
        }
        if (b->free) {
          if (prev != nullptr && prev->free) return "two free neighbours were not merged";
          free_bytes += b->size;
          ++free_count;
          if (a->live.find(b->address) != nullptr) return "a free block is in the live map";
        } else if (b->unmapped) {
          if (prev != nullptr && prev->unmapped) return "two unmapped neighbours were not merged";
          unmapped_bytes += b->size;
          ++unmapped_count;
        } else if (b->alias) {
          if (aliases.count(b) == 0) return "an alias block is missing from the alias list";
          ++alias_count;
        } else if (b->cached) {
          ++cached;
          if (a->live.find(b->address) != b) return "a cached block is missing from the live map";
        } else if (pending.count(b) != 0) {
          if (a->live.find(b->address) != nullptr) return "a pending block is in the live map";
        } else {
          ++live;
          used += b->size;
          if (a->live.find(b->address) != b) return "a live block is missing from the live map";
          if (b->requested_bytes == 0 || b->requested_bytes > b->size) return "a live block's requested size is wrong";
        }
      }
      if (at != c->base + c->size) return "blocks do not cover their chunk";
      for (std::size_t q = 0; q < needs_page.size(); ++q) {
        if ((c->pages[q] != 0) != (needs_page[q] != 0)) {
          why << "page " << q << " of the segment at " << c->base << (needs_page[q] ? " has no handle under a block with memory"
                                                                          : " has a handle under no block with memory");
          return why.str();
        }
        if (needs_page[q] == 1) reserved += page;  // aliases hold no memory of their own
      }
    }
    if (free_bytes != a->free.bytes() || free_count != a->free.count()) {
      why << "the free index holds " << a->free.count() << " blocks / " << a->free.bytes()
          << " bytes, the chunks " << free_count << " / " << free_bytes;
      return why.str();
    }
    if (unmapped_bytes != a->unmapped.bytes() || unmapped_count != a->unmapped.count()) {
      return "the unmapped index disagrees with the blocks";
    }
    if (alias_count != a->aliases.size()) return "the alias list holds blocks that are not aliases";
    if (cached != a->quick.count()) return "the quick cache count disagrees with the blocks";
    if (a->live.size() != live + cached) return "the live map holds blocks that are not live";
    if (used != a->used_bytes) {
      why << "used_bytes " << a->used_bytes << " but live blocks add up to " << used;
      return why.str();
    }
    if (reserved != a->reserved_bytes) {
      why << "an arena's reserved_bytes " << a->reserved_bytes << " disagrees with its chunks' " << reserved;
      return why.str();
    }
    if (a->fenced_frees > a->frees) return "fenced beyond the free count";
    if (a->settled_frees > a->fenced_frees) return "settled beyond the fences";
    reserved_total += page != 0 ? a->reserved_bytes : 0;
  }
  if (reserved_total != p.reserved_bytes.load()) {
    why << "reserved_bytes " << p.reserved_bytes.load() << " but the chunks hold " << reserved_total;
    return why.str();
  }
  return {};
}

std::size_t pool_inspector::live_requested_bytes(const pool_resource& pool, const void* ptr) {
  const stream_ordered_pool& p = pool.impl_->pool;
  const chunk* c = p.chunk_of(reinterpret_cast<std::uintptr_t>(ptr));
  if (c == nullptr) return 0;
  arena& a = *c->owner;
  std::lock_guard lock(a.lock);
  const block* b = a.live.find(reinterpret_cast<std::uintptr_t>(ptr));
  return b != nullptr && !b->cached ? b->requested_bytes : 0;
}

}  // namespace gpumem::detail
