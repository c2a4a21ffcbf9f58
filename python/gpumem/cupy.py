"""gpumem as CuPy's device memory allocator.

    import gpumem.cupy
    gpumem.cupy.use_gpumem_for_cupy()     # cupy.cuda.set_allocator(gpumem.cupy.allocator)

Every CuPy device allocation then comes from the current gpumem resource of CuPy's
current device, allocated on CuPy's current stream and freed on that stream when
CuPy lets go of the memory (the stream object is kept alive until then). A size of
0 gives CuPy's own empty allocation (pointer 0), as CuPy's memory pool does.
Pinned host memory stays with CuPy. See docs/python.md, "CuPy".

The allocator is CuPy's ``PythonFunctionAllocator`` over gpumem's C++ ``CupyHook``:
CuPy builds its memory objects in Cython and calls two C++ functions, so an
allocation costs about what one from CuPy's own pool does.
"""

import cupy as _cupy

from gpumem import _core

__all__ = ["allocator", "hook", "use_gpumem_for_cupy"]

#: The C++ side: malloc(size, device_id) and free(ptr, device_id), plus
#: live_allocations() (allocations CuPy still holds, for tests and tools).
hook = _core.CupyHook(
    _cupy.cuda.get_current_stream,
    getattr(getattr(_cupy.cuda, "stream", None), "get_current_stream_ptr", None),
)

_function_allocator = _cupy.cuda.memory.PythonFunctionAllocator(hook.malloc, hook.free)

#: The function for cupy.cuda.set_allocator: allocator(size) -> cupy.cuda.MemoryPointer.
allocator = _function_allocator.malloc


def use_gpumem_for_cupy():
    """Makes CuPy allocate device memory through gpumem (cupy.cuda.set_allocator)."""
    _cupy.cuda.set_allocator(allocator)
