// Page-locked host memory as the driver knows it: allocations (cuMemHostAlloc,
// cuMemFreeHost) and registrations of existing memory (cuMemHostRegister,
// cuMemHostUnregister), with their flags and device pointers.
//
// Nothing is actually locked: the simulator's "device" reads and writes host
// memory anyway. What is modelled is what a program can observe: the flags,
// the errors, and the device pointer. Every range is reachable from device work
// (unified addressing); its device pointer is the host pointer, except for
// write-combined allocations, which get a second mapping of the same pages at
// another address, as the driver hands out a different device pointer for them
// (cuMemHostAlloc's documentation: the device pointer must be queried).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>

#include <cuda.h>

namespace gpumem::detail::simulator {

enum class host_range_kind { allocated, registered };

struct host_range {
  std::uintptr_t base = 0;         // host address
  std::size_t size = 0;            // as requested
  unsigned flags = 0;              // CU_MEMHOSTALLOC_* or CU_MEMHOSTREGISTER_*
  host_range_kind kind = host_range_kind::allocated;
  std::uintptr_t device_base = 0;  // device pointer of `base`
  std::size_t mapped_bytes = 0;    // allocations: length of the mapping(s)
  int device = 0;                  // device of the context that made it

  bool contains(std::uintptr_t p) const { return p >= base && p - base < size; }
  bool device_contains(std::uintptr_t p) const { return p >= device_base && p - device_base < size; }
  bool mapped() const {
    const unsigned devicemap =
        kind == host_range_kind::allocated ? CU_MEMHOSTALLOC_DEVICEMAP : CU_MEMHOSTREGISTER_DEVICEMAP;
    return (flags & devicemap) != 0;
  }
};

class host_memory {
 public:
  // bytes > 0 and flags checked by the caller. CUDA_ERROR_OUT_OF_MEMORY if the host has no room.
  CUresult allocate(std::size_t bytes, unsigned flags, int device, void** out);
  // CUDA_ERROR_INVALID_VALUE unless `p` is the start of a live allocation.
  CUresult free(void* p);
  // CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED if the range overlaps a registered
  // or allocated one; CUDA_ERROR_INVALID_VALUE if part of it is not mapped.
  CUresult register_range(void* p, std::size_t bytes, unsigned flags, int device);
  // CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED unless `p` starts a registration.
  CUresult unregister(void* p);

  // The range containing `p`, by its host address or its device address.
  std::optional<host_range> find(std::uintptr_t p) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, host_range> ranges_;       // by host base
  std::map<std::uintptr_t, std::uintptr_t> aliases_;  // device base -> host base, where they differ
};

}  // namespace gpumem::detail::simulator
