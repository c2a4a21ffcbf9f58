// vmm_pool_resource: gpumem's default resource, a stream-ordered pool that holds
// little more than the live bytes and does not fail for fragmentation
// (docs/vmm.md). Each stream carves its blocks from address segments with the
// same engine and hot path as pool_resource; physical memory comes in pages
// mapped under the blocks on demand. Free pages move, without a copy, to where a
// request needs them (another range of the stream, or another stream), so
// scattered free memory serves a large request and the pool asks the device for
// more only when none of its own can move there. An allocation fails only when
// the device (or maximum_bytes) and the pool's movable free pages together lack
// the memory; the error says which.
//
// Memory is unmapped only once the host has seen the frees it covers complete
// (events); another stream reuses a page after a device-side wait on the
// freeing stream's fence; the device is synchronised only when memory is short.
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
namespace detail {
struct pool_inspector;  // tests and fuzzers check the pool's invariants through it
}

struct vmm_pool_options {
  // The physical page: the unit mapped, moved between addresses and given back
  // (0: the device's granularity, 2 MiB on H100/H200; else a multiple of it).
  // Every VMM driver call costs per page, so larger pages map and move memory
  // faster and share free memory more coarsely (docs/vmm.md, "Pages").
  std::size_t page_bytes = 0;
  // A hard cap on the physical memory the pool holds (0: none but the device).
  // The out-of-memory error names it when it is what refused.
  std::size_t maximum_bytes = 0;
  // Addresses each stream's segment reserves (0: the device's memory). A stream
  // reserves another segment only when none of its ranges is long enough.
  std::size_t segment_bytes = 0;
  // Requests of at least this many bytes get slots: whole pages that keep their
  // address range for life and, freed, wait for the next request of their size
  // while their pages serve elsewhere (docs/vmm.md, "Slots"). 0: one page;
  // SIZE_MAX: none.
  std::size_t slot_min_bytes = 0;
  // Free physical memory the pool keeps: above it, whole free pages whose frees
  // are complete go back to the device, checked at growth and on trim().
  // Default: keep it all (memory is given back when asked: trim(), release()).
  std::size_t release_threshold_bytes = std::numeric_limits<std::size_t>::max();
  // Devices besides the owner that get read/write access to the whole pool.
  std::vector<int> peer_devices;
  // Also every other device that can reach the owner's memory (gpumem::peers_of),
  // as cudaMalloc memory is once peer access is enabled: frameworks copy between
  // devices without asking the allocator (PyTorch's .to("cuda:1"), CuPy's asarray
  // under another device), and such a copy of memory not mapped for the device
  // that runs it fails. Each mapping then carries one access descriptor per
  // device; false maps for the owner and peer_devices only.
  bool access_for_every_peer = true;
  // Pages made exportable to other processes as POSIX file descriptors (IPC:
  // gpumem::export_allocation). On by default, so that the default resource's
  // memory can be shared like any other kind; false makes private pages.
  bool posix_fd_shareable = true;
  // Pages free on one stream serve requests on others (settled ones at once,
  // fenced ones when the device refuses more, after a device-side wait).
  bool reuse_across_streams = true;
  // A stream that has freed nothing for this many milliseconds is idle: its
  // settled free pages serve other streams before the device is asked for new
  // ones (Note [Pages, frugal first]). Shorter gives memory back to busy streams
  // sooner; longer spares threads that pause between bursts from losing their
  // pages and taking them back, a move each way (docs/benchmarks-history-2026-11-25.md, W3).
  // 1 to 3,600,000 (others: logic_error).
  unsigned idle_stream_ms = 200;
  // As pool_options: quick cache, periodic fences, capture refusal and watch.
  // No periodic fences by default, as there: a stream fences when another asks
  // (it wants that stream's free pages) or on its slow paths, and every W5 log
  // held the same memory without them (docs/vmm.md, "Fences on demand").
  bool quick_cache = true;
  unsigned fence_interval = std::numeric_limits<unsigned>::max();
  std::size_t fence_bytes = std::numeric_limits<std::size_t>::max();
  bool check_capture = true;  // as pool_options::check_capture
  bool watch_captures = false;
};

struct vmm_pool_statistics {
  std::size_t used_bytes = 0;          // handed out (256-byte granules)
  std::size_t mapped_bytes = 0;        // physical memory the pool holds (pages)
  std::size_t peak_mapped_bytes = 0;   // the most held at once since the pool was made or reset_peak()
  std::size_t free_bytes = 0;          // mapped and not handed out
  std::size_t address_bytes = 0;       // reserved addresses (every segment)
  std::size_t largest_free_block = 0;  // mapped, usable without a driver call
  std::size_t allocations = 0;
  std::size_t pages = 0;               // physical pages held
  std::size_t pages_created = 0;       // cuMemCreate calls that succeeded, ever
  std::size_t pages_moved = 0;         // free pages mapped under another range, ever
  std::size_t pages_revived = 0;       // pages taken back by a place they had left (no driver call), ever
  std::size_t pages_released = 0;      // pages given back to the device, ever
  std::size_t alias_pages = 0;         // old places of moved pages, still mapped (docs/vmm.md)
  std::size_t streams = 0;
};

class GPUMEM_EXPORT vmm_pool_resource final : public memory_resource {
 public:
  explicit vmm_pool_resource(int device = 0, vmm_pool_options options = {});
  ~vmm_pool_resource() override;

  // Gives back every whole free page whose frees the host has seen complete
  // (cuEventQuery: never waits), after unmapping the settled old places (aliases)
  // of moved pages. Returns bytes.
  std::size_t trim();
  // The same, after fencing the frees made so far on `stream` (alive: the pool
  // records only on streams it is handed). Memory whose frees are still running
  // stays until a later trim.
  std::size_t trim(stream_view stream);
  // Waits for the device once (cuCtxSynchronize), then gives back every whole free page.
  std::size_t release();

  // The physical pieces under [ptr, ptr + bytes) of a live allocation: each the
  // address and size of one page (one handle, mapped whole from offset 0), in
  // address order; the first may begin before ptr and the last end after
  // ptr + bytes (pages are shared with neighbouring blocks).
  // cuMemRetainAllocationHandle on a piece's address gives its handle. For
  // exporting to other processes (IPC).
  struct physical_piece {
    std::uintptr_t address = 0;
    std::size_t bytes = 0;
  };
  std::vector<physical_piece> physical_pieces(const void* ptr, std::size_t bytes) const;

  vmm_pool_statistics statistics() const;
  // peak_mapped_bytes becomes what the pool holds now (torch.cuda.reset_peak_memory_stats).
  void reset_peak();
  const vmm_pool_options& options() const noexcept;
  // The page size in use (options().page_bytes, or the device's granularity).
  std::size_t page_bytes() const noexcept;
  resource_properties properties() const noexcept override;
  std::string_view layer_name() const noexcept override { return "vmm"; }
  std::optional<std::size_t> available_bytes() const override;  // the device's free memory and the pool's free pages
  std::size_t release_free_memory() override;                     // release()
  ipc_export_route ipc_route(const void* ptr, std::size_t bytes) const override;  // its pages, when shareable

 private:
  void* do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) override;
  void do_deallocate(void* ptr, std::size_t bytes, stream_view stream, std::size_t alignment) override;
  void* do_try_allocate_now(std::size_t bytes, stream_view stream, std::size_t alignment) override;
  bool do_try_deallocate_now(void* ptr, std::size_t bytes, stream_view stream, std::size_t alignment) override;

  friend struct detail::pool_inspector;
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace gpumem
