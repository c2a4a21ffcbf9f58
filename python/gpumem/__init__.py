"""gpumem: a GPU memory manager for CUDA, and one memory pool for Numba, CuPy and PyTorch.

Importing gpumem loads its C++ library and nothing else: no CUDA call is made
until memory, a stream or a device is first asked for, and numba, cupy and torch
are imported only by the modules named after them (gpumem.numba, gpumem.cupy,
gpumem.torch), Dask's distributed only by gpumem.dask. See docs/python.md.
"""

from gpumem._core import (
    LEGACY_DEFAULT_STREAM,
    PER_THREAD_DEFAULT_STREAM,
    AsyncResource,
    AsyncReusePolicy,
    CudaError,
    CudaResource,
    DeferCleanup,
    DeferredFreeAdaptor,
    DeviceBuffer,
    DriverUnavailableError,
    GpumemError,
    HostRegistration,
    LimitingAdaptor,
    LoggingAdaptor,
    LogicError,
    ManagedResource,
    MemoryResource,
    OomEvent,
    OomRetryAdaptor,
    OutOfMemoryError,
    PinnedHostResource,
    PoolResource,
    ResourceAdaptor,
    ResourceProperties,
    StatisticsAdaptor,
    StatisticsScope,
    Stream,
    ThreadSafeAdaptor,
    TrackingAdaptor,
    UnsupportedError,
    VmmPoolResource,
    __version__,
    cuda_driver_usable,
    current_backend,
    current_context_device,
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
from gpumem._profile import ProfileRecords, profile, profile_records

# The simulator's controls are a submodule of the extension: registered so that
# `import gpumem.sim` and `from gpumem.sim import ...` work as the docs write them.
import sys as _sys

_sys.modules[__name__ + ".sim"] = sim

# gpumem's diagnostics (leak reports, statistics at exit, failures in destructors)
# go to the logger "gpumem" while the interpreter runs, and to stderr after it
# (python/src/diagnostics.cpp, Note [Diagnostics into logging]). Without a
# handler configured, logging's last resort prints warnings and errors to stderr.
import atexit as _atexit
import logging as _logging

_core._route_diagnostics(_logging.getLogger("gpumem"))
_atexit.register(_core._stop_routing_diagnostics)

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


def _conf_text(conf, options):
    parts = [conf or "default"]
    for name, value in options.items():
        if value is None or value is False:
            continue
        parts.append(name if value is True else "%s=%s" % (name, value))
    return ",".join(parts)


def make_resource(conf=None, device=None, **options):
    """The resource stack that `conf` describes in GPUMEM_CONF's grammar
    (docs/configuration.md), on `device` (None: the current device). Keywords add options:
    ``make_resource("pool", maximum="40%", stats=True)`` is ``"pool,maximum=40%,stats"``
    (True: a flag; None or False: left out). `conf` None is ``"default"``."""
    return _core.make_resource(_conf_text(conf, options), -1 if device is None else device)


def describe_config(conf=None, **options):
    """What make_resource would build, as text (``"stats(pool(cuda))"``), building nothing."""
    return _core.describe_config(_conf_text(conf, options))


def reinitialize(conf=None, devices=None, **options):
    """Makes the stack that `conf` and the keywords describe (as make_resource) the current
    resource of each device in `devices` (an ordinal, a list, or None: every device), as
    GPUMEM_CONF does at start. The string is checked first: a bad one changes nothing.
    Memory from the previous resources stays valid and goes back to them when freed."""
    text = _conf_text(conf, options)
    _core.describe_config(text)
    if devices is None:
        devices = range(device_count())
    elif isinstance(devices, int):
        devices = [devices]
    for d in devices:
        set_current_resource(_core.make_resource(text, d), d)


def stack_report(device=None, resource=None):
    """What a resource stack has counted, as a dict: ``stack`` (its layers, as
    describe_config writes them, e.g. ``"log(stats(limit(pool(log(cuda)))))"``), ``device``,
    ``statistics`` (the outermost statistics adaptor's ``current_bytes``, ``peak_bytes``,
    ``total_bytes``, ``current_count``, ``peak_count``, ``total_count``; None without
    ``stats``), ``limit_bytes`` and ``limit_used_bytes`` (a ``limit``; None without),
    ``used_bytes``, ``reserved_bytes`` and ``maximum_bytes`` (the base resource: what it hands
    out, what it holds from the device, its budget or None), ``peak_reserved_bytes`` (the
    most the base held at once since it was made or its peak was reset; None where it keeps
    no peak: CudaResource, ManagedResource), ``logs`` (the paths of its
    event logs) and ``log_events``. Reads `resource`, or the current resource of `device`
    (None: the current device). Nothing is allocated."""
    if resource is None:
        resource = get_current_resource(current_device() if device is None else device)
    return _core._stack_report(resource)


def flush_logs(device=None, resource=None):
    """Writes every pending event of the event logs in a stack (`resource`, or the current
    resource of `device`) to their files now, and returns their paths. Logs are otherwise
    written as each thread's buffer fills, about once a second while a thread allocates,
    and at exit (docs/observability.md)."""
    if resource is None:
        resource = get_current_resource(current_device() if device is None else device)
    return _core._flush_logs(resource)


__all__ = [
    "LEGACY_DEFAULT_STREAM",
    "PER_THREAD_DEFAULT_STREAM",
    "AsyncResource",
    "AsyncReusePolicy",
    "CudaError",
    "CudaResource",
    "DeferCleanup",
    "DeferredFreeAdaptor",
    "DeviceBuffer",
    "DriverUnavailableError",
    "GpumemError",
    "HostRegistration",
    "LimitingAdaptor",
    "LoggingAdaptor",
    "LogicError",
    "ManagedResource",
    "MemoryResource",
    "OomEvent",
    "OomRetryAdaptor",
    "OutOfMemoryError",
    "PinnedHostResource",
    "PoolResource",
    "ProfileRecords",
    "ResourceAdaptor",
    "ResourceProperties",
    "StatisticsAdaptor",
    "StatisticsScope",
    "Stream",
    "ThreadSafeAdaptor",
    "TrackingAdaptor",
    "UnsupportedError",
    "VmmPoolResource",
    "__version__",
    "cuda_driver_usable",
    "current_backend",
    "current_context_device",
    "current_device",
    "describe_config",
    "device_count",
    "device_memory_info",
    "device_name",
    "peers_of",
    "driver_version",
    "flush_logs",
    "get_current_resource",
    "make_resource",
    "memory_info",
    "profile",
    "profile_records",
    "reinitialize",
    "select_backend",
    "set_current_device",
    "set_current_resource",
    "sim",
    "stack_report",
]
