// Device memory entry points (cuMemAlloc, cuMemAllocManaged, cuMemFree,
// cuMemGetInfo, cuMemGetAddressRange, cuPointerGetAttribute) and the cross-device lookups
// they and the copies share (see sim_memory.hpp).
#include "sim/sim_memory.hpp"

#include <limits>

#include "sim/sim_capture_rules.hpp"
#include "sim/sim_entry_points.hpp"
#include "sim/sim_state.hpp"

namespace gpumem::detail::simulator {

CUresult allocate_device_memory(sim_state& state, sim_device& device, std::size_t bytes,
                                allocation_kind kind, CUdeviceptr* out, unsigned attach) {
  if (out == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (state.faults.should_fail_allocation()) return CUDA_ERROR_OUT_OF_MEMORY;
  return device.memory.allocate(bytes, kind, attach, out);
}

std::optional<allocation> find_allocation(sim_state& state, CUdeviceptr pointer) {
  for (int ordinal = 0; ordinal < state.device_count(); ++ordinal) {
    if (auto found = state.device(ordinal)->memory.find(pointer)) return found;
  }
  // A virtual-memory mapping answers pointer queries like device memory (sim_vmm.hpp).
  if (auto mapped = state.vmm->find(pointer)) {
    allocation a;
    a.base = mapped->base;
    a.size = mapped->size;
    a.footprint = mapped->size;
    a.device = mapped->device;
    return a;
  }
  return std::nullopt;
}

CUresult check_access(sim_state& state, CUdeviceptr pointer, std::size_t bytes) {
  if (bytes == 0) return CUDA_SUCCESS;
  if (pointer > std::numeric_limits<CUdeviceptr>::max() - bytes) return CUDA_ERROR_INVALID_VALUE;
  for (int ordinal = 0; ordinal < state.device_count(); ++ordinal) {
    const device_address_space& memory = state.device(ordinal)->memory;
    if (!memory.overlaps_reserved_range(pointer, bytes)) continue;
    auto a = memory.find(pointer);
    if (!a || a->free_pending || bytes > a->size - (pointer - a->base)) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
  }
  if (state.vmm->overlaps(pointer, bytes)) return state.vmm->check_access(pointer, bytes);
  return CUDA_SUCCESS;  // host memory
}

// ---- entry points ----

CUresult mem_alloc(CUdeviceptr* pointer, std::size_t bytes) {
  return entry_point([&](sim_state& state) {
    sim_context* context = nullptr;
    if (CUresult r = require_current_context(context); r != CUDA_SUCCESS) return r;
    if (CUresult r = unsafe_call_permitted(); r != CUDA_SUCCESS) return r;  // sim_capture_rules.hpp
    return allocate_device_memory(state, *state.device(context->device()), bytes,
                                  allocation_kind::synchronous, pointer);
  });
}

CUresult mem_alloc_managed(CUdeviceptr* pointer, std::size_t bytes, unsigned int flags) {
  return entry_point([&](sim_state& state) {
    sim_context* context = nullptr;
    if (CUresult r = require_current_context(context); r != CUDA_SUCCESS) return r;
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = unsafe_call_permitted(); r != CUDA_SUCCESS) return r;  // sim_capture_rules.hpp
    // Placed in the current context's device memory and counted against its
    // capacity: no oversubscription, no migration (docs/simulator.md).
    return allocate_device_memory(state, *state.device(context->device()), bytes,
                                  allocation_kind::managed, pointer, flags);
  });
}

CUresult mem_free(CUdeviceptr pointer) {
  return entry_point([&](sim_state& state) {
    sim_context* context = nullptr;
    if (CUresult r = require_current_context(context); r != CUDA_SUCCESS) return r;
    auto a = find_allocation(state, pointer);
    if (!a || a->base != pointer || a->free_pending) return CUDA_ERROR_INVALID_VALUE;
    if (a->kind == allocation_kind::stream_ordered) return CUDA_ERROR_INVALID_VALUE;  // cuMemFreeAsync's
    if (a->kind == allocation_kind::graph) return CUDA_ERROR_INVALID_VALUE;           // cuMemFreeAsync's
    if (state.vmm->find(pointer)) return CUDA_ERROR_INVALID_VALUE;                    // cuMemUnmap's
    if (CUresult r = unsafe_call_permitted(); r != CUDA_SUCCESS) return r;  // sim_capture_rules.hpp
    // The real cuMemFree synchronizes the device first; this also keeps queued
    // host functions and copies from touching pages that are about to fault.
    sim_device& owner = *state.device(a->device);
    owner.context.synchronize();
    return owner.memory.free(pointer);
  });
}

CUresult mem_get_info(std::size_t* free, std::size_t* total) {
  return entry_point([&](sim_state& state) {
    sim_context* context = nullptr;
    if (CUresult r = require_current_context(context); r != CUDA_SUCCESS) return r;
    if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const device_address_space& memory = state.device(context->device())->memory;
    *total = memory.capacity();
    *free = memory.capacity() - memory.used_bytes();
    return CUDA_SUCCESS;
  });
}

CUresult mem_get_address_range(CUdeviceptr* base, std::size_t* size, CUdeviceptr pointer) {
  return entry_point([&](sim_state& state) {
    sim_context* context = nullptr;
    if (CUresult r = require_current_context(context); r != CUDA_SUCCESS) return r;
    auto a = find_allocation(state, pointer);
    if (!a) return CUDA_ERROR_NOT_FOUND;
    if (base != nullptr) *base = a->base;  // either output may be null, as in CUDA
    if (size != nullptr) *size = a->size;
    return CUDA_SUCCESS;
  });
}

namespace {

// cuPointerGetAttribute for page-locked host memory (allocated or registered).
CUresult host_pointer_attribute(sim_state& state, const host_range& range, void* data,
                                CUpointer_attribute attribute, CUdeviceptr pointer) {
  // `pointer` may be the host or the device address of the range.
  const std::uintptr_t offset = range.contains(pointer) ? pointer - range.base : pointer - range.device_base;
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *static_cast<CUcontext*>(data) = to_handle(&state.device(range.device)->context);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned int*>(data) = CU_MEMORYTYPE_HOST;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      if (current_context() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
      *static_cast<CUdeviceptr*>(data) = range.device_base + offset;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      *static_cast<void**>(data) = reinterpret_cast<void*>(range.base + offset);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = range.device;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) = range.contains(pointer) ? range.base : range.device_base;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<std::size_t*>(data) = range.size;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      *static_cast<bool*>(data) = false;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
      *static_cast<bool*>(data) = true;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
      *static_cast<CUmemoryPool*>(data) = nullptr;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

}  // namespace

CUresult pointer_get_attribute(void* data, CUpointer_attribute attribute, CUdeviceptr pointer) {
  return entry_point([&](sim_state& state) {
    if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto a = find_allocation(state, pointer);
    if (!a) {
      if (auto range = state.host.find(pointer)) return host_pointer_attribute(state, *range, data, attribute, pointer);
      return CUDA_ERROR_INVALID_VALUE;  // memory the driver does not know
    }
    switch (attribute) {
      case CU_POINTER_ATTRIBUTE_CONTEXT:
        *static_cast<CUcontext*>(data) = to_handle(&state.device(a->device)->context);
        return CUDA_SUCCESS;
      case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        // Managed memory too: IS_MANAGED tells it apart (the runtime reports it as managed from that).
        *static_cast<unsigned int*>(data) = CU_MEMORYTYPE_DEVICE;
        return CUDA_SUCCESS;
      case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        // "as seen from the current context", so the driver wants one.
        if (current_context() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
        *static_cast<CUdeviceptr*>(data) = pointer;  // unified addressing: the same value
        return CUDA_SUCCESS;
      case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        // Only managed memory has a host view; device memory has none.
        if (a->kind != allocation_kind::managed) return CUDA_ERROR_INVALID_VALUE;
        *static_cast<void**>(data) = reinterpret_cast<void*>(pointer);
        return CUDA_SUCCESS;
      case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *static_cast<int*>(data) = a->device;
        return CUDA_SUCCESS;
      case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *static_cast<CUdeviceptr*>(data) = a->base;
        return CUDA_SUCCESS;
      case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *static_cast<std::size_t*>(data) = a->size;
        return CUDA_SUCCESS;
      case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *static_cast<bool*>(data) = a->kind == allocation_kind::managed;
        return CUDA_SUCCESS;
      case CU_POINTER_ATTRIBUTE_MAPPED:
        *static_cast<bool*>(data) = true;
        return CUDA_SUCCESS;
      case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        *static_cast<CUmemoryPool*>(data) = a->kind == allocation_kind::stream_ordered ? a->pool->handle() : nullptr;
        return CUDA_SUCCESS;
      default:
        return CUDA_ERROR_INVALID_VALUE;  // not modelled (P2P tokens, IPC, buffer ids...)
    }
  });
}

}  // namespace gpumem::detail::simulator
