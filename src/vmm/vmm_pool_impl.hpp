// vmm_pool_resource's state, shared by the allocator (vmm_pool_resource.cpp:
// addresses, blocks, stream ordering, the hot path) and the physical side
// (vmm_pool_physical.cpp: handles sized to the need, moving free handles,
// deferred unmaps, giving memory back). Read the notes in both files.
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "driver/driver.hpp"
#include "gpumem/capture_watch.hpp"
#include "gpumem/error.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/vmm_pool_resource.hpp"
#include "pool/free_index.hpp"
#include "vmm/virtual_memory.hpp"
#include "vmm/vmm_pool_front.hpp"

namespace gpumem {

struct vmm_pool_resource::impl {
  static constexpr std::size_t granule = 256;
  static constexpr std::size_t max_handle_bytes = std::size_t{1} << 30;
  using front = detail::vmm::stream_front;

  struct blk {
    std::size_t size = 0;
    std::size_t requested = 0;
    bool free = true;
    bool pending = false;       // free, and its free not yet seen complete by the host
    bool stale = false;         // the old mapping of a moved handle: never handed out (see the note)
    bool mapped = false;        // free blocks: every page has a handle (else none has one)
    bool joined = false;        // found by find_joined(), partly mapped, about to be carved
    front* freed_on = nullptr;  // the stream it was freed on (pending blocks)
    std::uint64_t epoch = 0;    // that stream's free count at the free
    front* owner = nullptr;     // allocated and tracked by this front (live there or cached)
    bool lent = false;          // allocated: a range lent to the arenas (Note [Arenas over lent ranges])
    // ---- the mapped free index's links (free, mapped blocks) ----
    std::uintptr_t addr = 0;
    blk* prev_free = nullptr;
    blk* next_free = nullptr;
  };
  struct mapping {
    std::size_t bytes = 0;
    CUmemGenericAllocationHandle handle = 0;
  };
  using block_iter = std::map<std::uintptr_t, blk>::iterator;

  impl(int dev, vmm_pool_options o);
  ~impl();

  // ---- the allocator over the whole reservation (vmm_pool_resource.cpp) ----
  // `lend`: the block is a range for the arenas (never from a front's cache).
  void* allocate_core(std::size_t bytes, stream_view stream, std::size_t alignment, bool lend);
  void deallocate_core(void* ptr, std::size_t bytes, stream_view stream);
  void* hand_out(std::uintptr_t at, std::size_t size, bool lend);  // the pool's mutex is held
  // Frees an allocated block: pending on `freed_on` at `epoch`, or settled when null.
  void free_block(block_iter it, front* freed_on, std::uint64_t epoch);
  // Whether ptr is a block the core handed out itself (not a lent range).
  bool holds_unlent(const void* ptr) const;

  // ---- the arenas' upstream (vmm_pool_arenas.cpp) ----
  // Lends [returned, + bytes) to the arenas; takes it back freed on `stream`
  // (fenced there at once), or already complete when `complete`.
  void* lend(std::size_t bytes, stream_view stream);
  void take_back(void* ptr, std::size_t bytes, stream_view stream, bool complete);
  struct lender;
  void make_arenas();  // the end of construction
  bool serves_in_arenas(std::size_t bytes) const noexcept { return bytes <= arena_max; }
  [[noreturn]] void throw_arena_oom(std::size_t bytes, const out_of_memory& from_arenas) const;

  // ---- fronts (vmm_pool_resource.cpp) ----
  front& front_for(stream_view s);
  front& find_front(CUstream key, stream_view s);
  void flush_front(front& f);  // the pool's mutex is held
  void flush_fronts();         // the pool's mutex is held

  // ---- blocks; the pool's mutex is held ----
  // `b` is the block's own node in `blocks` (the mapped index links it).
  using free_set = std::set<std::pair<std::size_t, std::uintptr_t>>;
  void insert_free(std::uintptr_t a, blk& b) {
    if (b.mapped) {
      b.addr = a;
      free_mapped.insert(&b);
    } else {
      free_unmapped.emplace(b.size, a);
    }
  }
  void erase_free(std::uintptr_t a, blk& b) {
    if (b.mapped) {
      free_mapped.remove(&b);
    } else {
      free_unmapped.erase({b.size, a});
    }
  }
  static bool settled(const blk& b) { return b.free && !b.pending; }
  bool mergeable(const blk& x, const blk& y) const;
  block_iter coalesce(block_iter it);
  void record_fence(front& f);
  // `stream` waits on the device for `fence` (another stream's frees). The default
  // streams mean the current context's, so the pool's device is made current.
  void wait_for(CUstream stream, CUevent fence) {
    detail::device_context_guard g(device);
    GPUMEM_CU(cuStreamWaitEvent, stream, fence, 0);
  }
  void settle(bool wait, front* caller, bool device_synchronized = false);
  // Whether stream t may take free block b now (setting *wait_on when t must wait
  // for the freeing stream's fence first; asking for a fence when there is none).
  static bool usable(blk& b, front& t, CUevent* wait_on);
  block_iter find_mapped(std::size_t size, std::size_t alignment, front& t, CUevent* wait_on);
  block_iter find_usable(const free_set& in, std::size_t size, std::size_t alignment, front& t, CUevent* wait_on);
  // Mapped free ranges first (no driver call), then unmapped addresses.
  block_iter find_any(std::size_t size, std::size_t alignment, front& t, CUevent* wait_on);
  block_iter find_joined(std::size_t size, std::size_t alignment);
  std::uintptr_t carve(block_iter it, std::size_t size, std::size_t alignment, std::size_t requested);
  // Splits [at, at + bytes) out of the free block `it` covering it, as a block of
  // its own with the same state; returns it.
  block_iter split_out(block_iter it, std::uintptr_t at, std::size_t bytes);
  void uncarve(std::uintptr_t at);
  bool range_settled_free(std::uintptr_t at, std::size_t bytes) const;
  // The largest run of adjacent free blocks (mapped or not): statistics, errors.
  std::size_t largest_free() const;
  // Re-derives `mapped` for the free blocks overlapping [at, at + bytes) from
  // `maps`, splitting them where a handle's mapping begins or ends (after
  // mapping, unmapping or moving handles there).
  void refresh_mapped(std::uintptr_t at, std::size_t bytes);
  block_iter split_by_mapping(block_iter it);

  // ---- physical memory (vmm_pool_physical.cpp); the pool's mutex is held ----
  bool fully_mapped(std::uintptr_t at, std::size_t size) const;
  bool map_range(std::uintptr_t at, std::size_t size, front& caller);
  void unmap_stale();
  std::size_t release_free_handles(std::size_t keep);
  void release_everything() noexcept;  // destruction

  [[noreturn]] void throw_oom(std::size_t requested, const std::string& why) const {
    detail::vmm::throw_out_of_memory("vmm_pool_resource", device, requested, mapped, why);
  }

  const int device;
  vmm_pool_options opt;
  std::size_t gran = 0;
  std::uintptr_t base = 0;
  std::size_t address_bytes = 0;
  std::size_t device_total = 0;
  const std::uint64_t id;
  std::unique_ptr<capture_watch> watch;  // held with opt.watch_captures
  bool watched = false;                  // the watch started: stream_is_capturing may skip the query
  bool fast_free = true;  // frees may go to the fronts (no release threshold to check)

  mutable std::mutex mutex;  // lock order: mutex, fronts_mutex, one front's lock
  std::map<std::uintptr_t, blk> blocks;                   // every block, address order
  // Free blocks by (size, address), split by whether handles are mapped under
  // them (Note [Mapped free ranges first] in vmm_pool_resource.cpp).
  detail::basic_free_index<blk> free_mapped;  // the hot path's
  free_set free_unmapped;                    // few: they merge (all settled)
  std::map<std::uintptr_t, mapping> maps;                 // where each handle is mapped for use
  std::vector<std::pair<std::uintptr_t, std::size_t>> stale;  // old mappings of moved handles
  std::size_t mapped = 0;  // bytes of the handles the pool holds
  std::size_t used = 0;    // allocated blocks, including those cached in fronts
  std::size_t live = 0;
  std::size_t handles_created = 0;
  std::size_t remapped = 0;
  std::size_t released = 0;
  std::uint64_t frees_since_check = 0;

  std::size_t lent_bytes = 0;  // of `used`: ranges lent to the arenas
  std::size_t lent_count = 0;  // of `live`

  // Small requests (Note [Arenas over lent ranges]); null when arena_max is 0.
  std::size_t arena_max = 0;
  std::unique_ptr<memory_resource> arena_upstream;
  std::unique_ptr<pool_resource> arenas;

  mutable std::shared_mutex fronts_mutex;
  std::unordered_map<CUstream, std::unique_ptr<front>> fronts;
  std::atomic<bool> several_streams{false};
};

}  // namespace gpumem
