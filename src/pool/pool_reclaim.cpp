// pool_resource's backing (pool_impl.hpp): growing from the upstream, taking
// other streams' whole free chunks or lending their blocks, and giving fully free
// chunks back to the upstream. arena.hpp's note on fencing says why each step is
// safe; the engine (stream_ordered_pool.cpp) decides when each runs.
#include <algorithm>
#include <bit>

#include "driver/capture_interaction.hpp"
#include "driver/driver.hpp"
#include "gpumem/error.hpp"
#include "pool/pool_impl.hpp"

namespace gpumem {

using detail::arena;
using detail::block;
using detail::chunk;

// `wait`: false while the pool may still grow. Then taking is opportunistic and
// whole chunks only: an arena whose lock is busy (its own threads are allocating)
// is passed over and nothing is coalesced for the taker (but a fenced whole chunk
// found in an arena's quick cache, which a flush of that cache frees), so a miss on
// one stream never queues behind other streams' hot paths (W3), and no block is
// lent, so the streams keep no tie (arena.hpp's note). An arena passed over, or holding a
// fitting free chunk that is not fenced yet, is asked to fence. When memory is
// short (`wait`), every arena is waited for, and fenced free blocks and pending
// frees are lent too.
void* pool_resource::impl::take_from_others(arena& a, const detail::pool_request& r, bool wait) {
  const std::size_t need = r.need;
  auto acquire = [wait](auto& lock) {
    if (wait) {
      lock.lock();
      return true;
    }
    return lock.try_lock();
  };
  const std::vector<arena*> others = pool.arenas_except(&a);
  // (a) A whole free, fenced chunk changes owner: no lasting tie between the streams.
  for (arena* s : others) {
    chunk* moved = nullptr;
    CUevent fence = nullptr;
    {
      std::unique_lock dir(pool.chunks_mutex, std::defer_lock);
      if (!acquire(dir)) {
        s->fence_requested.store(true, std::memory_order_relaxed);
        continue;
      }
      std::unique_lock lock(s->lock, std::defer_lock);
      if (!acquire(lock)) {
        s->fence_requested.store(true, std::memory_order_relaxed);
        continue;
      }
      if (wait) pool.flush_quick(*s);
      bool unfenced_fit = false;
      for (std::size_t i = 0; i < s->chunks.size(); ++i) {
        chunk* c = s->chunks[i];
        block* f = c->first;
        if (f->next_in_chunk != nullptr || c->size < need || !(f->free || f->cached)) continue;
        if (!s->is_fenced(f)) {
          unfenced_fit = true;
          continue;
        }
        if (f->cached) pool.flush_quick(*s);  // the whole chunk sits in s's quick cache: free it
        s->free.remove(f);
        s->chunks[i] = s->chunks.back();
        s->chunks.pop_back();
        s->reserved_bytes -= c->size;
        c->owner = &a;
        moved = c;
        fence = s->fence;
        break;
      }
      if (moved == nullptr && unfenced_fit) s->fence_requested.store(true, std::memory_order_relaxed);
    }
    if (moved != nullptr) {
      pool.wait_for(a, fence);
      std::lock_guard lock(a.lock);
      // Block records may change arenas: slab pages live as long as the pool.
      a.chunks.push_back(moved);
      a.reserved_bytes += moved->size;
      pool.free_into(a, moved->first, ++a.frees);
      block* fit = a.free.find(need);
      return reinterpret_cast<void*>(pool.carve(a, fit, r.size, r.requested, r.alignment)->address);
    }
  }
  if (!wait) return nullptr;
  // (b) Lend a fenced free block: it stays in its chunk's arena, handed out to this stream.
  for (arena* s : others) {
    void* p = nullptr;
    CUevent fence = nullptr;
    {
      std::unique_lock lock(s->lock, std::defer_lock);
      if (!acquire(lock)) continue;
      block* b = s->free.find_if(need, [s](const block* x) { return s->is_fenced(x); });
      if (b != nullptr) {
        p = reinterpret_cast<void*>(pool.carve(*s, b, r.size, r.requested, r.alignment)->address);
        fence = s->fence;
      }
    }
    if (p != nullptr) {
      pool.wait_for(a, fence);
      return p;
    }
  }
  // (c) A block another stream freed that its owner has not absorbed yet, taken whole.
  for (arena* s : others) {
    block* taken = nullptr;
    CUevent fence = nullptr;
    {
      std::unique_lock lock(s->lock, std::defer_lock);
      if (!acquire(lock)) continue;
      for (std::size_t i = 0; i < s->pending.size(); ++i) {
        block* b = s->pending[i].freed;
        if (b->size >= r.size && b->address % r.alignment == 0) {
          taken = b;
          taken->pending = false;
          fence = s->pending[i].fence;
          s->pending[i] = s->pending.back();
          s->pending.pop_back();
          taken->requested_bytes = r.requested;
          s->live.insert(taken->address, taken);
          s->used_bytes += taken->size;
          break;
        }
      }
    }
    if (taken != nullptr) {
      pool.wait_for(a, fence);
      return reinterpret_cast<void*>(taken->address);
    }
  }
  // Nothing fenced to take: ask the others to fence at their next free.
  for (arena* s : others) s->fence_requested.store(true, std::memory_order_relaxed);
  return nullptr;
}

bool pool_resource::impl::grow(arena& a, std::size_t need, bool /*memory_short*/) {
  const std::size_t held = pool.reserved_bytes.load(std::memory_order_relaxed);
  std::size_t preferred = std::clamp(std::bit_ceil(std::max<std::size_t>(held, 1)),
                                     opt.min_chunk_bytes, opt.max_chunk_bytes);
  const std::size_t need_chunks = (need + opt.min_chunk_bytes - 1) / opt.min_chunk_bytes * opt.min_chunk_bytes;
  preferred = std::max(preferred, need_chunks);
  std::size_t tried = 0;
  for (std::size_t bytes : {preferred, need_chunks, need}) {
    if (bytes == tried) continue;
    tried = bytes;
    const std::size_t before = pool.reserved_bytes.fetch_add(bytes);
    if (opt.maximum_bytes != 0 && before + bytes > opt.maximum_bytes) {
      pool.reserved_bytes.fetch_sub(bytes);
      continue;
    }
    void* p = nullptr;
    try {
      p = upstream->allocate(bytes, stream_view(a.stream));
    } catch (const out_of_memory&) {
      pool.reserved_bytes.fetch_sub(bytes);
      continue;
    } catch (...) {
      pool.reserved_bytes.fetch_sub(bytes);
      throw;
    }
    // Stream-ordered upstreams make the memory valid in a.stream's order: the new
    // block counts as freed on a.stream, so other streams need the next fence.
    std::uint64_t epoch = 0;
    {
      std::lock_guard lock(a.lock);
      epoch = ++a.frees;
    }
    pool.add_chunk(a, reinterpret_cast<std::uintptr_t>(p), bytes, epoch);
    pool.note_reserved();
    return true;
  }
  return false;
}

std::size_t pool_resource::impl::give_back(bool device_synchronized) {
  struct victim {
    std::unique_ptr<chunk> c;
    CUevent fence;
  };
  std::vector<victim> victims;
  {
    std::shared_lock arenas_lock(pool.arenas_mutex);
    std::unique_lock dir(pool.chunks_mutex);
    for (auto& [key, a] : pool.arenas) {
      std::lock_guard g(a->lock);
      pool.flush_quick(*a);
      for (std::size_t i = 0; i < a->chunks.size();) {
        chunk* c = a->chunks[i];
        block* f = c->first;
        if (f->free && f->next_in_chunk == nullptr && (device_synchronized || a->is_fenced(f))) {
          a->free.remove(f);
          a->slab.recycle(f);
          a->reserved_bytes -= c->size;
          a->chunks[i] = a->chunks.back();
          a->chunks.pop_back();
          auto node = pool.chunks.extract(c->base);
          victims.push_back({std::move(node.mapped()), device_synchronized ? nullptr : a->fence});
        } else {
          ++i;
        }
      }
    }
  }
  std::size_t released = 0;
  for (victim& v : victims) {
    void* base = reinterpret_cast<void*>(v.c->base);
    // A fence already complete needs no ordering: the upstream gets the chunk as
    // memory whose use is over (and may give it back to the device at once).
    bool complete = v.fence == nullptr;
    if (!complete) {
      detail::relaxed_capture_interaction relaxed;  // Note [Calls a capture elsewhere forbids]
      complete = detail::driver().cuEventQuery(v.fence) == CUDA_SUCCESS;
    }
    if (!complete) {
      // Ordered after the frees on the device; the host does not wait.
      CUstream ms = pool.maintenance_stream();
      GPUMEM_CU(cuStreamWaitEvent, ms, v.fence, 0);
      upstream->deallocate(base, v.c->size, stream_view(ms));
    } else {
      upstream->deallocate_sync(base, v.c->size);
    }
    pool.reserved_bytes.fetch_sub(v.c->size);
    released += v.c->size;
  }
  return released;
}

std::string pool_resource::impl::shortage(std::size_t requested) {
  const detail::pool_totals s = pool.collect();
  std::string why = "the pool holds " + std::to_string(s.reserved_bytes) + " bytes from its upstream, " +
                    std::to_string(s.free_bytes) + " of them free, the largest free block " +
                    std::to_string(s.largest_free_block) + " bytes";
  if (opt.maximum_bytes != 0) why += ", maximum_bytes " + std::to_string(opt.maximum_bytes);
  why += "; the upstream could not provide more";
  if (s.free_bytes >= requested) {
    why += ". Enough memory is free in the pool but scattered (fragmentation): "
           "a virtual-memory pool maps scattered free memory into one range";
  }
  return why;
}

}  // namespace gpumem
