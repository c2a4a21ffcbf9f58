"""gpumem as PyTorch's CUDA allocator, and PyTorch's memory figures from gpumem.

    import gpumem.torch
    gpumem.torch.use_gpumem_for_torch()   # before PyTorch's first CUDA allocation

This loads libgpumem_torch.so (beside gpumem's extension) into
torch.cuda.memory.CUDAPluggableAllocator: its C entry points

    void* gpumem_torch_alloc(size_t size, int device, cudaStream_t stream)
    void  gpumem_torch_free(void* ptr, size_t size, int device, cudaStream_t stream)
    void  gpumem_torch_empty_cache(void)      (the allocator's reset_fn)

allocate from the current gpumem resource of `device` on PyTorch's current stream,
free on the stream PyTorch passes back, and make torch.cuda.empty_cache() give the
free memory of gpumem's pools back to the device. Size 0 gives a null pointer and
allocates nothing, as PyTorch's own allocator does.

PyTorch's own torch.cuda.memory_stats() and its kin refuse to work with a pluggable
allocator; memory_stats(), memory_allocated(), max_memory_allocated(),
memory_reserved(), reset_peak_memory_stats() and reset_accumulated_memory_stats()
here answer with torch's key names. An out-of-memory inside a PyTorch allocation
reaches Python as RuntimeError with gpumem's explanation; translate_out_of_memory()
makes it torch.OutOfMemoryError and last_out_of_memory() gives its figures (Note [Out
of memory inside a PyTorch allocation] in python/src/torch_allocator.cpp says why).
See docs/python-frameworks.md, "PyTorch". torch is imported only by use_gpumem_for_torch() and
by translate_out_of_memory() when it has an error to translate.
"""

import contextlib
import ctypes
import os
import sys

import gpumem
from gpumem import _core

__all__ = [
    "ALLOC_SYMBOL",
    "EMPTY_CACHE_SYMBOL",
    "FREE_SYMBOL",
    "last_out_of_memory",
    "library_path",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "translate_out_of_memory",
    "use_gpumem_for_torch",
]

ALLOC_SYMBOL = "gpumem_torch_alloc"
FREE_SYMBOL = "gpumem_torch_free"
EMPTY_CACHE_SYMBOL = "gpumem_torch_empty_cache"

# What gpumem's out-of-memory message starts with (src/error.cpp), and so what PyTorch's
# RuntimeError carries when the hook ran out of memory.
OUT_OF_MEMORY_TEXT = "gpumem: out of memory"


def library_path():
    """Absolute path of the shared library holding the entry points."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libgpumem_torch.so")


def use_gpumem_for_torch():
    """Makes gpumem PyTorch's CUDA allocator, with torch.cuda.empty_cache() connected to
    gpumem's release_free_memory(), and returns the CUDAPluggableAllocator. PyTorch
    refuses (RuntimeError) once its own allocator has been used in the process."""
    import torch

    allocator = torch.cuda.memory.CUDAPluggableAllocator(library_path(), ALLOC_SYMBOL, FREE_SYMBOL)
    # The C++ allocator behind it (torch.cuda.memory._CUDAAllocator.allocator()) takes the
    # address of a void(void) function as its reset_fn, which emptyCache() calls.
    inner = getattr(allocator, "allocator", None)
    set_reset_fn = getattr(inner() if callable(inner) else None, "set_reset_fn", None)
    if set_reset_fn is not None:
        set_reset_fn(ctypes.cast(getattr(_lib(), EMPTY_CACHE_SYMBOL), ctypes.c_void_p).value)
    torch.cuda.memory.change_current_allocator(allocator)
    return allocator


# ---- the library, through ctypes ---------------------------------------------------


class _Counters(ctypes.Structure):
    """gpumem_torch_counters (python/src/torch_allocator.cpp)."""

    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "current_bytes", "peak_bytes", "allocated_bytes", "freed_bytes",
            "current_count", "peak_count", "allocated_count", "freed_count",
            "ooms", "released_bytes",
        )
    ]


class _Oom(ctypes.Structure):
    """gpumem_torch_oom (python/src/torch_allocator.cpp)."""

    _fields_ = [
        ("serial", ctypes.c_uint64),
        ("requested_bytes", ctypes.c_uint64),
        ("device", ctypes.c_int64),
        ("resource_held_bytes", ctypes.c_uint64),
        ("device_free_bytes", ctypes.c_uint64),
        ("device_total_bytes", ctypes.c_uint64),
    ]


_library = None


def _lib():
    """libgpumem_torch.so, loaded once (the same copy PyTorch loads: one path, one handle)."""
    global _library
    if _library is None:
        lib = ctypes.CDLL(library_path())
        lib.gpumem_torch_layout.restype = ctypes.c_uint32
        layout = lib.gpumem_torch_layout()
        if layout != ctypes.sizeof(_Counters) | (ctypes.sizeof(_Oom) << 16):
            raise ImportError("gpumem.torch: %s does not match this module (layout %#x)" % (library_path(), layout))
        lib.gpumem_torch_get_counters.argtypes = [ctypes.c_int, ctypes.POINTER(_Counters)]
        lib.gpumem_torch_get_counters.restype = None
        lib.gpumem_torch_reset_peaks.argtypes = [ctypes.c_int]
        lib.gpumem_torch_reset_peaks.restype = None
        lib.gpumem_torch_reset_totals.argtypes = [ctypes.c_int]
        lib.gpumem_torch_reset_totals.restype = None
        lib.gpumem_torch_last_out_of_memory.argtypes = [
            ctypes.c_int, ctypes.POINTER(_Oom), ctypes.c_char_p, ctypes.c_size_t]
        lib.gpumem_torch_last_out_of_memory.restype = ctypes.c_size_t
        _library = lib
    return _library


def _counters(device):
    c = _Counters()
    _lib().gpumem_torch_get_counters(device, ctypes.byref(c))
    return {name: getattr(c, name) for name, _ in _Counters._fields_}


def _device_index(device):
    """An ordinal from what torch.cuda's functions take: None (PyTorch's current device once
    it has initialised CUDA, else gpumem's), an int, "cuda" / "cuda:N", or a torch.device."""
    if device is None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            return torch.cuda.current_device()
        return gpumem.current_device()
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    kind, index = (device.split(":", 1) + [None])[:2] if isinstance(device, str) else (
        getattr(device, "type", None), getattr(device, "index", None))
    if kind != "cuda":
        raise ValueError("gpumem.torch: not a CUDA device: %r" % (device,))
    return _device_index(None) if index is None else int(index)


# ---- torch.cuda.memory_stats and its kin -------------------------------------------


def _memory_stats_from(counters, stack, available_bytes=None):
    """torch.cuda.memory_stats()' keys from what PyTorch holds through the hook
    (`counters`: gpumem_torch_counters as a dict) and what its resource stack says
    (`stack`: a gpumem.stack_report dict; `available_bytes`: the stack's
    available_bytes()). Keys whose figure gpumem does not have are left out rather than
    made up; gpumem's own figures follow under "gpumem.". Sorted, as torch's."""
    stats = {}
    for what in ("allocated_bytes", "requested_bytes"):  # PyTorch's request, as it asked
        stats[what + ".all.current"] = counters["current_bytes"]
        stats[what + ".all.peak"] = counters["peak_bytes"]
        stats[what + ".all.allocated"] = counters["allocated_bytes"]
        stats[what + ".all.freed"] = counters["freed_bytes"]
    stats["allocation.all.current"] = counters["current_count"]
    stats["allocation.all.peak"] = counters["peak_count"]
    stats["allocation.all.allocated"] = counters["allocated_count"]
    stats["allocation.all.freed"] = counters["freed_count"]
    stats["num_ooms"] = counters["ooms"]
    if stack.get("reserved_bytes") is not None:
        stats["reserved_bytes.all.current"] = stack["reserved_bytes"]
    if stack.get("peak_reserved_bytes") is not None:
        stats["reserved_bytes.all.peak"] = stack["peak_reserved_bytes"]
    stats["gpumem.released_bytes"] = counters["released_bytes"]
    for key in ("used_bytes", "maximum_bytes", "limit_bytes", "limit_used_bytes"):
        if stack.get(key) is not None:
            stats["gpumem." + key] = stack[key]
    if available_bytes is not None:
        stats["gpumem.available_bytes"] = available_bytes
    for key, value in (stack.get("statistics") or {}).items():
        stats["gpumem.stats." + key] = value
    return dict(sorted(stats.items()))


def memory_stats(device=None):
    """PyTorch's memory figures on `device`, under torch.cuda.memory_stats()' keys:

    - ``allocated_bytes.all.{current,peak,allocated,freed}`` and the same
      ``requested_bytes.all.*``: the bytes PyTorch's tensors hold through gpumem (as
      PyTorch asked for them; the pool's rounding shows in ``reserved_bytes``);
      ``allocation.all.*`` the same as counts; ``num_ooms``: allocations gpumem refused.
    - ``reserved_bytes.all.current``: what the current resource stack of `device` holds
      from the device (its base pool's reserved or mapped bytes), for every user of the
      stack (Numba and CuPy too, when they share it); ``reserved_bytes.all.peak``: the most
      it held at once (where the base keeps a peak: the pools and AsyncResource).
    - ``gpumem.*``: ``released_bytes`` (given back by empty_cache), the base's
      ``used_bytes`` and ``maximum_bytes``, a limit's ``limit_bytes`` and
      ``limit_used_bytes``, ``available_bytes`` (what the stack could still hand out)
      and, with a statistics adaptor, ``stats.*`` (its counters: every user's).

    Left out, having no figure in gpumem: ``num_alloc_retries`` (the pool's slow path does not count
    its retries), the large/small pool split and the segment counts."""
    d = _device_index(device)
    resource = gpumem.get_current_resource(d)
    try:
        available = resource.available_bytes()
    except gpumem.GpumemError:
        available = None
    return _memory_stats_from(_counters(d), gpumem.stack_report(resource=resource), available)


def memory_allocated(device=None):
    """Bytes PyTorch's tensors hold through gpumem on `device` now."""
    return _counters(_device_index(device))["current_bytes"]


def max_memory_allocated(device=None):
    """The most bytes PyTorch's tensors held through gpumem on `device` at once, since
    the start or the last reset_peak_memory_stats()."""
    return _counters(_device_index(device))["peak_bytes"]


def memory_reserved(device=None):
    """Bytes the current resource stack of `device` holds from the device (for all its
    users). gpumem.UnsupportedError where its base resource cannot say."""
    d = _device_index(device)
    reserved = gpumem.stack_report(device=d)["reserved_bytes"]
    if reserved is None:
        raise gpumem.UnsupportedError("gpumem.torch: the current resource of device %d cannot say what it holds" % d)
    return reserved


def max_memory_reserved(device=None):
    """The most bytes the current resource stack of `device` held from the device at once
    (for all its users), since it was made or the last reset_peak_memory_stats().
    gpumem.UnsupportedError where its base resource keeps no peak (CudaResource,
    ManagedResource: a stack with ``log`` records every allocation, and gpumem-report
    shows the peak, docs/observability.md)."""
    d = _device_index(device)
    peak = gpumem.stack_report(device=d)["peak_reserved_bytes"]
    if peak is None:
        raise gpumem.UnsupportedError(
            "gpumem.torch: the current resource of device %d keeps no peak of what it holds; use "
            "max_memory_allocated(), or log the stack (GPUMEM_CONF=...,log=FILE) and read the peak "
            "with gpumem-report" % d)
    return peak


def reset_peak_memory_stats(device=None):
    """The peaks of ``allocated_bytes``, ``requested_bytes`` and ``allocation`` restart
    from what PyTorch holds now, and ``reserved_bytes``' from what the current resource
    stack of `device` holds (where its base keeps a peak)."""
    d = _device_index(device)
    _lib().gpumem_torch_reset_peaks(d)
    _core._reset_reserved_peak(gpumem.get_current_resource(d))


def reset_accumulated_memory_stats(device=None):
    """The totals (``*.allocated``, ``*.freed``), ``num_ooms`` and ``gpumem.released_bytes``
    start again from 0."""
    _lib().gpumem_torch_reset_totals(_device_index(device))


# ---- out of memory -------------------------------------------------------------------


def last_out_of_memory(any_thread=False):
    """The latest out-of-memory of a PyTorch allocation through gpumem, as a
    gpumem.OutOfMemoryError (not raised) with its figures (requested_bytes, device,
    resource, resource_held_bytes, device_free_bytes, device_total_bytes, reason), or None.
    The calling thread's; with any_thread=True the process's (PyTorch's autograd engine
    allocates the backward pass on threads of its own)."""
    lib = _lib()
    oom = _Oom()
    capacity = 4096
    while True:
        texts = ctypes.create_string_buffer(capacity)
        need = lib.gpumem_torch_last_out_of_memory(1 if any_thread else 0, ctypes.byref(oom), texts, capacity)
        if need <= capacity:
            break
        capacity = need
    if oom.serial == 0:
        return None
    message, resource, reason = (part.decode("utf-8", "replace") for part in texts.raw[:need].split(b"\0")[:3])
    error = gpumem.OutOfMemoryError(message)
    error.requested_bytes = oom.requested_bytes
    error.device = oom.device
    error.resource = resource
    error.resource_held_bytes = oom.resource_held_bytes
    error.device_free_bytes = oom.device_free_bytes
    error.device_total_bytes = oom.device_total_bytes
    error.reason = reason
    return error


def _torch_out_of_memory_type():
    import torch

    return getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError


def _as_torch_out_of_memory(exc, error_type):
    """`error_type(message)` for a RuntimeError that is gpumem's out-of-memory inside a
    PyTorch allocation, with ``gpumem_error`` (last_out_of_memory's record whose message it
    carries, or None); None for any other exception (torch's own OutOfMemoryError included)."""
    if not isinstance(exc, RuntimeError) or isinstance(exc, error_type):
        return None
    text = str(exc)
    if OUT_OF_MEMORY_TEXT not in text:
        return None
    converted = error_type(text)
    converted.gpumem_error = None
    for any_thread in (False, True):
        record = last_out_of_memory(any_thread)
        if record is not None and str(record) in text:
            converted.gpumem_error = record
            break
    return converted


class translate_out_of_memory(contextlib.ContextDecorator):
    """Within the block (or the decorated function), gpumem's out-of-memory inside a
    PyTorch allocation, which PyTorch raises as RuntimeError, is raised as
    torch.OutOfMemoryError instead: same message, ``gpumem_error`` the
    gpumem.OutOfMemoryError with its figures (see last_out_of_memory), the RuntimeError as
    its cause. Every other exception passes unchanged. Put it inside the ``try`` whose
    ``except torch.OutOfMemoryError`` should see the error."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None or not isinstance(exc, RuntimeError) or OUT_OF_MEMORY_TEXT not in str(exc):
            return False
        converted = _as_torch_out_of_memory(exc, _torch_out_of_memory_type())
        if converted is None:
            return False
        raise converted.with_traceback(tb) from exc
