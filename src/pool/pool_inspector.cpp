// pool_inspector (pool_inspector.hpp).
#include "pool/pool_inspector.hpp"

#include <sstream>
#include <unordered_set>

#include "pool/pool_impl.hpp"

namespace gpumem::detail {

std::string pool_inspector::violations(pool_resource& pool) {
  stream_ordered_pool& p = pool.impl_->pool;
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
  if (reserved_total != p.reserved_bytes.load()) {
    why << "reserved_bytes " << p.reserved_bytes.load() << " but chunks add up to " << reserved_total;
    return why.str();
  }

  for (const auto& [key, a] : p.arenas) {
    std::lock_guard lock(a->lock);
    std::size_t free_bytes = 0, free_count = 0, used = 0, live = 0, cached = 0, reserved = 0;
    std::unordered_set<const block*> pending;
    for (const auto& pf : a->pending) pending.insert(pf.freed);
    for (const chunk* c : a->chunks) {
      if (c->owner != a.get()) return "an arena lists a chunk it does not own";
      reserved += c->size;
      std::uintptr_t at = c->base;
      const block* prev = nullptr;
      for (const block* b = c->first; b != nullptr; prev = b, b = b->next_in_chunk) {
        if (b->owner != c) return "a block points at the wrong chunk";
        if (b->prev_in_chunk != prev) return "broken prev link in a chunk";
        if (b->address != at) return "blocks do not tile their chunk (gap or overlap)";
        if (b->size == 0 || b->size % stream_ordered_pool::granule != 0) return "block size not a granule multiple";
        at += b->size;
        if (b->free) {
          if (b->cached) return "a block is both free and cached";
          if (prev != nullptr && prev->free) return "two free neighbours were not merged";
          free_bytes += b->size;
          ++free_count;
          if (a->live.find(b->address) != nullptr) return "a free block is in the live map";
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
    }
    if (free_bytes != a->free.bytes() || free_count != a->free.count()) {
      why << "the free index holds " << a->free.count() << " blocks / " << a->free.bytes()
          << " bytes, the chunks " << free_count << " / " << free_bytes;
      return why.str();
    }
    if (cached != a->quick.count()) return "the quick cache count disagrees with the blocks";
    if (a->live.size() != live + cached) return "the live map holds blocks that are not live";
    if (used != a->used_bytes) {
      why << "used_bytes " << a->used_bytes << " but live blocks add up to " << used;
      return why.str();
    }
    if (reserved != a->reserved_bytes) return "an arena's reserved_bytes disagrees with its chunks";
    if (a->fenced_frees > a->frees) return "fenced beyond the free count";
  }
  return {};
}

std::size_t pool_inspector::live_requested_bytes(const pool_resource& pool, const void* ptr) {
  const stream_ordered_pool& p = pool.impl_->pool;
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  std::shared_lock chunks_lock(p.chunks_mutex);
  auto it = p.chunks.upper_bound(address);
  if (it == p.chunks.begin()) return 0;
  --it;
  if (address >= it->first + it->second->size) return 0;
  arena& a = *it->second->owner;
  std::lock_guard lock(a.lock);
  const block* b = a.live.find(address);
  return b != nullptr && !b->cached ? b->requested_bytes : 0;
}

}  // namespace gpumem::detail
