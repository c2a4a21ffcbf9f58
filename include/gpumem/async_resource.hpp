// async_resource: device memory from the driver's stream-ordered allocator
// (cuMemAllocFromPoolAsync / cuMemFreeAsync) on a driver memory pool.
//
// Either owns a pool it creates (cuMemPoolCreate) for one device, with the
// options below, or wraps an existing pool (the device's default or current
// one) without owning it. Frees are stream-ordered by the driver: memory freed
// on a stream is reused at once by later allocations on that stream, and by
// other streams as the pool's reuse policies allow (docs/resources.md).
// Thread safety: all members may be called concurrently.
#pragma once

#include <cstddef>
#include <limits>
#include <memory>

#include <cuda.h>

#include "gpumem/export.hpp"
#include "gpumem/memory_resource.hpp"

namespace gpumem {

// How other streams may reuse memory freed on a stream (the pool's
// CU_MEMPOOL_ATTR_REUSE_* attributes; all on by default, as in the driver).
struct async_reuse_policy {
  // A stream ordered after the free by an event or the legacy default stream.
  bool follow_event_dependencies = true;
  // Any stream, once the free has completed on the device.
  bool allow_opportunistic = true;
  // The driver may make the allocating stream wait for a pending free rather than fail.
  bool allow_internal_dependencies = true;

  friend bool operator==(const async_reuse_policy&, const async_reuse_policy&) = default;
};

// Handle type for sharing the pool with other processes, fixed at creation.
enum class async_ipc_handle { none, posix_file_descriptor };

struct async_options {
  // Reserved at construction (allocated and freed once), so the first
  // allocations find memory ready. At most release_threshold_bytes. The driver
  // reserves in chunks of its own choosing (32 MiB and more were seen on an
  // H200) and gives back whole chunks only, so a threshold below the driver's
  // chunk can return the primed memory at the first synchronisation.
  std::size_t initial_bytes = 0;
  // What the pool keeps across synchronisations; memory above it returns to the
  // device at the next stream, event or context synchronisation. Default: keep
  // everything (trim_to() gives memory back).
  std::size_t release_threshold_bytes = std::numeric_limits<std::size_t>::max();
  // Most the pool may reserve; 0 (or anything at or past the device's memory):
  // as much as the device has.
  std::size_t maximum_bytes = 0;
  async_reuse_policy reuse{};
  async_ipc_handle ipc = async_ipc_handle::none;
  // Read/write access for every other device that can reach this one's memory
  // (gpumem::peers_of; set_access for each), as cudaMalloc memory is once peer
  // access is enabled: frameworks copy between devices without asking the
  // allocator. false: the owner alone until set_access says otherwise.
  bool access_for_every_peer = true;
};

// Which existing pool to wrap.
enum class existing_pool { device_default, device_current };

// Read from the pool's attributes (the driver's figures, in its granularity).
struct async_statistics {
  std::size_t used_bytes = 0;           // in allocations now (USED_MEM_CURRENT)
  std::size_t reserved_bytes = 0;       // held from the device now (RESERVED_MEM_CURRENT)
  std::size_t used_high_bytes = 0;      // high watermarks since creation or the last reset
  std::size_t reserved_high_bytes = 0;
};

// Access of another device to the pool's memory (cuMemPoolSetAccess).
enum class pool_access { none, read, read_write };

class GPUMEM_EXPORT async_resource final : public memory_resource {
 public:
  // A new pool of `device` (-1: the current device) that this resource owns.
  explicit async_resource(int device = -1, async_options options = {});
  // The device's default or current pool, not owned: its settings are the
  // device's, and it outlives the resource.
  explicit async_resource(existing_pool which, int device = -1);
  ~async_resource() override;

  int device() const noexcept;
  CUmemoryPool pool_handle() const noexcept;
  bool owns_pool() const noexcept;
  async_ipc_handle ipc_handle() const noexcept;

  // Bytes handed out and not yet returned (as requested), and how many allocations.
  std::size_t allocated_bytes() const noexcept;
  std::size_t allocation_count() const noexcept;

  // Returns free memory to the device until the pool holds at most about
  // `bytes_to_keep` (never less than that, nor memory in use). Frees count as
  // in use until the host has seen them complete: synchronise the streams that
  // freed first. Does not block.
  void trim_to(std::size_t bytes_to_keep);

  async_statistics statistics() const;
  // Sets the high watermarks back to the current values.
  void reset_high_watermarks();

  std::size_t release_threshold() const;
  void set_release_threshold(std::size_t bytes);
  async_reuse_policy reuse_policy() const;
  void set_reuse_policy(const async_reuse_policy& policy);

  // Lets `peer_device` use (or stop using) the pool's memory. The owning
  // device's read-write access cannot change: logic_error.
  void set_access(int peer_device, pool_access access);
  pool_access access_from(int device) const;

  resource_properties properties() const noexcept override;
  std::string_view layer_name() const noexcept override { return "async"; }
  std::optional<std::size_t> available_bytes() const override;  // the device's free memory and the pool's
  std::size_t release_free_memory() override;                     // trim_to(0) after the device's work
  ipc_export_route ipc_route(const void* ptr, std::size_t bytes) const override;  // its pool, when shareable

 private:
  void* do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) override;
  void do_deallocate(void* ptr, std::size_t bytes, stream_view stream,
                     std::size_t alignment) override;

  struct state;
  std::unique_ptr<state> state_;
};

}  // namespace gpumem
