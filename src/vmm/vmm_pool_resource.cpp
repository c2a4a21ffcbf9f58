// vmm_pool_resource: one address reservation, a best-fit sub-allocator over the
// addresses, stream ordering, and the per-stream fronts of the hot path. The
// physical side (handles, moving them, giving them back) is in
// vmm_pool_physical.cpp. See the notes below and docs/vmm.md.
#include "gpumem/vmm_pool_resource.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>

#include "driver/driver.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "pool/pool_inspector.hpp"
#include "stream_device.hpp"
#include "vmm/vmm_pool_impl.hpp"

namespace gpumem {
namespace vm = detail::vmm;
using detail::device_context_guard;
using detail::driver;
using detail::validate_device;

// Note [Why a single-lock best-fit allocator, not pool_resource's arenas]
// pool_resource's per-stream arenas own their upstream chunks: a block never
// spans two chunks, and a fragmented arena cannot hand its scattered free space to
// one request. Here the whole pool is one address range, and what decides whether
// a request fits is physical memory, which moves between addresses. So the
// sub-allocator works on addresses (a best-fit index over free ranges of the one
// reservation; the reservation is twice the device's memory, so an address range
// that fits practically always exists), and physical handles follow the blocks:
// mapped under a block when it is carved, moved away from free ranges when
// another request needs them. Both decisions need a view of the whole pool, hence
// one lock. The hot path avoids it: a stream's repeated sizes are served by its
// front (Note [The per-stream front] in vmm_pool_front.hpp). Stream ordering
// follows pool_resource's fencing rules (src/pool/arena.hpp): reuse on the
// freeing stream at once, on another stream only after a device-side wait on
// the freeing stream's fence. Small requests are the exception: arenas over
// ranges this allocator lends them (Note [Arenas over lent ranges] in
// vmm_pool_arenas.cpp).
//
// Note [When a physical handle may be unmapped]
// cuMemUnmap does not wait for work in flight. A handle's mapping is unmapped
// (to be released, or moved under another request) only when its whole address
// range lies in one free block whose frees the host has seen complete
// ("settled"): the freeing stream's fence event, recorded after the free,
// answered cuEventQuery (or cuEventSynchronize on the slow path, or the device
// was synchronised). Free blocks still pending on a stream are never unmapped;
// they stay reusable on that stream at once and on others after a fence wait on
// the device. Blocks cached in a front are allocated as far as this is concerned.
//
// Note [Mapped free ranges first]
// A free block is either mapped whole (a handle under every page: blk::mapped)
// or not at all, and the two kinds sit in separate best-fit indexes
// (free_mapped, free_unmapped); neighbours of different kinds never merge. A
// request takes the best fit among mapped free blocks, which needs no driver
// call, no look at the handles and no flush of the fronts: the hot path of a
// churning workload whose sizes rarely repeat (W2). Only when no mapped free
// block fits (the genuine slow path) are the fronts flushed (their blocks may
// fit) and unmapped addresses carved, and map_range() maps them, creating or
// moving handles as before. Whenever handles are mapped, unmapped or moved,
// refresh_mapped() re-derives the kind of the free blocks there from `maps`,
// splitting them at the handles' edges. Unmapped free blocks are always settled
// (memory is unmapped only under settled free blocks, and unmapped addresses are
// never handed out before they are mapped), so they merge freely. The price of
// not merging across the kinds: a request larger than every mapped free block
// maps fresh addresses even when a mapped free block next to unmapped ones
// would have covered part of it; that memory is found again by later requests,
// or moved to where it is needed when the device runs short.

namespace {

std::atomic<std::uint64_t> next_pool_id{1};

struct front_lookup {
  std::uint64_t pool_id = 0;
  CUstream key = nullptr;
  detail::vmm::stream_front* front = nullptr;
};
thread_local front_lookup last_front __attribute__((tls_model("initial-exec")));

CUstream key_of(CUstream s) noexcept { return s == nullptr ? CU_STREAM_LEGACY : s; }

bool is_default_stream(CUstream s) noexcept {
  return s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

}  // namespace

vmm_pool_resource::impl::impl(int dev, vmm_pool_options o) : device(dev), opt(std::move(o)), id(next_pool_id++) {
  validate_device(dev, "vmm_pool_resource");
  for (int p : opt.peer_devices) validate_device(p, "vmm_pool_resource peer_devices");
  if (opt.fence_interval == 0) throw logic_error("vmm_pool_resource: fence_interval must be at least 1");
  const std::size_t g = vm::granularity(dev);
  gran = vm::round_up(std::max(opt.chunk_bytes, g), g);
  opt.max_handle_bytes = vm::round_up(std::max(opt.max_handle_bytes, gran), gran);
  fast_free = opt.release_threshold_bytes == std::numeric_limits<std::size_t>::max();
  device_total = device_memory_info(dev).total_bytes;
  // Before the reservation: a bad option leaves nothing behind.
  if (opt.arena_max_bytes > device_total || opt.arena_chunk_bytes > device_total) {
    throw logic_error("vmm_pool_resource: arena_max_bytes (" + std::to_string(opt.arena_max_bytes) +
                      ") and arena_chunk_bytes (" + std::to_string(opt.arena_chunk_bytes) +
                      ") must not exceed the device's memory (" + std::to_string(device_total) + " bytes)");
  }
  address_bytes = vm::round_up(opt.address_bytes != 0 ? opt.address_bytes : 2 * device_total, gran);
  base = vm::reserve(dev, address_bytes, 0, gran);
  if (base == 0) {
    throw out_of_memory(out_of_memory_info{.requested_bytes = address_bytes, .device = dev,
                                           .resource = "vmm_pool_resource",
                                           .reason = "cannot reserve the pool's address range"});
  }
  blocks.emplace(base, blk{.size = address_bytes});
  free_unmapped.emplace(address_bytes, base);
  if (opt.refuse_capture && opt.watch_captures) {
    watch = std::make_unique<capture_watch>();
    watched = !watch->source().empty();
  }
  make_arenas();
}

vmm_pool_resource::impl::~impl() {
  try {
    arenas.reset();  // gives every lent range back (after a device synchronisation)
    device_context_guard g(device);
    GPUMEM_CU(cuCtxSynchronize);
    {
      std::lock_guard lock(mutex);
      flush_fronts();
      if (live != 0) {
        std::fprintf(stderr,
                     "gpumem: vmm_pool_resource on device %d destroyed with %zu live allocation(s), %zu bytes\n",
                     device, live, used);
      }
    }
    release_everything();
    vm::free_addresses(device, base, address_bytes);
    for (auto& [s, f] : fronts) {
      if (f->event != nullptr) driver().cuEventDestroy(f->event);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpumem: vmm_pool_resource: giving memory back failed: %s\n", e.what());
  }
}

// ---- fronts ----

vmm_pool_resource::impl::front& vmm_pool_resource::impl::front_for(stream_view s) {
  const CUstream key = key_of(s.handle());
  const front_lookup& c = last_front;
  if (c.pool_id == id && c.key == key) [[likely]] {
    return *c.front;
  }
  return find_front(key, s);
}

vmm_pool_resource::impl::front& vmm_pool_resource::impl::find_front(CUstream key, stream_view s) {
  front* found = nullptr;
  {
    std::shared_lock lock(fronts_mutex);
    if (auto it = fronts.find(key); it != fronts.end()) found = it->second.get();
  }
  if (found == nullptr) {
    // First sight of this stream. Its capture state first: other driver calls on a
    // capturing stream fail and invalidate the program's capture (and so the
    // capture watch learns of a capture that began before it). Then its device.
    if (opt.refuse_capture && detail::new_stream_is_capturing(s.handle(), device)) {
      detail::throw_capturing("vmm_pool_resource", "allocate or deallocate", s.handle());
    }
    if (!is_default_stream(s.handle()) && s.device() != device) {
      throw logic_error("vmm_pool_resource on device " + std::to_string(device) + ": a stream of device " +
                        std::to_string(s.device()) + " was given");
    }
    std::unique_lock lock(fronts_mutex);
    auto& slot = fronts[key];
    if (!slot) slot = std::make_unique<front>(key, key != CU_STREAM_PER_THREAD);
    found = slot.get();
    if (fronts.size() > 1) several_streams.store(true, std::memory_order_relaxed);
  }
  last_front = front_lookup{id, key, found};
  return *found;
}

void vmm_pool_resource::impl::flush_front(front& f) {
  std::lock_guard fl(f.lock);
  f.cache.drain([&](std::uintptr_t a, std::size_t size, std::uint64_t epoch) {
    f.live.erase(a);
    auto it = blocks.find(a);
    blk& b = it->second;
    b.owner = nullptr;
    b.free = true;
    b.mapped = true;  // a block handed out is mapped whole
    b.pending = true;
    b.freed_on = &f;
    b.epoch = epoch;
    used -= size;
    --live;
    insert_free(a, b);
    coalesce(it);
  });
}

void vmm_pool_resource::impl::flush_fronts() {
  std::shared_lock lock(fronts_mutex);
  for (auto& [s, f] : fronts) flush_front(*f);
}

// ---- blocks ----

// Two free neighbours merge when their frees are interchangeable: both settled,
// or pending on the same stream and on the same side of its last fence (the
// later epoch then stands for both without delaying the older one's settling).
bool vmm_pool_resource::impl::mergeable(const blk& x, const blk& y) const {
  if (!x.free || !y.free || x.mapped != y.mapped) return false;
  if (!x.pending || !y.pending) return !x.pending && !y.pending;
  if (x.freed_on != y.freed_on) return false;
  const std::uint64_t fenced = x.freed_on->fenced;
  return (x.epoch <= fenced) == (y.epoch <= fenced);
}

vmm_pool_resource::impl::block_iter vmm_pool_resource::impl::coalesce(block_iter it) {
  auto next = std::next(it);
  if (next != blocks.end() && mergeable(it->second, next->second)) {
    erase_free(next->first, next->second);
    erase_free(it->first, it->second);
    it->second.size += next->second.size;
    it->second.epoch = std::max(it->second.epoch, next->second.epoch);
    blocks.erase(next);
    insert_free(it->first, it->second);
  }
  if (it != blocks.begin()) {
    auto prev = std::prev(it);
    if (mergeable(prev->second, it->second)) {
      erase_free(prev->first, prev->second);
      erase_free(it->first, it->second);
      prev->second.size += it->second.size;
      prev->second.epoch = std::max(prev->second.epoch, it->second.epoch);
      blocks.erase(it);
      insert_free(prev->first, prev->second);
      return prev;
    }
  }
  return it;
}

void vmm_pool_resource::impl::record_fence(front& f) {
  device_context_guard g(device);
  if (f.event == nullptr) GPUMEM_CU(cuEventCreate, &f.event, CU_EVENT_DISABLE_TIMING);
  std::lock_guard fl(f.lock);
  GPUMEM_CU(cuEventRecord, f.event, f.stream);
  f.fenced = f.frees.load(std::memory_order_acquire);
  f.unfenced = 0;
  f.requested.store(false, std::memory_order_relaxed);
}

// Marks pending blocks whose frees the host has seen complete as settled and
// merges them. With wait: fences the caller's stream and waits for every fence
// (those streams' work only). With device_synchronized: every free is complete.
void vmm_pool_resource::impl::settle(bool wait, front* caller, bool device_synchronized) {
  if (wait && caller != nullptr && caller->frees.load(std::memory_order_acquire) > caller->fenced) {
    record_fence(*caller);
  }
  {
    std::shared_lock lock(fronts_mutex);
    for (auto& [s, fp] : fronts) {
      front& f = *fp;
      if (device_synchronized) {
        f.completed = f.frees.load(std::memory_order_acquire);
        continue;
      }
      if (f.fenced <= f.completed || f.event == nullptr) continue;
      if (wait) {
        GPUMEM_CU(cuEventSynchronize, f.event);
        f.completed = f.fenced;
      } else if (driver().cuEventQuery(f.event) == CUDA_SUCCESS) {
        f.completed = f.fenced;
      }
    }
  }
  for (auto& [a, b] : blocks) {
    if (b.free && b.pending && b.freed_on->completed >= b.epoch) b.pending = false;
  }
  for (auto it = blocks.begin(); it != blocks.end();) {
    if (it->second.free) it = coalesce(it);
    ++it;
  }
}

bool vmm_pool_resource::impl::range_settled_free(std::uintptr_t at, std::size_t bytes) const {
  auto it = blocks.upper_bound(at);
  --it;
  return settled(it->second) && it->first + it->second.size >= at + bytes;
}

// A free block usable by stream t for `size` bytes at `alignment`; sets *wait_on
// when t must wait for the freeing stream's fence first.
vmm_pool_resource::impl::block_iter vmm_pool_resource::impl::find_usable(const free_set& in, std::size_t size,
                                                                        std::size_t alignment, front& t,
                                                                        CUevent* wait_on) {
  *wait_on = nullptr;
  const std::size_t search = size + (alignment > granule ? alignment - granule : 0);
  for (auto fit = in.lower_bound({search, 0}); fit != in.end(); ++fit) {
    auto it = blocks.find(fit->second);
    if (usable(it->second, t, wait_on)) return it;
  }
  return blocks.end();
}

bool vmm_pool_resource::impl::usable(blk& b, front& t, CUevent* wait_on) {
  if (!b.pending || b.freed_on == &t) return true;
  front& f = *b.freed_on;
  if (f.fenced >= b.epoch && f.event != nullptr) {
    *wait_on = f.event;
    return true;
  }
  f.requested.store(true, std::memory_order_relaxed);  // fence at that stream's next free
  return false;
}

vmm_pool_resource::impl::block_iter vmm_pool_resource::impl::find_mapped(std::size_t size, std::size_t alignment,
                                                                        front& t, CUevent* wait_on) {
  *wait_on = nullptr;
  const std::size_t search = size + (alignment > granule ? alignment - granule : 0);
  blk* b = free_mapped.find_accepted(search, [&](blk* c) { return usable(*c, t, wait_on); });
  return b == nullptr ? blocks.end() : blocks.find(b->addr);
}

vmm_pool_resource::impl::block_iter vmm_pool_resource::impl::find_any(std::size_t size, std::size_t alignment,
                                                                     front& t, CUevent* wait_on) {
  auto it = find_mapped(size, alignment, t, wait_on);
  if (it != blocks.end()) return it;
  it = find_joined(size, alignment);
  return it != blocks.end() ? it : find_usable(free_unmapped, size, alignment, t, wait_on);
}

// The best fit among runs of settled free blocks that hold unmapped addresses:
// an unmapped block with its mapped neighbours, joined into one (partly mapped)
// free block so that the request uses what is mapped there and maps the rest.
// Unmapped blocks are few (they merge: all settled), so this walks them all.
vmm_pool_resource::impl::block_iter vmm_pool_resource::impl::find_joined(std::size_t size, std::size_t alignment) {
  block_iter best = blocks.end();
  std::uintptr_t best_start = 0;
  std::size_t best_size = std::numeric_limits<std::size_t>::max();
  for (const auto& [usize, a] : free_unmapped) {
    if (usize >= best_size) break;  // every run holding this block is larger
    auto u = blocks.find(a);
    if (!settled(u->second)) continue;
    std::uintptr_t start = a;
    std::size_t run = usize;
    block_iter first = u;
    if (u != blocks.begin()) {
      auto p = std::prev(u);
      if (settled(p->second) && p->second.mapped) {
        first = p;
        start = p->first;
        run += p->second.size;
      }
    }
    if (auto n = std::next(u); n != blocks.end() && settled(n->second) && n->second.mapped) run += n->second.size;
    const std::uintptr_t at = (start + alignment - 1) / alignment * alignment;
    if (at + size <= start + run && run < best_size) {
      best = first;
      best_start = start;
      best_size = run;
    }
  }
  if (best == blocks.end()) return best;
  // Join the run into one block (refresh_mapped() splits what the request leaves).
  auto it = best;
  erase_free(it->first, it->second);
  while (it->second.size < best_size) {
    auto n = std::next(it);
    erase_free(n->first, n->second);
    it->second.size += n->second.size;
    blocks.erase(n);
  }
  it->second.mapped = false;
  it->second.joined = true;
  insert_free(best_start, it->second);
  return it;
}

std::uintptr_t vmm_pool_resource::impl::carve(block_iter it, std::size_t size, std::size_t alignment,
                                              std::size_t requested) {
  const std::uintptr_t at = (it->first + alignment - 1) / alignment * alignment;
  const std::uintptr_t run = it->first;
  const std::size_t run_bytes = it->second.size;
  const bool joined = it->second.joined;
  it = split_out(it, at, size);
  erase_free(it->first, it->second);
  it->second = blk{.size = size, .requested = requested, .free = false};
  if (joined) {
    // What is left of a joined run: mapped and unmapped parts apart again.
    if (at > run) refresh_mapped(run, at - run);
    if (at + size < run + run_bytes) refresh_mapped(at + size, run + run_bytes - (at + size));
  }
  return at;
}

vmm_pool_resource::impl::block_iter vmm_pool_resource::impl::split_out(block_iter it, std::uintptr_t at,
                                                                       std::size_t bytes) {
  const std::uintptr_t start = it->first;
  erase_free(start, it->second);
  const blk b = it->second;
  if (at > start) {
    it->second.size = at - start;
    insert_free(start, it->second);
    blk mid = b;
    mid.size = bytes;
    it = blocks.emplace_hint(std::next(it), at, mid);
  } else {
    it->second.size = bytes;
  }
  const std::size_t rest = start + b.size - (at + bytes);
  if (rest > 0) {
    blk tail = b;
    tail.size = rest;
    auto t = blocks.emplace_hint(std::next(it), at + bytes, tail);
    insert_free(t->first, t->second);
  }
  insert_free(it->first, it->second);
  return it;
}

// Gives a block carved for a request that then failed back as settled free space
// (what the request mapped before it failed stays mapped: split accordingly).
void vmm_pool_resource::impl::uncarve(std::uintptr_t at) {
  auto it = blocks.find(at);
  it->second.free = true;
  it->second.pending = false;
  it->second.mapped = false;
  insert_free(it->first, it->second);
  split_by_mapping(it);
}

vmm_pool_resource::impl::block_iter vmm_pool_resource::impl::split_by_mapping(block_iter it) {
  const std::uintptr_t start = it->first;
  erase_free(start, it->second);
  const blk orig = it->second;
  const std::uintptr_t end = start + orig.size;
  auto mp = maps.upper_bound(start);
  if (mp != maps.begin() && std::prev(mp)->first + std::prev(mp)->second.bytes > start) --mp;
  block_iter first = it;
  block_iter last = it;
  for (std::uintptr_t cur = start; cur < end;) {
    bool m = false;
    std::uintptr_t run_end = end;
    if (mp != maps.end() && mp->first <= cur) {
      m = true;
      run_end = mp->first + mp->second.bytes;
      for (++mp; mp != maps.end() && mp->first == run_end && run_end < end; ++mp) run_end += mp->second.bytes;
    } else if (mp != maps.end()) {
      run_end = mp->first;
    }
    run_end = std::min(run_end, end);
    blk piece = orig;
    piece.joined = false;
    piece.size = run_end - cur;
    piece.mapped = m;
    if (cur == start) {
      it->second = piece;
    } else {
      last = blocks.emplace_hint(std::next(last), cur, piece);
    }
    insert_free(cur, last->second);
    cur = run_end;
  }
  // Neighbouring runs differ in `mapped`: only the ends can merge with what is outside.
  if (last != first) coalesce(last);
  return coalesce(first);
}

void vmm_pool_resource::impl::refresh_mapped(std::uintptr_t at, std::size_t bytes) {
  for (std::uintptr_t cur = at; cur < at + bytes;) {
    auto it = std::prev(blocks.upper_bound(cur));
    const std::uintptr_t next = it->first + it->second.size;
    if (it->second.free) split_by_mapping(it);
    cur = next;
  }
}

std::size_t vmm_pool_resource::impl::largest_free() const {
  std::size_t best = 0;
  std::size_t run = 0;
  std::uintptr_t run_end = 0;
  for (const auto& [a, b] : blocks) {
    if (!b.free) {
      run = 0;
      continue;
    }
    run = (run != 0 && run_end == a ? run : 0) + b.size;
    run_end = a + b.size;
    best = std::max(best, run);
  }
  return best;
}

// ---- the resource ----

vmm_pool_resource::vmm_pool_resource(int device, vmm_pool_options options)
    : impl_(std::make_unique<impl>(device, std::move(options))) {}

vmm_pool_resource::~vmm_pool_resource() = default;

void* vmm_pool_resource::do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) {
  impl& m = *impl_;
  if (m.serves_in_arenas(bytes)) [[likely]] {
    try {
      return m.arenas->do_allocate(bytes, stream, alignment);  // checks the capture state itself
    } catch (const out_of_memory& e) {
      m.throw_arena_oom(bytes, e);
    }
  }
  if (m.opt.refuse_capture && detail::stream_is_capturing(stream.handle(), m.device, m.watched)) [[unlikely]] {
    detail::throw_capturing("vmm_pool_resource", "allocate", stream.handle());
  }
  try {
    return m.allocate_core(bytes, stream, alignment, false);
  } catch (const out_of_memory&) {
    // The arenas' wholly free ranges may be what is missing: they give them
    // back (after one device synchronisation, as the core's own last resort
    // does) and the request is tried once more. A request larger than the
    // device fails at once, without that synchronisation.
    if (m.arenas == nullptr || bytes > m.device_total || alignment > m.device_total ||
        m.arenas->release() == 0) {
      throw;
    }
  }
  return m.allocate_core(bytes, stream, alignment, false);
}

void* vmm_pool_resource::impl::allocate_core(std::size_t bytes, stream_view stream, std::size_t alignment,
                                             bool lend) {
  impl& m = *this;
  const std::size_t align = std::max(alignment, impl::granule);
  if (bytes > m.device_total || align > m.device_total) [[unlikely]] {
    m.throw_oom(bytes, "larger than the device's memory (" + std::to_string(m.device_total) + " bytes)");
  }
  const std::size_t size = vm::round_up(bytes, impl::granule);
  impl::front& f = m.front_for(stream);
  if (f.cacheable && !lend) {
    std::lock_guard fl(f.lock);
    const auto hit = f.cache.pop(size, align);
    if (hit.address != 0) [[likely]] {
      detail::vmm::front_live_entry* e = f.live.find(hit.address);  // cached blocks stay in `live`
      e->cached = false;
      e->requested = bytes;
      return reinterpret_cast<void*>(hit.address);
    }
  }

  std::lock_guard lock(m.mutex);
  CUevent wait_on = nullptr;
  // Note [Mapped free ranges first]
  auto it = m.find_mapped(size, align, f, &wait_on);
  if (it == m.blocks.end()) {
    // Growth or moving memory: what the fronts cache may serve instead.
    m.flush_fronts();
    it = m.find_any(size, align, f, &wait_on);
  }
  if (it == m.blocks.end()) {
    m.unmap_stale();  // the addresses the old mappings of moved handles hold
    m.settle(false, &f);
    it = m.find_any(size, align, f, &wait_on);
  }
  if (it == m.blocks.end()) {
    m.settle(true, &f);
    it = m.find_any(size, align, f, &wait_on);
  }
  if (it == m.blocks.end()) {
    m.throw_oom(bytes, "no free address range of that size in the pool's " + std::to_string(m.address_bytes) +
                           "-byte reservation (largest free: " + std::to_string(m.largest_free()) +
                           "); raise vmm_pool_options::address_bytes");
  }
  const bool had_memory = it->second.mapped;
  const std::uintptr_t at = m.carve(it, size, align, bytes);
  if (had_memory) [[likely]] {
    if (wait_on != nullptr) m.wait_for(f.stream, wait_on);
    return m.hand_out(at, size, lend);
  }
  bool ok = false;
  try {
    ok = m.map_range(at, size, f);
  } catch (...) {
    m.uncarve(at);
    throw;
  }
  if (!ok) {
    m.uncarve(at);
    // Last resort (the device is synchronised by now, every free is settled):
    // a handle straddling the range's edge is partly pinned by the request
    // itself, so moving alone could fall short while the memory exists. Give
    // every free handle back and map the request afresh.
    m.release_free_handles(0);
    it = m.find_any(size, align, f, &wait_on);
    if (it != m.blocks.end()) {
      const std::uintptr_t again = m.carve(it, size, align, bytes);
      try {
        ok = m.map_range(again, size, f);
      } catch (...) {
        m.uncarve(again);
        throw;
      }
      if (ok) {
        if (wait_on != nullptr) m.wait_for(f.stream, wait_on);
        return m.hand_out(again, size, lend);
      }
      m.uncarve(again);
    }
    m.throw_oom(bytes, "the device and the pool together lack the physical memory (pool holds " +
                           std::to_string(m.mapped) + " bytes, " + std::to_string(m.used) +
                           " in use; every free handle was offered)");
  }
  if (wait_on != nullptr) m.wait_for(f.stream, wait_on);
  return m.hand_out(at, size, lend);
}

void vmm_pool_resource::impl::free_block(block_iter it, front* freed_on, std::uint64_t epoch) {
  blk& b = it->second;
  used -= b.size;
  --live;
  b.free = true;
  b.mapped = true;  // a block handed out is mapped whole
  b.pending = freed_on != nullptr;
  b.freed_on = freed_on;
  b.epoch = epoch;
  insert_free(it->first, b);
  coalesce(it);
}

void* vmm_pool_resource::impl::hand_out(std::uintptr_t at, std::size_t size, bool lend) {
  used += size;
  ++live;
  if (lend) {
    blocks.find(at)->second.lent = true;
    lent_bytes += size;
    ++lent_count;
  }
  return reinterpret_cast<void*>(at);
}

void vmm_pool_resource::do_deallocate(void* ptr, std::size_t bytes, stream_view stream, std::size_t alignment) {
  impl& m = *impl_;
  if (m.serves_in_arenas(bytes)) [[likely]] {
    try {
      m.arenas->do_deallocate(ptr, bytes, stream, alignment);  // checks the capture state itself
      return;
    } catch (const logic_error&) {
      // Not an arena allocation: a larger one freed with a wrong size gets the
      // core's message for that; anything else is not this pool's.
      if (!m.holds_unlent(ptr)) throw;
    }
  }
  if (m.opt.refuse_capture && detail::stream_is_capturing(stream.handle(), m.device, m.watched)) [[unlikely]] {
    detail::throw_capturing("vmm_pool_resource", "deallocate", stream.handle());
  }
  m.deallocate_core(ptr, bytes, stream);
}

void vmm_pool_resource::impl::deallocate_core(void* ptr, std::size_t bytes, stream_view stream) {
  impl& m = *this;
  const auto at = reinterpret_cast<std::uintptr_t>(ptr);
  impl::front& f = m.front_for(stream);
  auto fence_due = [&] {
    return m.several_streams.load(std::memory_order_relaxed) &&
           (f.unfenced + 1 >= m.opt.fence_interval || f.requested.load(std::memory_order_relaxed));
  };
  if (f.cacheable && m.fast_free) {
    std::lock_guard fl(f.lock);
    if (auto* e = f.live.find(at); e != nullptr && !e->cached) [[likely]] {
      if (e->requested != bytes) {
        throw logic_error("vmm_pool_resource::deallocate: size " + std::to_string(bytes) + " does not match the " +
                          std::to_string(e->requested) + " bytes allocated");
      }
      const std::uint64_t epoch = f.frees.load(std::memory_order_relaxed) + 1;
      if (!fence_due() && f.cache.push(at, e->size, epoch)) [[likely]] {
        e->cached = true;
        f.frees.store(epoch, std::memory_order_release);
        if (m.several_streams.load(std::memory_order_relaxed)) ++f.unfenced;
        return;
      }
    }
  }

  std::lock_guard lock(m.mutex);
  auto it = m.blocks.find(at);
  if (it == m.blocks.end() || it->second.free || it->second.stale || it->second.lent) {
    throw logic_error("vmm_pool_resource::deallocate: pointer was not allocated by this pool (or freed twice)");
  }
  impl::blk& b = it->second;
  if (b.owner != nullptr) {
    // Handed out by a front (or cached there: then this is a second free).
    impl::front& o = *b.owner;
    std::lock_guard ol(o.lock);
    const auto* e = o.live.find(at);
    if (e == nullptr || e->cached) {
      throw logic_error("vmm_pool_resource::deallocate: pointer was not allocated by this pool (or freed twice)");
    }
    if (e->requested != bytes) {
      throw logic_error("vmm_pool_resource::deallocate: size " + std::to_string(bytes) + " does not match the " +
                        std::to_string(e->requested) + " bytes allocated");
    }
    o.live.erase(at);
    b.owner = nullptr;
    b.requested = bytes;
  } else if (b.requested != bytes) {
    throw logic_error("vmm_pool_resource::deallocate: size " + std::to_string(bytes) + " does not match the " +
                      std::to_string(b.requested) + " bytes allocated");
  }

  std::uint64_t epoch = 0;
  bool cached = false;
  {
    std::lock_guard fl(f.lock);
    epoch = f.frees.load(std::memory_order_relaxed) + 1;
    f.frees.store(epoch, std::memory_order_release);
    if (f.cacheable && m.fast_free && !fence_due() && f.cache.push(at, b.size, epoch)) {
      b.owner = &f;
      f.live.insert(at, {.size = b.size, .requested = bytes, .cached = true});
      cached = true;
    }
    if (m.several_streams.load(std::memory_order_relaxed)) ++f.unfenced;
  }
  if (!cached) m.free_block(it, &f, epoch);
  if (!m.fast_free && m.mapped - m.used > m.opt.release_threshold_bytes &&
      ++m.frees_since_check >= m.opt.fence_interval) {
    m.frees_since_check = 0;
    // What the last fence covers, if complete, goes now; the frees since are fenced
    // for the next check (querying an event just recorded would rarely find it done).
    m.settle(false, &f);
    m.release_free_handles(m.opt.release_threshold_bytes);
    if (f.frees.load(std::memory_order_relaxed) > f.fenced) m.record_fence(f);
  }
  // After the check above, so that it queried the previous fence, not one just recorded.
  if (m.several_streams.load(std::memory_order_relaxed) &&
      (f.unfenced >= m.opt.fence_interval || f.requested.load(std::memory_order_relaxed))) {
    m.record_fence(f);
  }
}

std::size_t vmm_pool_resource::trim() {
  impl& m = *impl_;
  if (m.arenas != nullptr) m.arenas->trim();
  std::lock_guard lock(m.mutex);
  m.flush_fronts();
  m.settle(false, nullptr);
  return m.release_free_handles(0);
}

std::size_t vmm_pool_resource::trim(stream_view stream) {
  impl& m = *impl_;
  if (m.arenas != nullptr) m.arenas->trim(stream);
  impl::front& f = m.front_for(stream);
  std::lock_guard lock(m.mutex);
  m.flush_fronts();
  if (f.frees.load(std::memory_order_acquire) > f.fenced) m.record_fence(f);
  m.settle(false, &f);
  return m.release_free_handles(0);
}

std::size_t vmm_pool_resource::release() {
  impl& m = *impl_;
  if (m.arenas != nullptr) m.arenas->release();
  std::lock_guard lock(m.mutex);
  {
    device_context_guard g(m.device);
    GPUMEM_CU(cuCtxSynchronize);
  }
  m.flush_fronts();
  m.settle(false, nullptr, true);
  return m.release_free_handles(0);
}

std::vector<vmm_pool_resource::physical_piece> vmm_pool_resource::physical_pieces(const void* ptr,
                                                                                  std::size_t bytes) const {
  const impl& m = *impl_;
  const auto at = reinterpret_cast<std::uintptr_t>(ptr);
  // An arena's allocation lies inside a lent range: its pieces are that range's.
  const std::size_t arena_live =
      m.arenas != nullptr ? detail::pool_inspector::live_requested_bytes(*m.arenas, ptr) : 0;
  std::lock_guard lock(m.mutex);
  auto it = m.blocks.find(at);
  bool live = arena_live != 0 ? bytes != 0 && bytes <= arena_live
                              : it != m.blocks.end() && !it->second.free && !it->second.stale &&
                                    !it->second.lent && bytes != 0 && bytes <= it->second.size;
  if (live && arena_live == 0 && it->second.owner != nullptr) {
    // A front's block: live only while the front has it handed out (else it was freed and is cached).
    impl::front& o = *it->second.owner;
    std::lock_guard ol(o.lock);
    const auto* e = o.live.find(at);
    live = e != nullptr && !e->cached;
  }
  if (!live) throw logic_error("vmm_pool_resource::physical_pieces: not a live allocation of this pool");
  std::vector<physical_piece> out;
  auto mp = m.maps.upper_bound(at);
  if (mp != m.maps.begin()) --mp;
  for (; mp != m.maps.end() && mp->first < at + bytes; ++mp) {
    if (mp->first + mp->second.bytes <= at) continue;
    out.push_back({mp->first, mp->second.bytes});
  }
  return out;
}

vmm_pool_statistics vmm_pool_resource::statistics() const {
  impl& m = *impl_;
  // The arenas' view first (their lock, not the pool's): a lent range counts
  // as what the arenas handed out of it.
  const pool_statistics in_arenas = m.arenas != nullptr ? m.arenas->statistics() : pool_statistics{};
  std::lock_guard lock(m.mutex);
  m.flush_fronts();
  vmm_pool_statistics st;
  st.used_bytes = m.used - m.lent_bytes + in_arenas.used_bytes;
  st.mapped_bytes = m.mapped;
  st.address_bytes = m.address_bytes;
  st.largest_free_range = m.largest_free();
  st.allocations = m.live - m.lent_count + in_arenas.allocations;
  st.handles = m.maps.size();
  st.handles_created = m.handles_created;
  st.chunks_remapped = m.remapped;
  st.chunks_released = m.released;
  st.stale_mappings = m.stale.size();
  return st;
}

const vmm_pool_options& vmm_pool_resource::options() const noexcept { return impl_->opt; }

resource_properties vmm_pool_resource::properties() const noexcept {
  return resource_properties{.device = impl_->device, .device_accessible = true, .host_accessible = false,
                             .thread_safe = true};
}

}  // namespace gpumem
