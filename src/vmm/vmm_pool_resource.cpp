// vmm_pool_resource: one address reservation, physical chunks mapped on demand,
// a best-fit sub-allocator over the addresses, and remapping of free chunks when
// the device is short of physical memory (see the notes below and docs/vmm.md).
#include "gpumem/vmm_pool_resource.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>

#include "driver/driver.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "vmm/virtual_memory.hpp"

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
// that fits practically always exists), and physical chunks follow the blocks:
// mapped under a block when it is carved, moved away from free ranges when
// another request needs them. Both decisions need a view of the whole pool, hence
// one lock; the hot path (a free range of mapped memory) takes it for a map
// lookup and a split, under a microsecond. Stream ordering follows pool_resource's
// fencing rules (src/pool/arena.hpp): reuse on the freeing stream at once, on
// another stream only after a device-side wait on the freeing stream's fence.
//
// Note [When a physical chunk may be unmapped]
// cuMemUnmap does not wait for work in flight. A chunk is unmapped (to be
// released, or moved under another request) only when its whole address range
// lies in one free block whose frees the host has seen complete ("settled"): the
// freeing stream's fence event, recorded after the free, answered cuEventQuery
// (or cuEventSynchronize on the slow path, or the device was synchronised). Free
// blocks still pending on a stream are never unmapped; they stay reusable on
// that stream at once and on others after a fence wait on the device.
struct vmm_pool_resource::impl {
  static constexpr std::size_t granule = 256;

  struct blk {
    std::size_t size = 0;
    std::size_t requested = 0;
    bool free = true;
    bool pending = false;  // free, and its free not yet seen complete by the host
    CUstream stream = nullptr;  // the stream it was freed on (pending blocks)
    std::uint64_t epoch = 0;    // that stream's free count at the free
  };
  struct fence_state {
    CUevent event = nullptr;
    std::uint64_t frees = 0;      // frees on this stream so far
    std::uint64_t fenced = 0;     // frees before the last record of `event`
    std::uint64_t completed = 0;  // frees the host has seen complete
    unsigned unfenced = 0;
    bool requested = false;       // another stream wants this stream's frees
  };

  int device;
  vmm_pool_options opt;
  std::size_t chunk;
  std::uintptr_t base = 0;
  std::size_t address_bytes = 0;
  std::size_t device_total = 0;

  mutable std::mutex mutex;
  std::map<std::uintptr_t, blk> blocks;                   // every block, address order
  std::set<std::pair<std::size_t, std::uintptr_t>> free;  // free blocks by (size, address)
  std::vector<CUmemGenericAllocationHandle> slots;        // handle mapped at each chunk, 0: none
  std::unordered_map<CUstream, fence_state> fences;
  std::size_t mapped = 0;
  std::size_t used = 0;
  std::size_t live = 0;
  std::size_t remapped = 0;
  std::size_t released = 0;
  std::uint64_t frees_since_check = 0;

  impl(int dev, vmm_pool_options o) : device(dev), opt(std::move(o)) {
    validate_device(dev, "vmm_pool_resource");
    for (int p : opt.peer_devices) validate_device(p, "vmm_pool_resource peer_devices");
    if (opt.fence_interval == 0) throw logic_error("vmm_pool_resource: fence_interval must be at least 1");
    const std::size_t g = vm::granularity(dev);
    chunk = vm::round_up(std::max(opt.chunk_bytes, g), g);
    device_total = device_memory_info(dev).total_bytes;
    address_bytes = vm::round_up(opt.address_bytes != 0 ? opt.address_bytes : 2 * device_total, chunk);
    base = vm::reserve(dev, address_bytes, 0, chunk);
    if (base == 0) {
      throw out_of_memory(out_of_memory_info{.requested_bytes = address_bytes, .device = dev,
                                             .resource = "vmm_pool_resource",
                                             .reason = "cannot reserve the pool's address range"});
    }
    slots.assign(address_bytes / chunk, 0);
    blocks.emplace(base, blk{address_bytes, 0, true, false, nullptr, 0});
    free.emplace(address_bytes, base);
  }

  ~impl() {
    try {
      device_context_guard g(device);
      GPUMEM_CU(cuCtxSynchronize);
      if (live != 0) {
        std::fprintf(stderr, "gpumem: vmm_pool_resource on device %d destroyed with %zu live allocation(s), %zu bytes\n",
                     device, live, used);
      }
      for (std::size_t i = 0; i < slots.size(); ++i) {
        if (slots[i] == 0) continue;
        vm::unmap(device, base + i * chunk, chunk);
        vm::release(device, slots[i]);
      }
      vm::free_addresses(device, base, address_bytes);
      for (auto& [s, f] : fences) {
        if (f.event != nullptr) driver().cuEventDestroy(f.event);
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gpumem: vmm_pool_resource: giving memory back failed: %s\n", e.what());
    }
  }

  // ---- free-block bookkeeping; the lock is held ----
  void insert_free(std::uintptr_t a, blk& b) { free.emplace(b.size, a); }
  void erase_free(std::uintptr_t a, const blk& b) { free.erase({b.size, a}); }

  bool settled(const blk& b) const { return b.free && !b.pending; }

  // Two free neighbours merge when their frees are interchangeable: both settled,
  // or pending on the same stream and on the same side of its last fence (the
  // later epoch then stands for both without delaying the older one's settling).
  bool mergeable(const blk& x, const blk& y) {
    if (!x.free || !y.free) return false;
    if (!x.pending || !y.pending) return !x.pending && !y.pending;
    if (x.stream != y.stream) return false;
    const std::uint64_t fenced = fences[x.stream].fenced;
    return (x.epoch <= fenced) == (y.epoch <= fenced);
  }

  std::map<std::uintptr_t, blk>::iterator coalesce(std::map<std::uintptr_t, blk>::iterator it) {
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

  fence_state& fence_of(CUstream s) { return fences[s]; }

  void record_fence(CUstream s, fence_state& f) {
    device_context_guard g(device);
    if (f.event == nullptr) GPUMEM_CU(cuEventCreate, &f.event, CU_EVENT_DISABLE_TIMING);
    GPUMEM_CU(cuEventRecord, f.event, s);
    f.fenced = f.frees;
    f.unfenced = 0;
    f.requested = false;
  }

  // Marks pending blocks whose frees the host has seen complete as settled and
  // merges them. With wait: fences the caller's stream and waits for every fence
  // (those streams' work only). With device_synchronized: every free is complete.
  void settle(bool wait, CUstream caller, bool device_synchronized = false) {
    if (wait) {
      auto it = fences.find(caller);
      if (it != fences.end() && it->second.frees > it->second.fenced) record_fence(caller, it->second);
    }
    for (auto& [s, f] : fences) {
      if (device_synchronized) {
        f.completed = f.frees;
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
    for (auto it = blocks.begin(); it != blocks.end(); ++it) {
      blk& b = it->second;
      if (!b.free || !b.pending) continue;
      if (fences[b.stream].completed >= b.epoch) b.pending = false;
    }
    for (auto it = blocks.begin(); it != blocks.end();) {
      if (it->second.free) it = coalesce(it);
      ++it;
    }
  }

  // The settled free block covering chunk i entirely, if any.
  bool chunk_is_free(std::size_t i) const {
    const std::uintptr_t lo = base + i * chunk;
    auto it = blocks.upper_bound(lo);
    --it;
    return settled(it->second) && it->first + it->second.size >= lo + chunk;
  }

  // ---- carving ----
  // A free block usable by stream t for `size` bytes at `alignment`; sets *wait_on
  // when t must wait for the freeing stream's fence first.
  std::map<std::uintptr_t, blk>::iterator find_usable(std::size_t size, std::size_t alignment, CUstream t,
                                                      CUevent* wait_on) {
    const std::size_t search = size + (alignment > granule ? alignment - granule : 0);
    for (auto fit = free.lower_bound({search, 0}); fit != free.end(); ++fit) {
      auto it = blocks.find(fit->second);
      blk& b = it->second;
      if (!b.pending || b.stream == t) return it;
      fence_state& f = fences[b.stream];
      if (f.fenced >= b.epoch && f.event != nullptr) {
        *wait_on = f.event;
        return it;
      }
      f.requested = true;  // fence at that stream's next free
    }
    return blocks.end();
  }

  std::uintptr_t carve(std::map<std::uintptr_t, blk>::iterator it, std::size_t size, std::size_t alignment,
                       std::size_t requested) {
    erase_free(it->first, it->second);
    const std::uintptr_t start = it->first;
    const std::uintptr_t at = (start + alignment - 1) / alignment * alignment;
    blk b = it->second;
    blocks.erase(it);
    if (at > start) {
      blk lead = b;
      lead.size = at - start;
      blocks.emplace(start, lead);
      insert_free(start, blocks.at(start));
    }
    const std::size_t rest = b.size - (at - start) - size;
    if (rest > 0) {
      blk tail = b;
      tail.size = rest;
      blocks.emplace(at + size, tail);
      insert_free(at + size, blocks.at(at + size));
    }
    blocks.emplace(at, blk{size, requested, false, false, nullptr, 0});
    return at;
  }

  // Gives a block carved for a request that then failed back as settled free space.
  void uncarve(std::uintptr_t at) {
    auto it = blocks.find(at);
    it->second.free = true;
    it->second.pending = false;
    insert_free(it->first, it->second);
    coalesce(it);
  }

  // ---- physical memory ----
  // Note [Mapping on demand, and remapping scattered free chunks]
  // Chunks under [at, at + size) that have no physical memory get some: a new
  // handle from the device, else a settled free chunk from anywhere else in the
  // pool, unmapped there and mapped here (the same physical memory at a new
  // address: no copy, and nothing can still use it, see the note above). When
  // neither is left, the pool waits for its fences (the frees' streams only) and
  // tries again, then synchronises the device once: an allocation fails only when
  // the device and the pool's free chunks together lack the memory.
  bool map_range(std::uintptr_t at, std::size_t size, CUstream caller) {
    const std::size_t first = (at - base) / chunk;
    const std::size_t last = (at + size - 1 - base) / chunk;
    std::vector<std::size_t> missing;
    for (std::size_t i = first; i <= last; ++i) {
      if (slots[i] == 0) missing.push_back(i);
    }
    if (missing.empty()) return true;
    std::vector<CUmemGenericAllocationHandle> got;
    std::size_t scan = 0;  // where the search for free chunks to move resumes
    int stage = 0;         // 0: settled as is; 1: after waiting on fences; 2: after a device sync
    auto steal = [&]() -> CUmemGenericAllocationHandle {
      for (; scan < slots.size(); ++scan) {
        if (slots[scan] == 0 || (scan >= first && scan <= last) || !chunk_is_free(scan)) continue;
        const CUmemGenericAllocationHandle h = slots[scan];
        vm::unmap(device, base + scan * chunk, chunk);
        slots[scan] = 0;
        mapped -= chunk;
        ++remapped;
        ++scan;
        return h;
      }
      return 0;
    };
    while (got.size() < missing.size()) {
      if (auto h = vm::create(device, chunk, opt.posix_fd_shareable)) {
        got.push_back(*h);
        continue;
      }
      if (CUmemGenericAllocationHandle h = steal()) {
        got.push_back(h);
        continue;
      }
      if (stage == 0) {
        settle(true, caller);
      } else if (stage == 1) {
        device_context_guard g(device);
        GPUMEM_CU(cuCtxSynchronize);
        settle(false, caller, true);
      } else {
        break;
      }
      ++stage;
      scan = 0;
    }
    std::size_t placed = 0;
    for (; placed < got.size(); ++placed) {
      const std::size_t i = missing[placed];
      vm::map(device, base + i * chunk, chunk, got[placed]);
      slots[i] = got[placed];
      mapped += chunk;
    }
    // Access once per contiguous run of newly mapped chunks.
    for (std::size_t k = 0; k < placed;) {
      std::size_t j = k + 1;
      while (j < placed && missing[j] == missing[j - 1] + 1) ++j;
      vm::set_access(device, base + missing[k] * chunk, (j - k) * chunk, opt.peer_devices);
      k = j;
    }
    // Short: what was mapped stays as free physical memory of the pool.
    return got.size() == missing.size();
  }

  std::size_t release_free_chunks(std::size_t keep) {
    std::size_t freed = 0;
    for (std::size_t i = 0; i < slots.size() && mapped - used > keep; ++i) {
      if (slots[i] == 0 || !chunk_is_free(i)) continue;
      vm::unmap(device, base + i * chunk, chunk);
      vm::release(device, slots[i]);
      slots[i] = 0;
      mapped -= chunk;
      freed += chunk;
      ++released;
    }
    return freed;
  }

  std::size_t largest_free() const { return free.empty() ? 0 : free.rbegin()->first; }

  [[noreturn]] void throw_oom(std::size_t requested, const std::string& why) {
    vm::throw_out_of_memory("vmm_pool_resource", device, requested, mapped, why);
  }
};

vmm_pool_resource::vmm_pool_resource(int device, vmm_pool_options options)
    : impl_(std::make_unique<impl>(device, std::move(options))) {}

vmm_pool_resource::~vmm_pool_resource() = default;

void* vmm_pool_resource::do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) {
  impl& m = *impl_;
  const CUstream s = stream.handle();
  if (s != nullptr && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD && stream.device() != m.device) {
    throw logic_error("vmm_pool_resource on device " + std::to_string(m.device) + ": a stream of device " +
                      std::to_string(stream.device()) + " was given");
  }
  const std::size_t align = std::max(alignment, impl::granule);
  if (bytes > m.device_total || align > m.device_total) {
    m.throw_oom(bytes, "larger than the device's memory (" + std::to_string(m.device_total) + " bytes)");
  }
  const std::size_t size = vm::round_up(bytes, impl::granule);
  std::lock_guard lock(m.mutex);
  CUevent wait_on = nullptr;
  auto it = m.find_usable(size, align, s, &wait_on);
  if (it == m.blocks.end()) {
    m.settle(false, s);
    it = m.find_usable(size, align, s, &wait_on);
  }
  if (it == m.blocks.end()) {
    m.settle(true, s);
    it = m.find_usable(size, align, s, &wait_on);
  }
  if (it == m.blocks.end()) {
    m.throw_oom(bytes, "no free address range of that size in the pool's " + std::to_string(m.address_bytes) +
                           "-byte reservation (largest free: " + std::to_string(m.largest_free()) +
                           "); raise vmm_pool_options::address_bytes");
  }
  const std::uintptr_t at = m.carve(it, size, align, bytes);
  bool ok = false;
  try {
    ok = m.map_range(at, size, s);
  } catch (...) {
    m.uncarve(at);
    throw;
  }
  if (!ok) {
    m.uncarve(at);
    m.throw_oom(bytes, "the device and the pool together lack the physical memory (pool holds " +
                           std::to_string(m.mapped) + " bytes, " + std::to_string(m.used) +
                           " in use; every free chunk was offered)");
  }
  if (wait_on != nullptr) GPUMEM_CU(cuStreamWaitEvent, s, wait_on, 0);
  m.used += size;
  ++m.live;
  return reinterpret_cast<void*>(at);
}

void vmm_pool_resource::do_deallocate(void* ptr, std::size_t bytes, stream_view stream, std::size_t /*alignment*/) {
  impl& m = *impl_;
  const auto at = reinterpret_cast<std::uintptr_t>(ptr);
  const CUstream s = stream.handle();
  std::lock_guard lock(m.mutex);
  auto it = m.blocks.find(at);
  if (it == m.blocks.end() || it->second.free) {
    throw logic_error("vmm_pool_resource::deallocate: pointer was not allocated by this pool (or freed twice)");
  }
  if (it->second.requested != bytes) {
    throw logic_error("vmm_pool_resource::deallocate: size " + std::to_string(bytes) + " does not match the " +
                      std::to_string(it->second.requested) + " bytes allocated");
  }
  if (s != nullptr && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD && stream.device() != m.device) {
    throw logic_error("vmm_pool_resource::deallocate: a stream of another device was given");
  }
  impl::fence_state& f = m.fence_of(s);

  {
    impl::blk& b = it->second;
    m.used -= b.size;
    --m.live;
    b.free = true;
    b.pending = true;
    b.stream = s;
    b.epoch = ++f.frees;
    m.insert_free(at, b);
    m.coalesce(it);
  }
  if (m.opt.release_threshold_bytes != std::numeric_limits<std::size_t>::max() &&
      m.mapped - m.used > m.opt.release_threshold_bytes && ++m.frees_since_check >= m.opt.fence_interval) {
    m.frees_since_check = 0;
    // What the last fence covers, if complete, goes now; the frees since are fenced
    // for the next check (querying an event just recorded would rarely find it done).
    m.settle(false, s);
    m.release_free_chunks(m.opt.release_threshold_bytes);
    if (f.frees > f.fenced) m.record_fence(s, f);
  }
  // After the check above, so that it queried the previous fence, not one just recorded.
  if (m.fences.size() > 1 && (++f.unfenced >= m.opt.fence_interval || f.requested)) m.record_fence(s, f);
}

std::size_t vmm_pool_resource::trim() {
  std::lock_guard lock(impl_->mutex);
  impl_->settle(false, nullptr);
  return impl_->release_free_chunks(0);
}

std::size_t vmm_pool_resource::trim(stream_view stream) {
  std::lock_guard lock(impl_->mutex);
  auto it = impl_->fences.find(stream.handle());
  if (it != impl_->fences.end() && it->second.frees > it->second.fenced) impl_->record_fence(stream.handle(), it->second);
  impl_->settle(false, stream.handle());
  return impl_->release_free_chunks(0);
}

std::size_t vmm_pool_resource::release() {
  std::lock_guard lock(impl_->mutex);
  {
    device_context_guard g(impl_->device);
    GPUMEM_CU(cuCtxSynchronize);
  }
  impl_->settle(false, nullptr, true);
  return impl_->release_free_chunks(0);
}

std::vector<vmm_pool_resource::physical_piece> vmm_pool_resource::physical_pieces(const void* ptr,
                                                                                  std::size_t bytes) const {
  const impl& m = *impl_;
  const auto at = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard lock(m.mutex);
  auto it = m.blocks.find(at);
  if (it == m.blocks.end() || it->second.free || bytes == 0 || bytes > it->second.size) {
    throw logic_error("vmm_pool_resource::physical_pieces: not a live allocation of this pool");
  }
  std::vector<physical_piece> out;
  const std::size_t first = (at - m.base) / m.chunk;
  const std::size_t last = (at + bytes - 1 - m.base) / m.chunk;
  for (std::size_t i = first; i <= last; ++i) out.push_back({m.base + i * m.chunk, m.chunk});
  return out;
}

vmm_pool_statistics vmm_pool_resource::statistics() const {
  std::lock_guard lock(impl_->mutex);
  vmm_pool_statistics st;
  st.used_bytes = impl_->used;
  st.mapped_bytes = impl_->mapped;
  st.address_bytes = impl_->address_bytes;
  st.largest_free_range = impl_->largest_free();
  st.allocations = impl_->live;
  st.chunks_remapped = impl_->remapped;
  st.chunks_released = impl_->released;
  return st;
}

const vmm_pool_options& vmm_pool_resource::options() const noexcept { return impl_->opt; }

resource_properties vmm_pool_resource::properties() const noexcept {
  return resource_properties{.device = impl_->device, .device_accessible = true, .host_accessible = false,
                             .thread_safe = true};
}

}  // namespace gpumem
