// vmm_pool_resource: a stream-ordered pool that does not fail for fragmentation
// (docs/vmm.md). One large address reservation per pool; physical memory in
// handles sized to each growth, mapped on demand under the blocks handed out;
// when the device has no physical memory left for a request, free handles from
// anywhere in the pool are mapped under the request's addresses (their old
// mappings are unmapped later, off the request's path), so an allocation fails
// only if the device and the pool together lack the physical memory. Small
// requests are served by per-stream arenas over ranges the pool lends them, and
// a per-stream front serves a stream's repeated larger sizes, both without the
// pool's lock.
//
// Memory is unmapped only once the host has seen the frees it covers complete
// (events); the device is synchronised only when memory is short and the frees
// in question were never fenced (as pool_resource does).
//
// Thread safety: all members may be called concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "gpumem/export.hpp"
#include "gpumem/memory_resource.hpp"

namespace gpumem {

struct vmm_pool_options {
  // The mapping unit: every handle is a multiple of it, and a block's pages are
  // mapped in whole units (0: the device's granularity, 2 MiB on H100/H200).
  std::size_t chunk_bytes = 0;
  // The largest physical handle the pool creates. Growth creates as few handles
  // as it can (one per missing contiguous run, in pieces of at most this), since
  // every driver call costs per handle, whatever its size. See docs/vmm.md,
  // "Handle sizes".
  std::size_t max_handle_bytes = std::size_t{1} << 30;
  // Addresses reserved up front (0: twice the device's memory).
  std::size_t address_bytes = 0;
  // Free physical memory the pool keeps mapped; above it, fully free handles whose
  // frees are complete go back to the device (checked every fence_interval frees
  // and on trim()). Default: keep everything, as pool_resource does. With a
  // threshold, every free takes the pool's lock (the per-stream fronts serve
  // allocations only).
  std::size_t release_threshold_bytes = std::numeric_limits<std::size_t>::max();
  // Requests of at most this many bytes go to per-stream arenas (pool_resource's
  // allocator: a hot path without the pool's lock, scaling with threads) over
  // address ranges the pool lends them, whole ranges of at most arena_chunk_bytes.
  // Larger requests, and every request when this is 0 or a release threshold is
  // set, go to the pool's own address-wide allocator. See docs/vmm.md, "Arenas".
  std::size_t arena_max_bytes = std::size_t{4} << 20;
  std::size_t arena_chunk_bytes = std::size_t{32} << 20;
  // Devices besides the owner that get read/write access to the whole pool.
  std::vector<int> peer_devices;
  bool posix_fd_shareable = false;
  // Frees per stream between fence events when the pool serves several streams.
  unsigned fence_interval = 32;
  // Refuse allocate and deallocate on a stream being captured into a CUDA graph, as
  // pool_resource does (docs/pool.md, "CUDA graphs"): one driver query per call on
  // streams other than the legacy default.
  bool refuse_capture = true;
  // As pool_options::watch_captures (the arenas too).
  bool watch_captures = false;
};

struct vmm_pool_statistics {
  std::size_t used_bytes = 0;         // handed out (256-byte granules)
  std::size_t mapped_bytes = 0;       // physical memory the pool holds
  std::size_t address_bytes = 0;      // reserved addresses
  std::size_t largest_free_range = 0; // largest free address range (mapped or not)
  std::size_t allocations = 0;
  std::size_t handles = 0;            // physical handles the pool holds
  std::size_t handles_created = 0;    // cuMemCreate calls that succeeded, ever
  std::size_t chunks_remapped = 0;    // free handles moved under another request, ever
  std::size_t chunks_released = 0;   // handles given back to the device, ever
  std::size_t stale_mappings = 0;     // old mappings of moved handles not yet unmapped
};

class GPUMEM_EXPORT vmm_pool_resource final : public memory_resource {
 public:
  explicit vmm_pool_resource(int device = 0, vmm_pool_options options = {});
  ~vmm_pool_resource() override;

  // Gives back every fully free handle whose frees the host has seen complete
  // (cuEventQuery: never waits), after unmapping the old mappings of moved
  // handles. Returns bytes.
  std::size_t trim();
  // The same, after fencing the frees made so far on `stream` (alive: the pool
  // records only on streams it is handed). Memory whose frees are still running
  // stays until a later trim.
  std::size_t trim(stream_view stream);
  // Waits for the device once (cuCtxSynchronize), then gives back every fully free handle.
  std::size_t release();

  // The physical pieces under [ptr, ptr + bytes) of a live allocation: each the
  // address and size of one handle's whole mapping, in address order (a piece
  // may begin before ptr or end after ptr + bytes: handles are sized to the
  // growth that made them and may be shared with neighbouring blocks);
  // cuMemRetainAllocationHandle on the address gives the handle, mapped there
  // from offset 0. For exporting to other processes (IPC).
  struct physical_piece {
    std::uintptr_t address = 0;
    std::size_t bytes = 0;
  };
  std::vector<physical_piece> physical_pieces(const void* ptr, std::size_t bytes) const;

  vmm_pool_statistics statistics() const;
  const vmm_pool_options& options() const noexcept;
  resource_properties properties() const noexcept override;

 private:
  void* do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) override;
  void do_deallocate(void* ptr, std::size_t bytes, stream_view stream, std::size_t alignment) override;

  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace gpumem
