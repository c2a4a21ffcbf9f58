// The resource each device's memory comes from when a caller names none: what
// device_buffer, the Python package and the Numba/CuPy/PyTorch hooks use.
//
// Default, made on first use per device: what GPUMEM_CONF describes when it is
// set (docs/configuration.md), else make_default_resource(device). Thread-safe: getting and setting may race
// with each other and with allocations through the previous resource, which stays
// alive while anyone holds it.
#pragma once

#include <memory>

#include "gpumem/export.hpp"
#include "gpumem/memory_resource.hpp"

namespace gpumem {

// The stack every device gets when GPUMEM_CONF is unset: a vmm_pool_resource
// (docs/vmm.md), frugal and fast, or, on a device without virtual memory
// management, a pool_resource over cuda_resource. A new one on every call.
GPUMEM_EXPORT std::shared_ptr<memory_resource> make_default_resource(int device = -1);

// The current resource of `device` (-1: the current device).
GPUMEM_EXPORT std::shared_ptr<memory_resource> get_current_resource(int device = -1);

// Makes `resource` current for `device` (-1: the current device) and returns the
// previous one. A null resource restores the default. The resource must hand out
// memory of that device: logic_error otherwise.
GPUMEM_EXPORT std::shared_ptr<memory_resource> set_current_resource(
    int device, std::shared_ptr<memory_resource> resource);

}  // namespace gpumem
