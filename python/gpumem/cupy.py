"""gpumem as CuPy's device memory allocator.

    import gpumem.cupy
    gpumem.cupy.use_gpumem_for_cupy()     # cupy.cuda.set_allocator(gpumem.cupy.allocator)

Every CuPy device allocation then comes from the current gpumem resource of CuPy's
current device, allocated on CuPy's current stream and freed on that stream when
CuPy lets go of the memory (the stream object is kept alive until then). A size of
0 gives CuPy's own empty allocation (pointer 0), as CuPy's memory pool does.
Pinned host memory stays with CuPy. See docs/python.md, "CuPy".
"""

import cupy as _cupy

from gpumem import _core

__all__ = ["allocator", "use_gpumem_for_cupy"]


class _StreamRef:
    """A CuPy stream in the __cuda_stream__ protocol, for CuPy versions without it."""

    __slots__ = ("stream",)

    def __init__(self, stream):
        self.stream = stream

    def __cuda_stream__(self):
        return (0, self.stream.ptr)


def _stream_argument(stream):
    return stream if hasattr(stream, "__cuda_stream__") else _StreamRef(stream)


def allocator(size):
    """The function for cupy.cuda.set_allocator: returns a cupy.cuda.MemoryPointer."""
    device = _cupy.cuda.runtime.getDevice()
    if size == 0:
        return _cupy.cuda.memory.MemoryPointer(_cupy.cuda.memory.Memory(0), 0)
    stream = _cupy.cuda.get_current_stream()
    buffer = _core.DeviceBuffer(size, _stream_argument(stream), device=device)
    memory = _cupy.cuda.memory.UnownedMemory(buffer.ptr, size, buffer, device)
    return _cupy.cuda.memory.MemoryPointer(memory, 0)


def use_gpumem_for_cupy():
    """Makes CuPy allocate device memory through gpumem (cupy.cuda.set_allocator)."""
    _cupy.cuda.set_allocator(allocator)
