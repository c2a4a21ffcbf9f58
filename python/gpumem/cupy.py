"""gpumem as CuPy's device memory allocator.

    import gpumem.cupy
    gpumem.cupy.use_gpumem_for_cupy()     # cupy.cuda.set_allocator(gpumem.cupy.allocator)

Every CuPy device allocation then comes from the current gpumem resource of CuPy's
current device, allocated on CuPy's current stream and freed on that stream when
CuPy lets go of the memory (the stream object is kept alive until then). A size of
0 gives CuPy's own empty allocation (pointer 0), as CuPy's memory pool does.
Pinned host memory stays with CuPy. See docs/python-frameworks.md, "CuPy".

Two routes, chosen at import (``route``):

``"c"`` (CuPy >= 14.1): CuPy's ``CFunctionAllocator`` over C functions of gpumem's
    extension (``gpumem._core.CupyAllocator``, Note [CuPy's C allocator] in
    python/src/cupy_hook.cpp). An allocation and a free make no Python call.
    A failed allocation raises :class:`OutOfMemoryError`, which is both CuPy's
    ``cupy.cuda.memory.OutOfMemoryError`` and ``gpumem.OutOfMemoryError``, with
    gpumem's explanation; other failures raise gpumem's exceptions.
``"python"`` (older CuPy, whose C allocator cannot report an error): CuPy's
    ``PythonFunctionAllocator`` over ``gpumem._core.CupyHook``, two C++ functions
    CuPy calls as Python callables. A failed allocation raises
    ``gpumem.OutOfMemoryError`` (a ``MemoryError``).

Either way :func:`last_out_of_memory` gives the last allocation that ran out of
memory as a ``gpumem.OutOfMemoryError``, and a free of a pointer gpumem.cupy did not
allocate is reported through gpumem's diagnostics (logger ``"gpumem"``), not raised.
"""

import re as _re

import cupy as _cupy

import gpumem as _gpumem
from gpumem import _core

__all__ = ["OutOfMemoryError", "allocator", "last_out_of_memory", "live_allocations", "route",
           "use_gpumem_for_cupy"]

#: The first CuPy whose CFunctionAllocator raises what malloc throws (malloc is ``except +``).
C_ROUTE_CUPY = (14, 1)
#: CuPy's C function for its current stream of a device, in cupy_backends.cuda.stream's
#: Cython C-API table: ``intptr_t get_stream_ptr(int device_id)`` (CuPy >= 13).
STREAM_MODULE, STREAM_FUNCTION, STREAM_SIGNATURE = "cupy_backends.cuda.stream", "get_stream_ptr", "intptr_t (int)"


class OutOfMemoryError(_cupy.cuda.memory.OutOfMemoryError, _gpumem.OutOfMemoryError):
    """A gpumem allocation for CuPy that ran out of memory: CuPy's error (what code written
    for CuPy catches) with gpumem's message and attributes (``requested_bytes``, ``reason``, ...)."""

    @classmethod
    def from_gpumem(cls, error, size):
        """This error with the text and attributes of gpumem's `error` for `size` bytes."""
        e = cls(size, getattr(error, "resource_held_bytes", -1))
        e.args = error.args
        e.__dict__.update(error.__dict__)
        return e


def _cupy_version():
    m = _re.match(r"(\d+)\.(\d+)", getattr(_cupy, "__version__", ""))
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _stream_function():
    """The address of CuPy's get_stream_ptr, or None where CuPy does not export it as expected."""
    import importlib

    try:
        module = importlib.import_module(STREAM_MODULE)
    except ImportError:
        return None
    capsule = getattr(module, "__pyx_capi__", {}).get(STREAM_FUNCTION)
    return None if capsule is None else _core.CupyAllocator.capsule_function(capsule, STREAM_SIGNATURE)


def _raise_allocation_error(size, device_id):
    """Called by the C malloc when an allocation failed (on that thread, with the GIL): raises it."""
    try:
        _core.CupyAllocator.raise_failure()
    except _gpumem.OutOfMemoryError as e:
        raise OutOfMemoryError.from_gpumem(e, size) from None


def _c_route():
    if _cupy_version() < C_ROUTE_CUPY or not hasattr(_cupy.cuda.memory, "CFunctionAllocator"):
        return None
    stream_function = _stream_function()
    if stream_function is None:
        return None
    state = _core.CupyAllocator(stream_function, keep_stream=_cupy.cuda.get_current_stream,
                                raise_error=_raise_allocation_error)
    allocator = _cupy.cuda.memory.CFunctionAllocator(state.param, state.malloc_function, state.free_function, state)
    return state, allocator


_c = _c_route()
if _c is not None:
    route = "c"
    #: The C side (gpumem._core.CupyAllocator): live(), live_allocations(), last_out_of_memory().
    state, _allocator = _c
    hook = None
else:
    route = "python"
    #: The C++ side of the Python route: malloc(size, device_id), free(ptr, device_id),
    #: live_allocations(), last_out_of_memory().
    hook = _core.CupyHook(
        _cupy.cuda.get_current_stream,
        getattr(getattr(_cupy.cuda, "stream", None), "get_current_stream_ptr", None),
    )
    state = None
    _allocator = _cupy.cuda.memory.PythonFunctionAllocator(hook.malloc, hook.free)
del _c

#: The function for cupy.cuda.set_allocator: allocator(size) -> cupy.cuda.MemoryPointer.
allocator = _allocator.malloc


def use_gpumem_for_cupy():
    """Makes CuPy allocate device memory through gpumem (cupy.cuda.set_allocator)."""
    _cupy.cuda.set_allocator(allocator)


def last_out_of_memory(any_thread=False):
    """The calling thread's last allocation through gpumem.cupy that ran out of memory (with
    ``any_thread``, the process's), as a gpumem.OutOfMemoryError (not raised), or None."""
    return (state or hook).last_out_of_memory(any_thread)


def live_allocations():
    """How many allocations CuPy holds from gpumem.cupy."""
    return (state or hook).live_allocations()
