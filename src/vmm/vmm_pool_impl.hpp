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
#include "gpumem/vmm_pool_resource.hpp"
#include "vmm/virtual_memory.hpp"
#include "vmm/vmm_pool_front.hpp"

namespace gpumem {
namespace detail::vmm {

// Two-level segregated fit index of free blocks (as pool_resource's): O(1)
// insert, remove and good-fit search, intrusive (Node has size, prev_free,
// next_free). A request is rounded up to the next class boundary, so any block
// in a class at or above it fits; classes split each power of two in 16.
template <class Node>
class tlsf_index {
 public:
  static constexpr unsigned granule_shift = 8;
  static constexpr unsigned sl_bits = 4;
  static constexpr unsigned sl_count = 1U << sl_bits;
  static constexpr unsigned fl_count = 64 - granule_shift - sl_bits + 1;

  void insert(Node* b) noexcept {
    auto [fl, sl] = class_of(b->size);
    Node*& head = heads_[fl][sl];
    b->prev_free = nullptr;
    b->next_free = head;
    if (head != nullptr) head->prev_free = b;
    head = b;
    fl_map_ |= std::uint64_t{1} << fl;
    sl_map_[fl] |= 1U << sl;
    ++count_;
  }

  void remove(Node* b) noexcept {
    auto [fl, sl] = class_of(b->size);
    if (b->prev_free != nullptr) {
      b->prev_free->next_free = b->next_free;
    } else {
      heads_[fl][sl] = b->next_free;
      if (b->next_free == nullptr) {
        sl_map_[fl] &= ~(1U << sl);
        if (sl_map_[fl] == 0) fl_map_ &= ~(std::uint64_t{1} << fl);
      }
    }
    if (b->next_free != nullptr) b->next_free->prev_free = b->prev_free;
    b->prev_free = b->next_free = nullptr;
    --count_;
  }

  // The first block of `size` bytes or more that accept(b) takes: the head of
  // the first class above the request's (good fit, O(1) when accepted), then
  // every class that may hold such blocks, smallest first.
  template <class F>
  Node* find(std::size_t size, F&& accept) const {
    if (Node* b = head_above(size); b != nullptr && accept(b)) return b;
    auto [fl0, sl0] = class_of(size);
    for (unsigned fl = fl0; fl < fl_count; ++fl) {
      if ((fl_map_ >> fl & 1U) == 0) continue;
      for (unsigned sl = fl == fl0 ? sl0 : 0; sl < sl_count; ++sl) {
        for (Node* b = heads_[fl][sl]; b != nullptr; b = b->next_free) {
          if (b->size >= size && accept(b)) return b;
        }
      }
    }
    return nullptr;
  }

  std::size_t count() const noexcept { return count_; }

 private:
  Node* head_above(std::size_t size) const noexcept {
    auto [fl, sl] = class_of(round_up_to_class(size));
    if (fl >= fl_count) return nullptr;
    std::uint32_t sl_map = sl_map_[fl] & (~0U << sl);
    if (sl_map == 0) {
      const std::uint64_t fl_map = fl + 1 < 64 ? fl_map_ & (~std::uint64_t{0} << (fl + 1)) : 0;
      if (fl_map == 0) return nullptr;
      fl = static_cast<unsigned>(std::countr_zero(fl_map));
      sl_map = sl_map_[fl];
    }
    return heads_[fl][std::countr_zero(sl_map)];
  }
  struct slot {
    unsigned fl;
    unsigned sl;
  };
  static slot class_of(std::size_t size) noexcept {
    const std::size_t granules = size >> granule_shift;
    if (granules < sl_count) return {0, static_cast<unsigned>(granules)};
    const unsigned msb = 63U - static_cast<unsigned>(std::countl_zero(granules));
    const unsigned sl = static_cast<unsigned>(granules >> (msb - sl_bits)) ^ sl_count;
    return {msb - sl_bits + 1, sl};
  }
  static std::size_t round_up_to_class(std::size_t size) noexcept {
    const std::size_t granules = size >> granule_shift;
    if (granules < sl_count) return size;
    const unsigned msb = 63U - static_cast<unsigned>(std::countl_zero(granules));
    const std::size_t step = std::size_t{1} << (msb - sl_bits + granule_shift);
    const std::size_t rounded = (size + step - 1) & ~(step - 1);
    return rounded < size ? size : rounded;  // overflow: nothing larger is found
  }

  std::uint64_t fl_map_ = 0;
  std::array<std::uint32_t, fl_count> sl_map_{};
  std::array<std::array<Node*, sl_count>, fl_count> heads_{};
  std::size_t count_ = 0;
};

}  // namespace detail::vmm

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
  bool fast_free = true;  // frees may go to the fronts (no release threshold to check)

  mutable std::mutex mutex;  // lock order: mutex, fronts_mutex, one front's lock
  std::map<std::uintptr_t, blk> blocks;                   // every block, address order
  // Free blocks by (size, address), split by whether handles are mapped under
  // them (Note [Mapped free ranges first] in vmm_pool_resource.cpp).
  detail::vmm::tlsf_index<blk> free_mapped;  // the hot path's
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

  mutable std::shared_mutex fronts_mutex;
  std::unordered_map<CUstream, std::unique_ptr<front>> fronts;
  std::atomic<bool> several_streams{false};
};

}  // namespace gpumem
