// vmm_pool_resource's state: the stream-ordering engine (src/pool/
// stream_ordered_pool.hpp) over address segments whose physical pages are mapped
// on demand and moved where they are needed. This struct is the engine's backing:
//   page_blocks.cpp   the page-level edits of an arena's blocks (read its Note
//                     [Pages under the blocks] first);
//   page_window.cpp   growth: the place that needs the fewest new pages, and
//                     filling it (Note [Growing by the fewest pages]);
//   page_backing.cpp  where pages come from and where they go back.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpumem/vmm_pool_resource.hpp"
#include "pool/stream_ordered_pool.hpp"

namespace gpumem {

struct vmm_pool_resource::impl final : detail::pool_backing {
  using arena = detail::arena;
  using block = detail::block;
  using chunk = detail::chunk;

  // A page of a segment: its chunk and index.
  struct page_ref {
    chunk* c = nullptr;
    std::size_t index = 0;
    bool operator==(const page_ref&) const = default;
  };
  // Where a physical page (a handle) is mapped: its one primary place, where a
  // block may use it, and its aliases (Note [Pages under the blocks]).
  struct page_home {
    page_ref primary;
    std::vector<page_ref> aliases;
  };

  impl(int device, vmm_pool_options opt);
  ~impl() override;

  // ---- the backing (page_backing.cpp) ----
  void* take_from_others(arena&, const detail::pool_request&, bool) override { return nullptr; }
  bool grow(arena& a, std::size_t need, bool memory_short) override;
  std::size_t give_back(bool device_synchronized) override;
  void before_last_growth() override;
  std::string shortage(std::size_t requested) override;
  std::size_t largest_possible() const override { return maximum; }

  // Physical pages for `a` (growth mutex and a's lock held; `others`: the other
  // arenas): up to `count` handles, from a's own free pages, then other
  // streams' settled ones, then the device (within maximum_bytes), then other
  // streams' fenced ones (a then waits on their fences on the device).
  std::vector<std::uint64_t> supply_pages(arena& a, const std::vector<arena*>& others, std::size_t count);
  // New handles from the device, at most `count`, within maximum_bytes.
  std::size_t create_pages(std::size_t count, std::vector<std::uint64_t>& out);
  // Gives the free pages above release_threshold_bytes back (growth mutex held).
  void enforce_threshold();
  chunk* new_segment(arena& a, std::size_t need);
  void release_everything() noexcept;  // destruction

  // ---- growth (page_window.cpp); growth mutex and a's lock held ----
  // Makes [begin, begin + need) of a run of free, unmapped and alias blocks
  // one free block with memory. Returns whether every page came.
  struct window {
    chunk* c = nullptr;
    block* first = nullptr;  // the run's block holding `begin`
    std::uintptr_t begin = 0;
    std::size_t new_pages = 0;  // unmapped pages in it
    std::size_t swaps = 0;      // alias pages it takes back
  };
  bool find_window(arena& a, std::size_t need, window& out);
  bool fill_window(arena& a, const std::vector<arena*>& others, const window& w, std::size_t need);

  // ---- page-level edits of an arena's blocks (page_blocks.cpp); its lock
  //      and the growth mutex are held ----
  // Updates a.settled_frees from its fence (one cuEventQuery when something is unsettled).
  void settle(arena& a);
  bool is_settled(const arena& a, const block* b) const noexcept { return b->free_epoch <= a.settled_frees; }
  // Takes up to `count` whole free pages out of the free blocks of `s` that
  // `accept` admits (the smallest blocks first), appending their handles to
  // `out`; the pages' places become aliases. Returns how many.
  std::size_t take_pages(arena& s, std::size_t count, std::vector<std::uint64_t>& out,
                         const std::function<bool(const block*)>& accept);
  // The pages [at, at + n pages) of the free block `b` of `s` become an alias block.
  block* make_alias(arena& s, block* b, std::uintptr_t at, std::size_t n);
  // Splits [at, at + bytes) out of `b` (no index holds b; the parts keep b's
  // state and are put back where b's state says). Returns the middle.
  block* split_piece(arena& s, block* b, std::uintptr_t at, std::size_t bytes);
  // Unmaps the alias blocks of `s` whose frees are settled: all of them, or only
  // those whose pages' primary places are in another arena (`foreign_only`:
  // only s's own pages can come back to its aliases).
  void reap_aliases(arena& s, bool foreign_only);
  void unmap_alias(arena& s, block* b);
  // Marks `b` (in no index) as unmapped free addresses, merging it with unmapped
  // neighbours, into s.unmapped.
  void add_unmapped(arena& s, block* b);
  // Maps `handles` at [at, at + n pages) of chunk `c` (owned by a), sets access,
  // and makes that their primary place.
  void map_pages(arena& a, chunk& c, std::uintptr_t at, const std::vector<std::uint64_t>& handles);
  // Gives whole settled free pages of `s` without aliases back to the device, at
  // most `at_most` bytes. Returns bytes.
  std::size_t release_free_pages(arena& s, std::size_t at_most);
  std::size_t page_index(const chunk& c, std::uintptr_t at) const noexcept { return (at - c.base) / page; }
  std::uintptr_t page_address(const page_ref& r) const noexcept { return r.c->base + r.index * page; }

  vmm_pool_options opt;
  std::size_t page = 0;           // bytes of every physical page
  std::size_t segment_bytes = 0;  // addresses each new segment reserves
  std::size_t maximum = 0;        // physical bytes the pool may hold
  std::size_t device_total = 0;
  detail::stream_ordered_pool pool;

  // Every handle the pool holds; changed only under the growth mutex.
  std::unordered_map<std::uint64_t, page_home> homes;

  std::atomic<std::size_t> address_bytes{0};
  std::atomic<std::size_t> pages_created{0};
  std::atomic<std::size_t> pages_moved{0};
  std::atomic<std::size_t> pages_revived{0};
  std::atomic<std::size_t> pages_released{0};
};

}  // namespace gpumem
