// pinned_host_resource: page-locked host memory from cuMemHostAlloc, which the
// device reads and writes directly and copies move at full speed.
//
// Flags: portable (pinned for every context, not only the allocating device's),
// device-mapped (mapped into the device address space: device_pointer()), and
// write-combined (fast for the host to write and the device to read, very slow
// for the host to read). allocate() returns the host pointer; device work uses
// device_pointer(p), which is p itself except for write-combined memory.
// deallocate() waits for the stream's earlier work before cuMemFreeHost, so
// frees are stream-ordered (the host blocks; this is not a fast-path resource).
// Thread safety: all members may be called concurrently.
#pragma once

#include <cstddef>
#include <memory>

#include "gpumem/export.hpp"
#include "gpumem/memory_resource.hpp"

namespace gpumem {

struct pinned_options {
  bool portable = false;        // CU_MEMHOSTALLOC_PORTABLE
  bool device_mapped = true;    // CU_MEMHOSTALLOC_DEVICEMAP
  bool write_combined = false;  // CU_MEMHOSTALLOC_WRITECOMBINED
};

class GPUMEM_EXPORT pinned_host_resource final : public memory_resource {
 public:
  // Allocates in `device`'s context (-1: the current device).
  explicit pinned_host_resource(pinned_options options = {}, int device = -1);
  ~pinned_host_resource() override;

  int device() const noexcept;
  const pinned_options& options() const noexcept;
  // The CU_MEMHOSTALLOC_* flags every allocation is made with.
  unsigned int driver_flags() const noexcept;

  // The address device work uses for `host_pointer` (anywhere inside memory of
  // this resource): cuMemHostGetDevicePointer for mapped memory; the pointer
  // itself for unmapped memory that is not write-combined on a device with
  // unified addressing. logic_error for anything else.
  void* device_pointer(const void* host_pointer) const;

  // Bytes handed out and not yet returned (as requested), and how many allocations.
  std::size_t allocated_bytes() const noexcept;
  std::size_t allocation_count() const noexcept;

  // device -1 (host memory); device_accessible when device work can reach it
  // (through device_pointer()); host-accessible; thread-safe.
  resource_properties properties() const noexcept override;
  std::string_view layer_name() const noexcept override { return "pinned_host"; }
  ipc_export_route ipc_route(const void* ptr, std::size_t bytes) const override;  // refused

 private:
  void* do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) override;
  void do_deallocate(void* ptr, std::size_t bytes, stream_view stream,
                     std::size_t alignment) override;

  struct state;
  std::unique_ptr<state> state_;
};

}  // namespace gpumem
