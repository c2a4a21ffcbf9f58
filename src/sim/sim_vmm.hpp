// The simulator's virtual memory management: cuMemAddressReserve/Free,
// cuMemCreate/Release, cuMemMap/Unmap, cuMemSetAccess/GetAccess,
// cuMemRetainAllocationHandle and cuMemGetAllocationGranularity.
//
// Note [Simulated virtual memory]
// Addresses and physical memory are separate, as on a GPU:
//
//  - *Addresses* come from one process-wide PROT_NONE, MAP_NORESERVE range of host
//    address space (virtual addresses are unified across devices, as with the
//    driver), several times the devices' total capacity. A reservation is placed
//    first-fit in 2 MiB units, or exactly at the caller's hint when that range is
//    free, which is what lets a growable buffer extend its range in place.
//  - *Physical memory* of device d is an extent of one memfd per device (sparse,
//    several times the capacity, so extents practically never fail to fit). A
//    handle counts its bytes against the device's capacity (cuMemGetInfo sees it)
//    and takes part in fault injection like any allocation.
//  - *Mapping* a handle maps its extent of the memfd MAP_SHARED at the address,
//    PROT_NONE: the pages fault until cuMemSetAccess grants access. The same
//    physical memory mapped at two addresses is the same bytes, so remapping
//    without a copy is real here. Unmapping puts an anonymous PROT_NONE mapping
//    back: touching an unmapped (or released) range faults, as on a GPU.
//  - A handle's memory goes back to the device (the extent's pages are punched out
//    of the memfd and the capacity uncharged) once the handle is released
//    (cuMemRelease for cuMemCreate and for each cuMemRetainAllocationHandle) AND
//    unmapped everywhere, as the driver does. Neither cuMemUnmap nor cuMemRelease
//    waits for work in flight (as on a GPU): ordering them after the frees is the
//    allocator's job, and a host function still touching the pages faults.
//
// Copies into virtual-memory ranges are checked: every byte must be mapped with
// access granted (else CUDA_ERROR_INVALID_VALUE).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include <cuda.h>

namespace gpumem::detail::simulator {

class device_address_space;
class fault_injector;

class vmm_space {
 public:
  // 2 MiB: the granularity (minimum and recommended) of an H100's device memory.
  static constexpr std::size_t granularity = std::size_t{2} << 20;

  // Reserves the address range. Throws host_reservation_failed if the host has no room.
  explicit vmm_space(std::vector<device_address_space*> devices);
  ~vmm_space();
  vmm_space(const vmm_space&) = delete;
  vmm_space& operator=(const vmm_space&) = delete;

  CUresult reserve(CUdeviceptr* out, std::size_t size, std::size_t alignment, CUdeviceptr hint,
                   unsigned long long flags);
  CUresult free_range(CUdeviceptr ptr, std::size_t size);
  CUresult create(CUmemGenericAllocationHandle* handle, std::size_t size, const CUmemAllocationProp* prop,
                  unsigned long long flags, fault_injector& faults);
  CUresult release(CUmemGenericAllocationHandle handle);
  CUresult map(CUdeviceptr ptr, std::size_t size, std::size_t offset, CUmemGenericAllocationHandle handle,
               unsigned long long flags);
  CUresult unmap(CUdeviceptr ptr, std::size_t size);
  CUresult set_access(CUdeviceptr ptr, std::size_t size, const CUmemAccessDesc* desc, std::size_t count);
  CUresult get_access(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr);
  CUresult retain(CUmemGenericAllocationHandle* handle, CUdeviceptr ptr);
  // IPC: a handle created with the POSIX file descriptor type has a memfd of its own
  // (named for its device); exporting hands out a duplicate, importing makes a handle
  // over the memfd a descriptor names (not counted against this process's device:
  // the memory is the exporter's). The memfd lives while any process maps or holds it,
  // so memory an exporter released stays valid for importers, as with the driver.
  CUresult export_handle(void* shareable, CUmemGenericAllocationHandle handle, CUmemAllocationHandleType type,
                         unsigned long long flags);
  CUresult import_handle(CUmemGenericAllocationHandle* handle, void* os_handle, CUmemAllocationHandleType type);

  // Whether [p, p + bytes) touches the virtual-memory address range (bytes > 0).
  bool overlaps(CUdeviceptr p, std::size_t bytes) const;
  // For copies: every byte mapped, with access granted to some device.
  CUresult check_access(CUdeviceptr p, std::size_t bytes) const;

  struct mapped_range {
    CUdeviceptr base = 0;  // the mapping containing the pointer
    std::size_t size = 0;
    int device = -1;       // the physical memory's device
  };
  std::optional<mapped_range> find(CUdeviceptr p) const;

 private:
  struct physical {
    int device = -1;
    std::size_t size = 0;
    std::size_t file_offset = 0;  // extent in the device's memfd
    unsigned long long handle_types = 0;
    unsigned references = 1;      // cuMemCreate and each retain, less each release
    unsigned mappings = 0;
    int own_fd = -1;        // shareable handles: their own memfd (file_offset 0)
    bool imported = false;  // from another process: not counted against a device here
  };
  struct mapping {
    std::size_t size = 0;
    std::size_t offset = 0;  // into the physical allocation
    CUmemGenericAllocationHandle handle = 0;
    std::vector<unsigned long long> access;  // CUmemAccess_flags per device
  };
  struct backing {
    int fd = -1;
    std::size_t size = 0;
    std::map<std::size_t, std::size_t> free_extents;  // offset -> length
  };

  std::size_t device_count() const { return devices_.size(); }
  physical* live_handle(CUmemGenericAllocationHandle handle);
  void destroy_if_unused_locked(CUmemGenericAllocationHandle handle);
  // The mappings exactly covering [ptr, ptr + size) without gaps, or empty.
  std::vector<std::map<CUdeviceptr, mapping>::iterator> whole_mappings_locked(CUdeviceptr ptr, std::size_t size);
  static void give_back(std::map<std::size_t, std::size_t>& ranges, std::size_t offset, std::size_t length);
  bool in_arena(CUdeviceptr p, std::size_t size) const;

  std::vector<device_address_space*> devices_;
  std::byte* base_ = nullptr;        // granularity-aligned start of the usable range
  std::size_t reserved_ = 0;
  void* mapping_base_ = nullptr;     // what mmap returned (for munmap)
  std::size_t mapping_bytes_ = 0;

  mutable std::mutex mutex_;
  std::map<std::size_t, std::size_t> free_addresses_;   // offset -> length, coalesced
  std::map<CUdeviceptr, std::size_t> reservations_;     // base -> size
  std::map<CUdeviceptr, mapping> mappings_;             // base -> mapping
  std::unordered_map<CUmemGenericAllocationHandle, physical> handles_;
  CUmemGenericAllocationHandle next_handle_ = 0x6d6d0001;  // never 0, unlikely to be made up
  std::vector<backing> backings_;
};

}  // namespace gpumem::detail::simulator
