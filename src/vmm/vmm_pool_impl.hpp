// vmm_pool_resource's state: the stream-ordering engine (src/pool/
// stream_ordered_pool.hpp) over address segments whose physical pages are mapped
// on demand and moved where they are needed. This struct is the engine's backing:
//   page_blocks.cpp   the pages under an arena's blocks: making a carved block's
//                     pages ready, taking free pages, aliases (read its Note
//                     [Pages under the blocks] first);
//   page_backing.cpp  where pages come from (Note [Pages, frugal first]) and
//                     where they go back.
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpumem/vmm_pool_resource.hpp"
#include "pool/stream_ordered_pool.hpp"

namespace gpumem {

namespace detail {

// A page of a segment: its chunk and index.
struct page_ref {
  chunk* c = nullptr;
  std::size_t index = 0;
  bool operator==(const page_ref&) const = default;
};

// A page_ref read and written as two relaxed atomics. Written only under the
// locks of the arenas of the place it leaves and of the place it names (Note
// [Reusing a slot on the hot path]); read by other arenas, which look only at
// whether the place is theirs (its chunk's owner), so a torn pair is harmless.
struct shared_page_ref {
  std::atomic<chunk*> c{nullptr};
  std::atomic<std::size_t> index{0};
  shared_page_ref() = default;
  shared_page_ref(const shared_page_ref& o)
      : c(o.c.load(std::memory_order_relaxed)), index(o.index.load(std::memory_order_relaxed)) {}
  shared_page_ref& operator=(const shared_page_ref& o) {
    store(o.load());
    return *this;
  }
  page_ref load() const noexcept { return {c.load(std::memory_order_relaxed), index.load(std::memory_order_relaxed)}; }
  void store(page_ref r) noexcept {
    c.store(r.c, std::memory_order_relaxed);
    index.store(r.index, std::memory_order_relaxed);
  }
};

// Where a physical page (a handle) is mapped: every place (`places`), and
// among them its one primary place, where a block may use it (none while it
// moves); the others are its aliases, older places where it is still mapped
// (Note [Pages under the blocks]). Each place's chunk points at it
// (chunk::home_at), so the pages' paths never look a handle up, and a swap of
// primary and alias (take_back) changes `primary` alone. While the handle
// moves (primary none), the last place is the one it was taken from.
struct page_home {
  shared_page_ref primary;
  std::vector<page_ref> places;
  std::uint64_t rank = 0;  // the order handles were made in
  // Its places but the primary (a swap changes which place that is, not how many).
  std::size_t aliases() const noexcept { return places.size() - (primary.load().c != nullptr ? 1U : 0U); }
  bool has_aliases() const noexcept { return aliases() != 0; }
};

}  // namespace detail

struct vmm_pool_resource::impl final : detail::pool_backing {
  using arena = detail::arena;
  using block = detail::block;
  using chunk = detail::chunk;

  using page_ref = detail::page_ref;
  using page_home = detail::page_home;

  impl(int device, vmm_pool_options opt);
  ~impl() override;

  // ---- the backing (page_backing.cpp) ----
  void* take_from_others(arena&, const detail::pool_request&, bool) override { return nullptr; }
  bool grow(arena& a, std::size_t need, bool memory_short) override;
  bool make_ready(arena& a, block* b) override;
  std::size_t give_back(bool device_synchronized) override;
  void before_last_growth() override {}  // the growth after the synchronisation takes every free page
  void* allocate_slot(arena& a, const detail::pool_request& r) override;
  void* swap_slot(arena& a, const detail::pool_request& r) override;
  void* reuse_slot(arena& a, const detail::pool_request& r) override;
  std::string shortage(std::size_t requested) override;
  std::size_t largest_possible() const override { return maximum; }

  // Physical pages for `a` (growth mutex and a's lock held; `others`: the other
  // arenas): up to `count` handles, frugal first (Note [Pages, frugal first]).
  std::vector<std::uint64_t> supply_pages(arena& a, const std::vector<arena*>& others, std::size_t count);
  // Pages for the page indices `missing` of `c` (ascending), supplied and mapped;
  // whether every one got its page (growth mutex and a's lock held).
  bool fill_pages(arena& a, const std::vector<arena*>& others, chunk& c, const std::vector<std::size_t>& missing);
  // Flushes every arena's quick cache and unmaps its settled aliases (arenas_mutex held).
  void reap_every_alias();
  // New handles from the device, at most `count`, within maximum_bytes.
  std::size_t create_pages(std::size_t count, std::vector<std::uint64_t>& out);
  // Gives the free pages above release_threshold_bytes back (growth mutex held).
  void enforce_threshold();
  // A new segment of `a` with room for `need` bytes (growth mutex held, no arena
  // lock), or null when no address range could be reserved even after every
  // segment that holds nothing went back (Note [When addresses run short]).
  chunk* new_segment(arena& a, std::size_t need, bool for_slots = false);
  // Gives back every segment of every arena that holds nothing (no block in use,
  // no page mapped), after the settled free pages and aliases were unmapped
  // (growth mutex held, no arena lock). Returns bytes of addresses.
  std::size_t give_back_addresses();
  void forget_waits_on(arena& s, const chunk& c);

  // ---- slots (page_slots.cpp); growth mutex and a's lock held ----
  // What using the free slot `s` takes (Note [Slots for large requests]): pages
  // to take back from free pages of `a` (swaps) and pages to remap (conflicts).
  struct slot_fit {
    std::size_t conflicts = 0;
    std::size_t swaps = 0;
  };
  slot_fit fit_of(arena& a, const block* s) const;
  // What page i of c (in a slot of `a`) needs for the slot to be used: nothing
  // (ready), a swap, or a remap (conflict: no page, or its page in use or in
  // another arena).
  enum class page_use { ready, swap, conflict };
  page_use use_of(arena& a, const chunk& c, std::size_t i) const;
  // Whether the free slot `s` can be used without a driver call (no conflict);
  // else records in s->wait_seen what the first page it can tell of waits for.
  bool usable(arena& a, block* s);
  // allocate_slot's work: a usable or repaired free slot, else a new one.
  void* find_slot(arena& a, const detail::pool_request& r);
  // The free slot of `size` that needs swaps within `a` only, swapped and out
  // of the cache, or null (a's lock held: Note [Reusing a slot on the hot path]).
  block* take_usable(arena& a, std::size_t size);
  // Across streams (Note [Swaps across streams], swaps_across_streams.cpp; the
  // growth mutex held, a's lock held, other arenas' locks taken one at a time):
  // what a's stream needs to take the handle whose primary place `there` is
  // in s (s's lock held): nothing (ordered: its free is settled, or a's
  // stream freed it or waited past it), a device-side wait on s's fence, or
  // it cannot (in use, or its free not fenced);
  enum class order_across { none, ordered, after_wait };
  static order_across order_of(const arena& a, const arena& s, page_ref there);
  // the lock of one other arena at a time, kept across pages whose handles lie
  // there (with `shared`, the growth mutex is held shared: other arenas' locks
  // are only tried, and a busy one makes the slot unusable for now);
  class other_arena_lock;
  // whether the free slot `s` needs swaps only, some with other arenas;
  bool usable_across(arena& a, const block* s, other_arena_lock& held);
  // the lowest-addressed such slot of `size`, swapped and out of the cache, or null;
  block* take_usable_across(arena& a, std::size_t size, bool shared);
  // a device-side wait a swap across needs: for `of`'s fence, recorded at `fenced`;
  struct fence_wait {
    arena* of;
    CUevent fence;
    std::uint64_t fenced;
  };
  // the alias at page i of c (in a) takes its handle back from another arena
  // when it is still free and ordered there (else false, nothing changed),
  // adding to `waits` what a's stream must wait for;
  bool take_back_across(arena& a, chunk& c, std::size_t i, std::vector<fence_wait>& waits, other_arena_lock& held);
  // a's stream waits on the device for `waits` (a's lock held).
  void wait_across(arena& a, const std::vector<fence_wait>& waits);
  // Hands out the slot `s` (a's lock held).
  void* hand_out(arena& a, block* s, std::size_t requested);
  // Takes up to `count` pages of a's free slots, whole slots first (the one of
  // the size left, else the smallest that covers it, else the largest).
  std::size_t take_whole_slots(arena& a, std::size_t count, std::vector<std::uint64_t>& out,
                               const std::function<bool(const block*)>& accept);
  // The alias at page i of `c` becomes its handle's primary place again (swap;
  // the caller counts it in arena::pages_revived).
  void take_back(chunk& c, std::size_t i);
  // Addresses for a new slot of `size` bytes from a's slot segments (a new
  // segment when none has room; `lock`, on a, is released meanwhile).
  block* new_slot(arena& a, std::size_t size, std::unique_lock<detail::spin_lock>& lock);
  void release_everything() noexcept;  // destruction

  // ---- the pages under an arena's blocks (page_blocks.cpp); its lock and the
  //      growth mutex are held ----
  // Updates a.settled_frees from its fence (one cuEventQuery when something is unsettled).
  void settle(arena& a);
  bool is_settled(const arena& a, std::uint64_t epoch) const noexcept { return epoch <= a.settled_frees; }
  // Waits (on the host) for a's work up to its free number `epoch`: its fence.
  void wait_settled(arena& a, std::uint64_t epoch);
  // Makes pages [first, end) of c (in a) ready where no new page is needed: a
  // handle whose primary place is free in `a` comes back (a swap); an alias whose
  // handle is in use elsewhere goes, once `epoch`, the free that ended the
  // range's last use, is settled. Returns the pages left without a handle, ascending.
  std::vector<std::size_t> repair_pages(arena& a, chunk& c, std::size_t first, std::size_t end, std::uint64_t epoch);
  // Updates peak_used with what every arena has in use now, a's own peak, and
  // busy_peaks (a's lock held).
  void note_peak(arena& a, const std::vector<arena*>& others);
  // Whether the streams of a and s are driven by one thread, which takes them
  // in turns (Note [Streams that take turns], swaps_across_streams.cpp).
  static bool take_turns(const arena& a, const arena& s) noexcept {
    const std::uintptr_t t = a.thread_tag.load(std::memory_order_relaxed);
    return t != 0 && t == s.thread_tag.load(std::memory_order_relaxed);
  }
  // Whether `s` freed something within idle_ns of `now` or waits for the growth
  // mutex (s's lock held).
  bool is_busy(arena& s, std::int64_t now) const;
  // Takes up to `count` ready whole pages out of the free blocks of `s` that
  // `accept` admits (the smallest blocks first), appending their handles to
  // `out`; their places become aliases. Returns how many.
  std::size_t take_pages(arena& s, std::size_t count, std::vector<std::uint64_t>& out,
                         const std::function<bool(const block*)>& accept);
  // Calls f on every block of `s` that is free for its pages (free, waiting in
  // the quick cache, a free slot) and settled.
  template <class F>
  void for_each_settled_free(arena& s, F&& f);
  // Unmaps the aliases inside the settled free blocks of `s`.
  void reap_aliases(arena& s);
  // Gives whole ready pages of settled free blocks of `s` whose handles have no
  // alias back to the device, at most `at_most` bytes. Returns bytes.
  std::size_t release_free_pages(arena& s, std::size_t at_most);
  // Maps `handles` at pages [first, first + n) of chunk `c` (owned by a), sets
  // access, and makes those their primary places. false when the driver had no
  // memory for the mapping: nothing mapped, the handles returned (return_unplaced;
  // Note [A mapping the driver has no memory for]).
  bool map_pages(arena& a, chunk& c, std::size_t first, const std::vector<std::uint64_t>& handles,
                 std::size_t from, std::size_t n);
  // Handles [from, from + n) that supply_pages gave and that were not mapped:
  // pages taken from a free place go back there (ready again), new ones go back
  // to the device (growth mutex and a's lock held).
  void return_unplaced(arena& a, const std::vector<std::uint64_t>& handles, std::size_t from, std::size_t n);
  // Takes the free page i of c (ready) from s to be mapped elsewhere: its place
  // there becomes an alias (growth mutex and s's lock held).
  void take_page(arena& s, chunk& c, std::size_t i, std::vector<std::uint64_t>& out);
  void unmap_alias(chunk& c, std::size_t i);
  // page is a power of two (page_of): a shift rather than a division.
  std::size_t page_index(const chunk& c, std::uintptr_t at) const noexcept { return (at - c.base) >> std::countr_zero(page); }
  // The pages of slot s in its chunk, [first, end): the end computed once, not
  // in a loop's condition, where it was a division at every page.
  struct slot_pages {
    std::size_t first = 0, end = 0;
  };
  slot_pages pages_of(const block* s) const noexcept {
    const std::size_t first = page_index(*s->owner, s->address);
    return {first, first + (s->size >> std::countr_zero(page))};
  }
  static std::size_t page_of(int device, const vmm_pool_options& o);

  vmm_pool_options opt;
  // Devices a mapping gives access to besides the owner: opt.peer_devices, then,
  // with access_for_every_peer, the other devices that can reach the owner.
  std::vector<int> access_devices;
  std::size_t page = 0;           // bytes of every physical page
  std::size_t segment_bytes = 0;  // addresses each new segment reserves
  std::size_t maximum = 0;        // physical bytes the pool may hold
  std::size_t device_total = 0;
  detail::stream_ordered_pool pool;

  // Every handle the pool holds; changed only under the growth mutex.
  std::unordered_map<std::uint64_t, page_home> homes;
  // A stream that has freed nothing for this long is idle: its free pages may go
  // to others before the device is asked (opt.idle_stream_ms; Note [Pages, frugal first]).
  std::int64_t idle_ns = 0;
  std::size_t peak_used = 0;       // the most bytes in use seen when pages were needed (growth mutex)
  // At the last need: the busy arenas' own peaks plus what the idle ones use
  // (growth mutex). At least what every arena uses; more when streams that work
  // at once peak at different times (Note [Pages, frugal first]).
  std::size_t busy_peaks = 0;
  std::uint64_t handles_made = 0;  // ranks (growth mutex)

  // Note [A time budget for moves] (page_backing.cpp); growth mutex.
  std::size_t slack_bytes() const { return peak_used / 16 + extra_slack + 2 * page; }
  void note_moved(std::size_t pages);
  void note_map_time(std::int64_t ns, std::size_t pages);
  std::size_t extra_slack = 0;        // bought with memory when moves cost too much time
  std::int64_t map_ns_per_page = 0;   // what mapping a page has cost (a running mean)
  std::int64_t window_start_ns = 0;   // the moves counted since then
  std::size_t window_moves = 0;

  std::atomic<std::size_t> address_bytes{0};
  // The reservation that last failed after every empty segment went back (0:
  // the last one succeeded), for the out-of-memory message (written under the
  // growth mutex; read by the message, which may be built without it).
  std::atomic<std::size_t> addresses_short{0};
  std::atomic<std::size_t> pages_created{0};
  std::atomic<std::size_t> pages_moved{0};
  std::atomic<std::size_t> pages_released{0};
};

}  // namespace gpumem
