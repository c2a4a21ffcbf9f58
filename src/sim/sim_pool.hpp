// A device's default memory pool (cuDeviceGetDefaultMemPool): its settable
// attributes and its usage report. Stream-ordered allocations are placed and
// counted by the device's address space; this pool does no caching or reuse yet.
#pragma once

#include <mutex>

#include <cuda.h>

#include "sim/sim_address_space.hpp"

namespace gpumem::detail::simulator {

class sim_pool {
 public:
  explicit sim_pool(device_address_space& memory) : memory_(memory) {}
  int device() const { return memory_.device(); }

  // CU_MEMPOOL_ATTR_*, with the value types and rules cuda.h documents;
  // CUDA_ERROR_INVALID_VALUE for anything else.
  CUresult set_attribute(CUmemPool_attribute attribute, void* value);
  CUresult get_attribute(CUmemPool_attribute attribute, void* value) const;

 private:
  device_address_space& memory_;
  mutable std::mutex mutex_;
  cuuint64_t release_threshold_ = 0;
  int reuse_follow_event_dependencies_ = 1;
  int reuse_allow_opportunistic_ = 1;
  int reuse_allow_internal_dependencies_ = 1;
};

}  // namespace gpumem::detail::simulator
