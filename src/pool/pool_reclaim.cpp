// pool_resource's slow paths: frees on another stream than the allocation's,
// absorbing them, taking other streams' free memory, growing from the upstream,
// and, when memory is short, making every free complete and giving chunks back.
// arena.hpp's note on fencing says why each step is safe.
#include <algorithm>
#include <bit>
#include <tuple>

#include "driver/driver.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "pool/pool_impl.hpp"
#include "text.hpp"

namespace gpumem {

using detail::arena;
using detail::block;
using detail::chunk;

void* pool_resource::impl::allocate_slow(arena& a, std::size_t size, std::size_t requested,
                                         std::size_t alignment, std::size_t need) {
  auto try_own = [&]() -> void* {
    std::lock_guard lock(a.lock);
    block* b = a.free.find(need);
    return b != nullptr ? carve(a, b, size, requested, alignment) : nullptr;
  };
  // 1. This arena's quick cache, coalesced, and the blocks other streams freed back to it.
  {
    std::lock_guard lock(a.lock);
    flush_quick(a);
    if (a.fence_requested.load(std::memory_order_relaxed)) record_fence(a);  // another stream asked
  }
  if (void* p = try_own()) return p;
  if (absorb_pending(a)) {
    if (void* p = try_own()) return p;
  }
  // 2. Other streams' fenced whole free chunks, ordered by an event wait on the device.
  if (opt.reuse_across_streams) {
    if (void* p = take_from_other_arenas(a, size, requested, alignment, need, false)) return p;
  }
  // 3. and 4. run under growth_mutex: one thread at a time grows or gives memory
  // back, so no thread releases a chunk another has just grown and not yet carved,
  // and no thread fails against a maximum because another's growth is in flight.
  std::lock_guard growing(growth_mutex);
  if (void* p = try_own()) return p;  // another thread may have grown or freed meanwhile
  // 3. More from the upstream.
  if (grow(a, need)) {
    if (void* p = try_own()) return p;
  }
  // 4. Memory is short: other streams' fenced free blocks, lent (see arena.hpp's note).
  if (opt.reuse_across_streams) {
    if (void* p = take_from_other_arenas(a, size, requested, alignment, need, true)) return p;
  }
  // 5. Make every free complete (one device synchronisation, off the hot path),
  //    give fully free chunks back, and try everything again.
  synchronize_and_fence_everything();
  if (void* p = try_own()) return p;
  if (void* p = take_from_other_arenas(a, size, requested, alignment, need, true)) return p;
  release_chunks(true);
  if (grow(a, need)) {
    if (void* p = try_own()) return p;
  }
  throw_out_of_memory(requested);
}

void pool_resource::impl::deallocate_foreign(arena& caller, void* ptr, std::size_t bytes) {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  arena* owner = nullptr;
  {
    std::shared_lock dir(chunks_mutex);
    auto it = chunks.upper_bound(address);
    if (it != chunks.begin()) {
      --it;
      if (address < it->first + it->second->size) owner = it->second->owner;
    }
  }
  auto not_ours = [&] {
    return logic_error("gpumem::pool_resource::deallocate: pointer " + detail::pointer_text(ptr) +
                       " was not allocated by this pool, or was already freed");
  };
  if (owner == nullptr || owner == &caller) throw not_ours();  // caller's own live map missed it
  {
    std::lock_guard lock(owner->lock);
    block* b = owner->live.find(address);
    if (b == nullptr || b->cached) throw not_ours();
    if (b->requested_bytes != bytes) {
      throw logic_error("gpumem::pool_resource::deallocate: the allocation has " +
                        std::to_string(b->requested_bytes) + " bytes, not " + std::to_string(bytes));
    }
  }
  CUevent fence = nullptr;
  {
    // Order the free after the caller's stream's work so far.
    std::lock_guard lock(caller.lock);
    record_fence(caller);
    fence = caller.fence;
  }
  std::lock_guard lock(owner->lock);
  block* b = owner->live.find(address);
  if (b == nullptr || b->cached) throw not_ours();  // freed by another thread meanwhile
  owner->live.erase(address);
  owner->used_bytes -= b->size;
  owner->pending.push_back({b, fence, ++owner->pending_sequence});
}

void pool_resource::impl::wait_for(arena& waiter, CUevent fence) {
  if (fence == nullptr) return;  // never recorded: what it covers needed no wait
  detail::device_context_guard guard(device);
  GPUMEM_CU(cuStreamWaitEvent, waiter.stream, fence, 0);
}

bool pool_resource::impl::absorb_pending(arena& a) {
  std::vector<CUevent> fences;
  std::uint64_t upto = 0;
  {
    std::lock_guard lock(a.lock);
    if (a.pending.empty()) return false;
    upto = a.pending_sequence;
    for (const auto& pf : a.pending) {
      if (std::find(fences.begin(), fences.end(), pf.fence) == fences.end()) fences.push_back(pf.fence);
    }
  }
  for (CUevent e : fences) wait_for(a, e);
  std::lock_guard lock(a.lock);
  bool absorbed = false;
  for (std::size_t i = 0; i < a.pending.size();) {
    if (a.pending[i].sequence <= upto) {
      free_into(a, a.pending[i].freed, ++a.frees);
      a.pending[i] = a.pending.back();
      a.pending.pop_back();
      absorbed = true;
    } else {
      ++i;
    }
  }
  if (absorbed) record_fence(a);  // the absorbed blocks become usable by others too
  return absorbed;
}

// `wait`: false while the pool may still grow. Then taking is opportunistic and
// whole chunks only: an arena whose lock is busy (its own threads are allocating)
// is passed over and nothing is coalesced for the taker (but a fenced whole chunk
// found in an arena's quick cache, which a flush of that cache frees), so a miss on
// one stream never queues behind other streams' hot paths (W3), and no block is
// lent, so the streams keep no tie (arena.hpp's note). An arena passed over, or holding a
// fitting free chunk that is not fenced yet, is asked to fence. When memory is
// short (`wait`), every arena is waited for, and fenced free blocks and pending
// frees are lent too.
void* pool_resource::impl::take_from_other_arenas(arena& a, std::size_t size, std::size_t requested,
                                                  std::size_t alignment, std::size_t need, bool wait) {
  auto acquire = [wait](auto& lock) {
    if (wait) {
      lock.lock();
      return true;
    }
    return lock.try_lock();
  };
  std::vector<arena*> others;
  {
    std::shared_lock lock(arenas_mutex);
    for (auto& [key, other] : arenas) {
      if (other.get() != &a) others.push_back(other.get());
    }
  }
  // (a) A whole free, fenced chunk changes owner: no lasting tie between the streams.
  for (arena* s : others) {
    chunk* moved = nullptr;
    CUevent fence = nullptr;
    {
      std::unique_lock dir(chunks_mutex, std::defer_lock);
      if (!acquire(dir)) {
        s->fence_requested.store(true, std::memory_order_relaxed);
        continue;
      }
      std::unique_lock lock(s->lock, std::defer_lock);
      if (!acquire(lock)) {
        s->fence_requested.store(true, std::memory_order_relaxed);
        continue;
      }
      if (wait) flush_quick(*s);
      bool unfenced_fit = false;
      for (std::size_t i = 0; i < s->chunks.size(); ++i) {
        chunk* c = s->chunks[i];
        block* f = c->first;
        if (f->next_in_chunk != nullptr || c->size < need || !(f->free || f->cached)) continue;
        if (!s->is_fenced(f)) {
          unfenced_fit = true;
          continue;
        }
        if (f->cached) flush_quick(*s);  // the whole chunk sits in s's quick cache: free it
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
      wait_for(a, fence);
      std::lock_guard lock(a.lock);
      // Block records may change arenas: slab pages live as long as the pool.
      a.chunks.push_back(moved);
      a.reserved_bytes += moved->size;
      free_into(a, moved->first, ++a.frees);
      block* fit = a.free.find(need);
      return carve(a, fit, size, requested, alignment);
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
        p = carve(*s, b, size, requested, alignment);
        fence = s->fence;
      }
    }
    if (p != nullptr) {
      wait_for(a, fence);
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
        if (b->size >= size && b->address % alignment == 0) {
          taken = b;
          fence = s->pending[i].fence;
          s->pending[i] = s->pending.back();
          s->pending.pop_back();
          taken->requested_bytes = requested;
          s->live.insert(taken->address, taken);
          s->used_bytes += taken->size;
          break;
        }
      }
    }
    if (taken != nullptr) {
      wait_for(a, fence);
      return reinterpret_cast<void*>(taken->address);
    }
  }
  // Nothing fenced to take: ask the others to fence at their next free.
  for (arena* s : others) s->fence_requested.store(true, std::memory_order_relaxed);
  return nullptr;
}

bool pool_resource::impl::grow(arena& a, std::size_t need) {
  const std::size_t held = reserved_bytes.load(std::memory_order_relaxed);
  std::size_t preferred = std::clamp(std::bit_ceil(std::max<std::size_t>(held, 1)),
                                     opt.min_chunk_bytes, opt.max_chunk_bytes);
  const std::size_t need_chunks = (need + opt.min_chunk_bytes - 1) / opt.min_chunk_bytes * opt.min_chunk_bytes;
  preferred = std::max(preferred, need_chunks);
  std::size_t tried = 0;
  for (std::size_t bytes : {preferred, need_chunks, need}) {
    if (bytes == tried) continue;
    tried = bytes;
    const std::size_t before = reserved_bytes.fetch_add(bytes);
    if (opt.maximum_bytes != 0 && before + bytes > opt.maximum_bytes) {
      reserved_bytes.fetch_sub(bytes);
      continue;
    }
    void* p = nullptr;
    try {
      p = upstream->allocate(bytes, stream_view(a.stream));
    } catch (const out_of_memory&) {
      reserved_bytes.fetch_sub(bytes);
      continue;
    } catch (...) {
      reserved_bytes.fetch_sub(bytes);
      throw;
    }
    // Stream-ordered upstreams make the memory valid in a.stream's order: the new
    // block counts as freed on a.stream, so other streams need the next fence.
    std::uint64_t epoch = 0;
    {
      std::lock_guard lock(a.lock);
      epoch = ++a.frees;
    }
    add_chunk(a, reinterpret_cast<std::uintptr_t>(p), bytes, epoch);
    return true;
  }
  return false;
}

void pool_resource::impl::synchronize_and_fence_everything() {
  std::vector<std::tuple<arena*, std::uint64_t, std::uint64_t>> before;
  {
    std::shared_lock lock(arenas_mutex);
    for (auto& [key, a] : arenas) {
      std::lock_guard g(a->lock);
      before.emplace_back(a.get(), a->frees, a->pending_sequence);
    }
  }
  {
    detail::device_context_guard guard(device);
    GPUMEM_CU(cuCtxSynchronize);
  }
  // Everything freed before the synchronisation is complete: fenced for everyone.
  for (auto [a, frees, pending_upto] : before) {
    std::lock_guard g(a->lock);
    flush_quick(*a);
    a->fenced_frees = std::max(a->fenced_frees, frees);
    for (std::size_t i = 0; i < a->pending.size();) {
      if (a->pending[i].sequence <= pending_upto) {
        free_into(*a, a->pending[i].freed, frees);
        a->pending[i] = a->pending.back();
        a->pending.pop_back();
      } else {
        ++i;
      }
    }
  }
}

CUstream pool_resource::impl::maintenance_stream() {
  std::lock_guard lock(maintenance_mutex);
  if (maintenance == nullptr) {
    detail::device_context_guard guard(device);
    GPUMEM_CU(cuStreamCreate, &maintenance, CU_STREAM_NON_BLOCKING);
  }
  return maintenance;
}

std::size_t pool_resource::impl::release_chunks(bool device_synchronized) {
  struct victim {
    std::unique_ptr<chunk> c;
    CUevent fence;
  };
  std::vector<victim> victims;
  {
    std::shared_lock arenas_lock(arenas_mutex);
    std::unique_lock dir(chunks_mutex);
    for (auto& [key, a] : arenas) {
      std::lock_guard g(a->lock);
      flush_quick(*a);
      for (std::size_t i = 0; i < a->chunks.size();) {
        chunk* c = a->chunks[i];
        block* f = c->first;
        if (f->free && f->next_in_chunk == nullptr && (device_synchronized || a->is_fenced(f))) {
          a->free.remove(f);
          a->slab.recycle(f);
          a->reserved_bytes -= c->size;
          a->chunks[i] = a->chunks.back();
          a->chunks.pop_back();
          auto node = chunks.extract(c->base);
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
    if (v.fence != nullptr && detail::driver().cuEventQuery(v.fence) != CUDA_SUCCESS) {
      // Ordered after the frees on the device; the host does not wait.
      CUstream ms = maintenance_stream();
      GPUMEM_CU(cuStreamWaitEvent, ms, v.fence, 0);
      upstream->deallocate(base, v.c->size, stream_view(ms));
    } else {
      upstream->deallocate_sync(base, v.c->size);
    }
    reserved_bytes.fetch_sub(v.c->size);
    released += v.c->size;
  }
  return released;
}

pool_statistics pool_resource::impl::collect() {
  pool_statistics s;
  std::shared_lock lock(arenas_mutex);
  for (auto& [key, a] : arenas) {
    std::lock_guard g(a->lock);
    flush_quick(*a);  // report coalesced blocks, as they are after any slow path
    s.used_bytes += a->used_bytes;
    s.reserved_bytes += a->reserved_bytes;
    s.free_bytes += a->free.bytes();
    s.free_blocks += a->free.count();
    s.largest_free_block = std::max(s.largest_free_block, a->free.largest());
    s.allocations += a->live.size();
    s.chunks += a->chunks.size();
    for (const auto& pf : a->pending) {
      s.free_bytes += pf.freed->size;
      ++s.free_blocks;
    }
  }
  s.streams = arenas.size();
  return s;
}

void pool_resource::impl::throw_out_of_memory(std::size_t requested) {
  const pool_statistics s = collect();
  const memory_info m = device_memory_info(device);
  std::string why = "the pool holds " + std::to_string(s.reserved_bytes) + " bytes from its upstream, " +
                    std::to_string(s.free_bytes) + " of them free, the largest free block " +
                    std::to_string(s.largest_free_block) + " bytes";
  if (opt.maximum_bytes != 0) why += ", maximum_bytes " + std::to_string(opt.maximum_bytes);
  why += "; the upstream could not provide more";
  if (s.free_bytes >= requested) {
    why += ". Enough memory is free in the pool but scattered (fragmentation): "
           "a virtual-memory pool maps scattered free memory into one range";
  }
  throw out_of_memory({.requested_bytes = requested, .device = device, .resource = "pool_resource",
                       .resource_held_bytes = s.reserved_bytes, .device_free_bytes = m.free_bytes,
                       .device_total_bytes = m.total_bytes, .reason = why});
}

}  // namespace gpumem
