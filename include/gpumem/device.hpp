// Devices as gpumem sees them through the selected backend.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "gpumem/export.hpp"

namespace gpumem {

struct memory_info {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
};

GPUMEM_EXPORT int device_count();
// Device of the calling thread's current context; 0 when none is current (as the CUDA runtime).
GPUMEM_EXPORT int current_device();
// Makes `device`'s primary context current on the calling thread (as cudaSetDevice).
GPUMEM_EXPORT void set_current_device(int device);
// Device of the calling thread's current context, or nullopt when none is current.
GPUMEM_EXPORT std::optional<int> current_context_device();
// Makes `device`'s primary context current when the calling thread has none, as the
// CUDA runtime does at its first call on a thread; a thread with a current context
// keeps it. Returns whether it made one current.
GPUMEM_EXPORT bool adopt_primary_context(int device);
GPUMEM_EXPORT memory_info device_memory_info(int device);
GPUMEM_EXPORT std::string device_name(int device);
// The other devices whose work can reach `device`'s memory (cuDeviceCanAccessPeer:
// NVLink or PCIe peer access), in ordinal order; empty on a machine of one GPU.
GPUMEM_EXPORT std::vector<int> peers_of(int device);
// Version of the CUDA driver (e.g. 13000), or the simulator's.
GPUMEM_EXPORT int driver_version();

}  // namespace gpumem
