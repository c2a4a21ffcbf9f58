// Default memory pools and stream-ordered allocation (cuMemAllocAsync,
// cuMemFreeAsync, pool attributes). For now an allocation is made at once with
// cuMemAlloc's accounting and fault injection, and a free returns the memory
// when its stream reaches it; the driver's caching and reuse are not modelled yet.
#include "sim/sim_pool.hpp"

#include "sim/sim_entry_points.hpp"
#include "sim/sim_memory.hpp"
#include "sim/sim_state.hpp"
#include "sim/sim_stream.hpp"

namespace gpumem::detail::simulator {

CUresult sim_pool::set_attribute(CUmemPool_attribute attribute, void* value) {
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(mutex_);
  switch (attribute) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      release_threshold_ = *static_cast<cuuint64_t*>(value);
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
      reuse_follow_event_dependencies_ = *static_cast<int*>(value);
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
      reuse_allow_opportunistic_ = *static_cast<int*>(value);
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      reuse_allow_internal_dependencies_ = *static_cast<int*>(value);
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      // A high watermark can only be reset, by setting 0.
      if (*static_cast<cuuint64_t*>(value) != 0) return CUDA_ERROR_INVALID_VALUE;
      if (attribute == CU_MEMPOOL_ATTR_USED_MEM_HIGH) {
        memory_.reset_used_high();
      } else {
        memory_.reset_reserved_high();
      }
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;  // the *_CURRENT values are read-only
  }
}

CUresult sim_pool::get_attribute(CUmemPool_attribute attribute, void* value) const {
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(mutex_);
  // Without caching, the pool reserves exactly what is in use.
  const pool_usage usage = memory_.stream_ordered_usage();
  switch (attribute) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      *static_cast<cuuint64_t*>(value) = release_threshold_;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
      *static_cast<int*>(value) = reuse_follow_event_dependencies_;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
      *static_cast<int*>(value) = reuse_allow_opportunistic_;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      *static_cast<int*>(value) = reuse_allow_internal_dependencies_;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
      *static_cast<cuuint64_t*>(value) = usage.current;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      *static_cast<cuuint64_t*>(value) = usage.reserved_high;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      *static_cast<cuuint64_t*>(value) = usage.used_high;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

// ---- entry points ----

CUresult mem_alloc_async(CUdeviceptr* pointer, std::size_t bytes, CUstream stream_handle) {
  return entry_point([&](sim_state& state) {
    std::shared_ptr<sim_stream> stream;
    if (CUresult r = resolve_stream(state, stream_handle, stream); r != CUDA_SUCCESS) return r;
    sim_context* context = nullptr;
    if (CUresult r = require_current_context(context); r != CUDA_SUCCESS) return r;
    // The pool is the stream's device's; gpumem always has that device current.
    if (stream->device() != context->device()) return CUDA_ERROR_INVALID_VALUE;
    // Allocated at once: usable by work queued after this call on any stream.
    return allocate_device_memory(state, *state.device(stream->device()), bytes,
                                  allocation_kind::stream_ordered, pointer);
  });
}

CUresult mem_free_async(CUdeviceptr pointer, CUstream stream_handle) {
  return entry_point([&](sim_state& state) {
    std::shared_ptr<sim_stream> stream;
    if (CUresult r = resolve_stream(state, stream_handle, stream); r != CUDA_SUCCESS) return r;
    auto a = find_allocation(state, pointer);
    if (!a || a->base != pointer) return CUDA_ERROR_INVALID_VALUE;
    // Marked now, so a second free, or a copy queued after this one, is refused at the call.
    device_address_space& memory = state.device(a->device)->memory;
    if (CUresult r = memory.mark_free_pending(pointer); r != CUDA_SUCCESS) return r;
    // The memory returns when the stream reaches the free.
    CUresult r = enqueue(stream, [&memory, pointer] { memory.complete_pending_free(pointer); });
    if (r != CUDA_SUCCESS) memory.cancel_pending_free(pointer);
    return r;
  });
}

CUresult device_get_default_mem_pool(CUmemoryPool* pool, CUdevice device) {
  return entry_point([&](sim_state& state) {
    if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
    sim_device* d = state.device(device);
    if (d == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    *pool = reinterpret_cast<CUmemoryPool>(&d->default_pool);
    return CUDA_SUCCESS;
  });
}

CUresult mem_pool_set_attribute(CUmemoryPool pool, CUmemPool_attribute attribute, void* value) {
  return entry_point([&](sim_state& state) {
    sim_pool* p = state.find_pool(pool);
    return p != nullptr ? p->set_attribute(attribute, value) : CUDA_ERROR_INVALID_VALUE;
  });
}

CUresult mem_pool_get_attribute(CUmemoryPool pool, CUmemPool_attribute attribute, void* value) {
  return entry_point([&](sim_state& state) {
    sim_pool* p = state.find_pool(pool);
    return p != nullptr ? p->get_attribute(attribute, value) : CUDA_ERROR_INVALID_VALUE;
  });
}

CUresult mem_pool_trim_to(CUmemoryPool pool, std::size_t /*min_bytes_to_keep*/) {
  return entry_point([&](sim_state& state) {
    // Nothing is cached, so there is nothing to trim.
    return state.find_pool(pool) != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  });
}

}  // namespace gpumem::detail::simulator
