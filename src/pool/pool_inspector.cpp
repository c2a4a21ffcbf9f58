// pool_inspector (pool_inspector.hpp).
#include "pool/pool_inspector.hpp"

#include <algorithm>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "pool/pool_impl.hpp"
#include "vmm/vmm_pool_impl.hpp"

namespace gpumem::detail {

std::string pool_inspector::violations(pool_resource& pool) { return engine_violations(pool.impl_->pool, 0); }

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
    reserved_total += c->size;
    if (c->owner == nullptr || owned.count(c.get()) == 0) return "a chunk has no owning arena";
  }
  if (page == 0 && reserved_total != p.reserved_bytes.load()) {
    why << "reserved_bytes " << p.reserved_bytes.load() << " but chunks add up to " << reserved_total;
    return why.str();
  }

  std::size_t held = 0, held_bytes = 0;  // blocks held for graphs, in every arena
  for (const auto& [key, a] : p.arenas) {
    std::lock_guard lock(a->lock);
    std::size_t free_bytes = 0, free_count = 0, used = 0, live = 0, cached = 0, reserved = 0;
    std::unordered_set<const block*> pending;
    for (const auto& pf : a->pending) pending.insert(pf.freed);
    for (const chunk* c : a->chunks) {
      if (c->owner != a.get()) return "an arena lists a chunk it does not own";
      reserved += c->size;
      std::vector<std::uint32_t> busy(c->pages.size(), 0);
      std::vector<bool> gave(c->pages.size(), false);  // under a pending slot (Note [Swaps across streams])
      std::uintptr_t at = c->base;
      const block* prev = nullptr;
      for (const block* b = c->first; b != nullptr; prev = b, b = b->next_in_chunk) {
        if (b->owner != c) return "a block points at the wrong chunk";
        if (b->prev_in_chunk != prev) return "broken prev link in a chunk";
        if (b->address != at) return "blocks do not tile their chunk (gap or overlap)";
        if (b->size == 0 || b->size % stream_ordered_pool::granule != 0) return "block size not a granule multiple";
        at += b->size;
        if (b->vacant) {
          if (b->free || b->cached || b->slot || !c->for_slots) return "a vacant block is not only vacant";
          if (prev != nullptr && prev->vacant) return "two vacant neighbours were not merged";
          for (std::size_t q = (b->address - c->base) / page; q < (b->address + b->size - c->base) / page; ++q) {
            if (c->pages[q] != 0) return "vacant addresses map a page";
          }
          continue;
        }
        if (c->for_slots && !b->slot) return "a segment of slots holds a block that is not a slot";
        if (b->slot && (b->address % page != 0 || b->size % page != 0)) return "a slot is not whole pages";
        // Note [A free tells a slot by its size first], stream_ordered_pool.hpp: a
        // live slot (one a free may name) was handed out for slot_min_bytes or more.
        if (b->slot && !b->free && !b->cached && b->requested_bytes < p.settings.slot_min_bytes) {
          why << "a live slot was handed out for " << b->requested_bytes << " bytes, under slot_min_bytes";
          return why.str();
        }
        if (b->free) {
          if (b->cached) return "a block is both free and cached";
          // Note [Free lists without branches on their ends], free_index.hpp.
          if (b->free_link == nullptr || *b->free_link != b) return "a free block's list link does not point to it";
          if (prev != nullptr && prev->free) return "two free neighbours were not merged";
          free_bytes += b->size;
          ++free_count;
          if (a->live.find(b->address) != nullptr) return "a free block is in the live map";
          continue;
        }
        if (page != 0 && !(b->cached && b->slot)) {  // quick-cached blocks keep their pages busy; free slots do not
          for (std::size_t q = (b->address - c->base) / page; q <= (b->address + b->size - 1 - c->base) / page; ++q) {
            ++busy[q];
            if (b->slot && b->pending) gave[q] = true;
          }
        }
        if (b->cached) {
          ++cached;
          if (a->live.find(b->address) != b) return "a cached block is missing from the live map";
          // Note [A slot's ready mark], src/pool/free_slots.hpp.
          if (b->slot && b->ready_mark == c->unready_marks &&
              !c->all_ready((b->address - c->base) / page, (b->address + b->size - 1 - c->base) / page)) {
            return "a free slot's ready mark holds, yet a page under it is not ready";
          }
        } else if (pending.count(b) != 0) {
          if (a->live.find(b->address) != nullptr) return "a pending block is in the live map";
          if (!b->pending) return "a pending block is not marked pending";
        } else if (b->held) {  // freed under a capture, held for its graph: in use, in no map
          used += b->size;
          ++held;
          held_bytes += b->size;
          if (a->live.find(b->address) != nullptr) return "a block held for a graph is in the live map";
          if (b->pending) return "a block held for a graph is marked pending";
        } else {
          ++live;
          used += b->size;
          if (a->live.find(b->address) != b) return "a live block is missing from the live map";
          if (b->pending) return "a live block is marked pending";
          if (b->requested_bytes == 0 || b->requested_bytes > b->size) return "a live block's requested size is wrong";
        }
      }
      if (at != c->base + c->size) return "blocks do not cover their chunk";
      for (std::size_t q = 0; q < busy.size(); ++q) {
        if (c->for_slots) {
          const block* over = c->slot_at[q];
          if (over != nullptr && (!over->slot || over->owner != c || q < (over->address - c->base) / page ||
                                  q >= (over->address + over->size - c->base) / page)) {
            why << "page " << q << " of the segment of slots at " << c->base << " names a slot that is not over it";
            return why.str();
          }
        }
        if ((busy[q] != 0) != c->page_busy(q)) {
          why << "page " << q << " of the segment at " << c->base << " is touched by " << busy[q]
              << " blocks that are not free, its record says " << (c->page_busy(q) ? "busy" : "free");
          return why.str();
        }
        // A pending slot may have given its pages to the stream that freed it.
        if (busy[q] != 0 && !gave[q] && !c->is_ready(q)) return "a page under a block that is not free has no memory of its own";
      }
    }
    if (free_bytes != a->free.bytes() || free_count != a->free.count()) {
      why << "the free index holds " << a->free.count() << " blocks / " << a->free.bytes()
          << " bytes, the chunks " << free_count << " / " << free_bytes;
      return why.str();
    }
    if (cached != a->quick.count() + a->slots.count()) return "the quick and slot caches' counts disagree with the blocks";
    if (a->live.size() != live + cached) return "the live map holds blocks that are not live";
    if (used != a->used_bytes) {
      why << "used_bytes " << a->used_bytes << " but live blocks add up to " << used;
      return why.str();
    }
    if (page == 0 && reserved != a->reserved_bytes) return "an arena's reserved_bytes disagrees with its chunks";
    if (a->fenced_frees > a->frees) return "fenced beyond the free count";
    if (a->settled_frees > a->fenced_frees) return "settled beyond the fences";
  }
  if (held != p.held_for_graphs.count() || held_bytes != p.held_for_graphs.bytes()) {
    why << held << " blocks (" << held_bytes << " bytes) are held for graphs, the pool counts "
        << p.held_for_graphs.count() << " (" << p.held_for_graphs.bytes() << " bytes)";
    return why.str();
  }
  return {};
}

std::string pool_inspector::violations(vmm_pool_resource& pool) {
  using impl = vmm_pool_resource::impl;
  impl& m = *pool.impl_;
  std::lock_guard growing(m.pool.growth_mutex);  // no page moves, is made or goes
  if (std::string v = engine_violations(m.pool, m.page); !v.empty()) return v;
  std::shared_lock arenas_lock(m.pool.arenas_mutex);
  // Every arena's lock at once (the growth mutex's holder may hold several):
  // slots change places by swapping under their arena's lock alone (Note
  // [Reusing a slot on the hot path]), and the handles' records below span arenas.
  std::vector<std::unique_lock<spin_lock>> held;
  for (const auto& [key, a] : m.pool.arenas) held.emplace_back(a->lock);
  std::size_t places = 0;
  for (const auto& [key, a] : m.pool.arenas) {
    std::size_t ready_bytes = 0;
    for (chunk* c : a->chunks) {
      for (std::size_t i = 0; i < c->pages.size(); ++i) {
        if (c->is_mapped(i) != (c->pages[i] != 0)) {
          return "page " + std::to_string(i) + "'s mapped bit disagrees with its handle";
        }
        if (c->pages[i] == 0) {
          if (c->is_ready(i)) return "a page without a handle is marked ready";
          if (c->home_at[i] != nullptr) return "a page without a handle points at a handle's record";
          continue;
        }
        ++places;
        auto it = m.homes.find(c->pages[i]);
        if (it == m.homes.end()) return "a mapped page's handle is not among the pool's handles";
        const impl::page_home& h = it->second;
        if (c->home_at[i] != &it->second) return "a mapped page does not point at its handle's record";
        const impl::page_ref here{c, i};
        const auto listed = std::count(h.places.begin(), h.places.end(), here);
        if (listed != 1) {
          return "page " + std::to_string(i) + " is listed " + std::to_string(listed) +
                 " times among its handle's places, not once";
        }
        if (c->is_ready(i)) {
          if (!(h.primary.load() == here)) return "a ready page is not its handle's primary place";
          ready_bytes += m.page;
        } else if (h.primary.load() == here) {
          return "a page that is not ready is its handle's primary place";
        }
      }
    }
    if (ready_bytes != a->reserved_bytes) {
      return "an arena's reserved_bytes " + std::to_string(a->reserved_bytes) + " disagrees with its ready pages' " +
             std::to_string(ready_bytes);
    }
  }
  std::size_t recorded = 0;
  for (const auto& [handle, h] : m.homes) {
    if (const impl::page_ref p = h.primary.load(); p.c == nullptr || p.c->pages[p.index] != handle) {
      return "a handle's primary place maps another handle";
    }
    for (const auto& place : h.places) {
      if (place.c->pages[place.index] != handle) return "a handle's place maps another handle";
    }
    if (std::find(h.places.begin(), h.places.end(), h.primary.load()) == h.places.end()) {
      return "a handle's primary place is not among its places";
    }
    recorded += h.places.size();
  }
  if (recorded != places) return "the handles' places and the mapped pages disagree";
  if (m.homes.size() * m.page != m.pool.reserved_bytes.load()) return "the pool holds another count of pages than its handles";
  return {};
}

std::size_t pool_inspector::slot_looks(vmm_pool_resource& pool) {
  stream_ordered_pool& p = pool.impl_->pool;
  std::shared_lock arenas_lock(p.arenas_mutex);
  std::size_t looks = 0;
  for (const auto& [key, a] : p.arenas) {
    std::lock_guard lock(a->lock);
    looks += a->slot_looks;
  }
  return looks;
}

pool_inspector::record_bytes pool_inspector::page_records(vmm_pool_resource& pool) {
  stream_ordered_pool& p = pool.impl_->pool;
  std::shared_lock arenas_lock(p.arenas_mutex);
  record_bytes r;
  for (const auto& [key, a] : p.arenas) {
    std::lock_guard lock(a->lock);
    for (const chunk* c : a->chunks) {
      auto add = [&](const auto& records) {
        r.total += records.bytes();
        r.resident += records.resident_bytes();
      };
      add(c->pages);
      add(c->home_at);
      add(c->ready);
      add(c->mapped);
      add(c->busy);
      add(c->uses);
      add(c->slot_at);
    }
  }
  return r;
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
