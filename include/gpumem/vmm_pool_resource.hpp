// vmm_pool_resource: a stream-ordered pool that does not fail for fragmentation
// (docs/vmm.md). One large address reservation per pool; physical memory in
// chunks mapped on demand under the blocks handed out; when the device has no
// physical memory left for a request, free chunks from anywhere in the pool are
// unmapped and mapped under the request's addresses, so an allocation fails only
// if the device and the pool together lack the physical memory.
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
  // Size of each physical handle and the unit of remapping (0: the device's
  // granularity, 2 MiB on H100/H200). See docs/vmm.md, "Chunk size".
  std::size_t chunk_bytes = 0;
  // Addresses reserved up front (0: twice the device's memory).
  std::size_t address_bytes = 0;
  // Free physical memory the pool keeps mapped; above it, fully free chunks whose
  // frees are complete go back to the device (checked every fence_interval frees
  // and on trim()). Default: keep everything, as pool_resource does.
  std::size_t release_threshold_bytes = std::numeric_limits<std::size_t>::max();
  // Devices besides the owner that get read/write access to the whole pool.
  std::vector<int> peer_devices;
  bool posix_fd_shareable = false;
  // Frees per stream between fence events when the pool serves several streams.
  unsigned fence_interval = 32;
};

struct vmm_pool_statistics {
  std::size_t used_bytes = 0;         // handed out (256-byte granules)
  std::size_t mapped_bytes = 0;       // physical memory the pool holds
  std::size_t address_bytes = 0;      // reserved addresses
  std::size_t largest_free_range = 0; // largest free address range (mapped or not)
  std::size_t allocations = 0;
  std::size_t chunks_remapped = 0;    // free chunks moved under another request, ever
  std::size_t chunks_released = 0;    // given back to the device, ever
};

class GPUMEM_EXPORT vmm_pool_resource final : public memory_resource {
 public:
  explicit vmm_pool_resource(int device = 0, vmm_pool_options options = {});
  ~vmm_pool_resource() override;

  // Gives back every fully free chunk whose frees the host has seen complete
  // (cuEventQuery: never waits). Returns bytes.
  std::size_t trim();
  // The same, after fencing the frees made so far on `stream` (alive: the pool
  // records only on streams it is handed). Memory whose frees are still running
  // stays until a later trim.
  std::size_t trim(stream_view stream);
  // Waits for the device once (cuCtxSynchronize), then gives back every fully free chunk.
  std::size_t release();

  // The physical pieces under [ptr, ptr + bytes) of a live allocation: each the
  // address and size of one handle's mapping (cuMemRetainAllocationHandle on the
  // address gives the handle). For exporting to other processes (IPC).
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
