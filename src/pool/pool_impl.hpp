// pool_resource's state and the operations its fast and slow paths share
// (pool_resource.cpp: the hot path; pool_reclaim.cpp: growth, stealing,
// reclaiming and release). Read arena.hpp's note on fencing first.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "gpumem/capture_watch.hpp"
#include "gpumem/pool_resource.hpp"
#include "pool/arena.hpp"

namespace gpumem {

struct pool_resource::impl {
  static constexpr std::size_t granule = std::size_t{1} << detail::free_index::granule_shift;

  impl(memory_resource& up, std::shared_ptr<memory_resource> owned, pool_options opt);
  ~impl();

  // ---- arenas ----
  // `call` names the caller in the error for a new stream under capture.
  detail::arena& arena_for(stream_view s, const char* call = "allocate");
  [[gnu::noinline]] detail::arena& find_arena(std::uintptr_t key, stream_view s, const char* call);
  detail::arena& create_arena(std::uintptr_t key, CUstream s, const char* call = "allocate");

  // ---- block operations; the arena's lock is held ----
  void* carve(detail::arena& a, detail::block* b, std::size_t size, std::size_t requested,
              std::size_t alignment);  // b: a free block in a's index
  void free_into(detail::arena& a, detail::block* b, std::uint64_t epoch);
  void note_free(detail::arena& a, std::size_t bytes);
  void record_fence(detail::arena& a);
  void request_fences();  // every arena fences at its next free or slow path
  void flush_quick(detail::arena& a);

  // ---- slow paths (pool_reclaim.cpp); no lock held on entry ----
  void* allocate_slow(detail::arena& a, std::size_t size, std::size_t requested,
                      std::size_t alignment, std::size_t need);
  void deallocate_foreign(detail::arena& caller, void* ptr, std::size_t bytes);
  bool absorb_pending(detail::arena& a);
  void* take_from_other_arenas(detail::arena& a, std::size_t size, std::size_t requested,
                               std::size_t alignment, std::size_t need, bool wait);
  bool grow(detail::arena& a, std::size_t need);
  void synchronize_and_fence_everything();
  std::size_t release_chunks(bool device_synchronized);
  [[noreturn]] void throw_out_of_memory(std::size_t requested);
  pool_statistics collect();  // flushes the quick caches
  // `fence`: an arena's fence event, read under that arena's lock (null: never
  // recorded, so nothing to wait for).
  void wait_for(detail::arena& waiter, CUevent fence);

  void add_chunk(detail::arena& a, std::uintptr_t base, std::size_t bytes, std::uint64_t epoch);
  CUstream maintenance_stream();

  memory_resource* upstream;
  std::shared_ptr<memory_resource> owned_upstream;
  pool_options opt;
  int device;
  std::uint64_t id;
  std::unique_ptr<capture_watch> watch;  // held with opt.watch_captures
  bool watched = false;                  // the watch started: stream_is_capturing may skip the query

  mutable std::shared_mutex arenas_mutex;  // guards `arenas` (lookup misses only)
  std::unordered_map<std::uintptr_t, std::unique_ptr<detail::arena>> arenas;
  std::atomic<bool> several_streams{false};  // fences matter only once a second stream exists
  bool periodic_fences = false;  // fence_interval or fence_bytes set (arena.hpp's note)

  // Lock order: arenas_mutex, then chunks_mutex, then arena locks (one at a time).
  mutable std::shared_mutex chunks_mutex;  // guards `chunks` and chunk::owner
  std::map<std::uintptr_t, std::unique_ptr<detail::chunk>> chunks;  // by base address
  std::atomic<std::size_t> reserved_bytes{0};

  std::mutex growth_mutex;  // serialises growing and giving back (pool_reclaim.cpp)
  std::mutex maintenance_mutex;
  CUstream maintenance = nullptr;
};

}  // namespace gpumem
