"""gpumem: a GPU memory manager for CUDA, and one memory pool for Numba, CuPy and PyTorch.

Importing gpumem loads its C++ library and nothing else: no CUDA call is made
until memory, a stream or a device is first asked for, and numba, cupy and torch
are imported only by the modules named after them (gpumem.numba, gpumem.cupy,
gpumem.torch). See docs/python.md.
"""

from gpumem._core import (
    LEGACY_DEFAULT_STREAM,
    PER_THREAD_DEFAULT_STREAM,
    CudaError,
    CudaResource,
    DeviceBuffer,
    DriverUnavailableError,
    GpumemError,
    LogicError,
    MemoryResource,
    OutOfMemoryError,
    PoolResource,
    ResourceProperties,
    Stream,
    UnsupportedError,
    VmmPoolResource,
    __version__,
    cuda_driver_usable,
    current_backend,
    current_device,
    device_count,
    device_memory_info,
    device_name,
    peers_of,
    driver_version,
    get_current_resource,
    memory_info,
    select_backend,
    set_current_device,
    sim,
)
from gpumem import _core

# The simulator's controls are a submodule of the extension: registered so that
# `import gpumem.sim` and `from gpumem.sim import ...` work as the docs write them.
import sys as _sys

_sys.modules[__name__ + ".sim"] = sim

# Devices whose current resource was chosen through set_current_resource (not the
# default gpumem makes). gpumem.numba's reset() replaces only a default resource.
_chosen_by_caller = set()


def set_current_resource(resource, device=None):
    """Makes `resource` current for `device` (None: the current device) and returns the
    previous one. None restores the default (made again on next use)."""
    d = current_device() if device is None else device
    previous = _core.set_current_resource(resource, d)
    if resource is None:
        _chosen_by_caller.discard(d)
    else:
        _chosen_by_caller.add(d)
    return previous


__all__ = [
    "LEGACY_DEFAULT_STREAM",
    "PER_THREAD_DEFAULT_STREAM",
    "CudaError",
    "CudaResource",
    "DeviceBuffer",
    "DriverUnavailableError",
    "GpumemError",
    "LogicError",
    "MemoryResource",
    "OutOfMemoryError",
    "PoolResource",
    "ResourceProperties",
    "Stream",
    "UnsupportedError",
    "VmmPoolResource",
    "__version__",
    "cuda_driver_usable",
    "current_backend",
    "current_device",
    "device_count",
    "device_memory_info",
    "device_name",
    "peers_of",
    "driver_version",
    "get_current_resource",
    "memory_info",
    "select_backend",
    "set_current_device",
    "set_current_resource",
    "sim",
]
