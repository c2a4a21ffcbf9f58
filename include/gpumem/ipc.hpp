// Sharing device memory between processes: one interface for every kind of gpumem
// memory (docs/ipc.md).
//
//   exporter:  gpumem::ipc_handle h = gpumem::export_allocation(mr, p, bytes);
//              send(h.serialize()) ... and, for descriptor kinds, h.descriptors() over an
//              ipc_fd_channel (or let the importer take them with pidfd_getfd);
//              keep `h` alive until the importer has imported it.
//   importer:  gpumem::ipc_mapping m = gpumem::import_allocation(gpumem::ipc_handle::deserialize(bytes));
//              m.data() ... m.close() (or let it go out of scope).
//
// Which mechanism serves which memory:
//   legacy  cuMemAlloc memory (cuda_resource, pool_resource over it): cuIpcGetMemHandle of the
//           base allocation plus the offset of the pointer in it.
//   pool    the driver's stream-ordered pools (async_resource created with
//           async_options::ipc = posix_file_descriptor): the pool's descriptor plus
//           cuMemPoolExportPointer's data.
//   vmm     virtual memory (vmm_pool_resource with posix_fd_shareable): one descriptor per
//           physical handle under the allocation, mapped again in one reserved range.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <cuda.h>
#include <sys/types.h>

#include "gpumem/export.hpp"

namespace gpumem {

class memory_resource;

enum class ipc_kind : std::uint8_t { legacy = 1, pool = 2, vmm = 3 };

// How a resource's memory is exported (memory_resource::ipc_route, a capability
// that adaptors forward): export_allocation(mr, ...) follows it.
struct ipc_export_route {
  enum class way {
    ask_the_driver,  // the pointer is asked about: cuMemAlloc memory, a driver pool's, mapped pages
    refused,         // this memory cannot be shared: `refusal` says why and what to use
    driver_pool,     // a shareable driver pool's memory: `pool` on `device`
    pages,           // virtual-memory pages: `pieces` (address, bytes), each one whole handle
  };
  way how = way::ask_the_driver;
  std::string refusal;
  CUmemoryPool pool = nullptr;
  int device = -1;
  std::vector<std::pair<std::uintptr_t, std::size_t>> pieces;
};

namespace detail {
struct ipc_access;
}

// A serialisable description of one exported allocation. Move-only: it owns the file
// descriptors it carries (closed on destruction).
class GPUMEM_EXPORT ipc_handle {
 public:
  ipc_handle() = default;
  ~ipc_handle();
  ipc_handle(ipc_handle&& other) noexcept;
  ipc_handle& operator=(ipc_handle&& other) noexcept;
  ipc_handle(const ipc_handle&) = delete;
  ipc_handle& operator=(const ipc_handle&) = delete;

  ipc_kind kind() const noexcept { return kind_; }
  std::size_t size() const noexcept { return size_; }      // bytes of the allocation shared
  std::size_t offset() const noexcept { return offset_; }  // of the pointer in what the driver exports
  int device() const noexcept { return device_; }          // the exporter's ordinal (informative)
  const std::array<unsigned char, 16>& device_uuid() const noexcept { return uuid_; }
  pid_t exporter_pid() const noexcept { return pid_; }
  // The driver's bytes: a CUipcMemHandle (legacy) or CUmemPoolPtrExportData (pool).
  std::span<const std::byte> driver_bytes() const noexcept { return driver_bytes_; }
  // How many descriptors the kind needs (pool: 1; vmm: one per physical piece).
  std::size_t descriptor_count() const noexcept { return pieces_.size(); }
  // The descriptors held in this process, in order (-1 where not held: a handle
  // deserialised without them takes them from the exporter with pidfd_getfd on import).
  std::vector<int> descriptors() const;

  // Magic, version, length and a checksum: deserialize() rejects truncated, forged or
  // foreign bytes with ipc_error(malformed_handle). The bytes carry the exporter's
  // descriptor numbers, not the descriptors.
  std::vector<std::byte> serialize() const;
  static ipc_handle deserialize(std::span<const std::byte> bytes);
  // The same, taking ownership of `descriptors` received over a channel (in order;
  // exactly descriptor_count() of them).
  static ipc_handle deserialize(std::span<const std::byte> bytes, std::span<const int> descriptors);

 private:
  friend struct detail::ipc_access;
  struct piece {
    std::size_t bytes = 0;  // vmm: the physical piece's size; pool: 0
    int remote_fd = -1;     // the descriptor's number in the exporter
    int fd = -1;            // held here, or -1
  };
  void close_descriptors() noexcept;

  ipc_kind kind_ = ipc_kind::legacy;
  std::size_t size_ = 0;
  std::size_t offset_ = 0;
  int device_ = -1;
  std::array<unsigned char, 16> uuid_{};
  pid_t pid_ = 0;
  std::vector<std::byte> driver_bytes_;
  std::vector<piece> pieces_;
};

// Memory of another process, mapped here: data() is the exported pointer's address in
// this process. close() (or destruction) waits for the device's work, then unmaps.
class GPUMEM_EXPORT ipc_mapping {
 public:
  ipc_mapping() = default;
  ~ipc_mapping();
  ipc_mapping(ipc_mapping&& other) noexcept;
  ipc_mapping& operator=(ipc_mapping&& other) noexcept;
  ipc_mapping(const ipc_mapping&) = delete;
  ipc_mapping& operator=(const ipc_mapping&) = delete;

  void* data() const noexcept { return ptr_; }
  std::size_t size() const noexcept { return size_; }
  int device() const noexcept { return device_; }  // this process's ordinal of the memory's device
  // The device the mapping was made for (import_options::device): device() unless
  // imported for another device through peer access.
  int user_device() const noexcept { return user_device_; }
  ipc_kind kind() const noexcept { return kind_; }
  explicit operator bool() const noexcept { return ptr_ != nullptr; }
  // Unmaps now; throws cuda_error if the driver refuses (the destructor logs instead).
  void close();

 private:
  friend struct detail::ipc_access;
  void* ptr_ = nullptr;
  std::size_t size_ = 0;
  int device_ = -1;
  int user_device_ = -1;
  ipc_kind kind_ = ipc_kind::legacy;
  std::uintptr_t base_ = 0;       // what the driver mapped (legacy base, pool block, vmm reservation)
  std::size_t mapped_bytes_ = 0;  // vmm: the reservation's size
  std::uintptr_t cache_key_ = 0;  // legacy/pool: the process-wide entry this mapping holds
};

// Exports [ptr, ptr + bytes) of an allocation of `mr`. The resource decides the kind:
// async_resource -> pool, vmm_pool_resource -> vmm, managed and pinned host memory ->
// ipc_error(not_exportable), anything else by the pointer (see the overload below).
GPUMEM_EXPORT ipc_handle export_allocation(const memory_resource& mr, const void* ptr, std::size_t bytes);
// Exports by what the driver says of the pointer: a driver pool's block -> pool; virtual
// memory -> vmm (the mappings under the range); cuMemAlloc memory -> legacy; managed or
// host memory -> ipc_error(not_exportable).
GPUMEM_EXPORT ipc_handle export_allocation(const void* ptr, std::size_t bytes);

// Maps the memory in this process. Legacy and pool mappings of one exporter
// allocation or pool are shared within the process (counted), so importing two
// sub-allocations of one base allocation works (the driver refuses a second open),
// importing one allocation twice gives the same address, and the mappings close in
// any order (the last close unmaps).
GPUMEM_EXPORT ipc_mapping import_allocation(const ipc_handle& handle);

struct import_options {
  // The ordinal (in this process) of the device that will use the memory; -1: the
  // memory's own device. Another device gets access through peer access (legacy: the
  // handle is opened with lazy peer access; pool: cuMemPoolSetAccess; vmm: cuMemSetAccess
  // for both devices). ipc_error(peer_access_unavailable) where cuDeviceCanAccessPeer
  // says it cannot access the memory's device.
  int device = -1;
};
GPUMEM_EXPORT ipc_mapping import_allocation(const ipc_handle& handle, const import_options& options);

}  // namespace gpumem
