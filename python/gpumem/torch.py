"""gpumem as PyTorch's CUDA allocator.

    import gpumem.torch
    gpumem.torch.use_gpumem_for_torch()   # before PyTorch's first CUDA allocation

This loads libgpumem_torch.so (beside gpumem's extension) into
torch.cuda.memory.CUDAPluggableAllocator: its C entry points

    void* gpumem_torch_alloc(size_t size, int device, cudaStream_t stream)
    void  gpumem_torch_free(void* ptr, size_t size, int device, cudaStream_t stream)

allocate from the current gpumem resource of `device` on PyTorch's current stream,
and free on the stream PyTorch passes back. Size 0 gives a null pointer and
allocates nothing, as PyTorch's own allocator does. See docs/python.md, "PyTorch".
torch is imported only by use_gpumem_for_torch().
"""

import os

__all__ = ["ALLOC_SYMBOL", "FREE_SYMBOL", "library_path", "use_gpumem_for_torch"]

ALLOC_SYMBOL = "gpumem_torch_alloc"
FREE_SYMBOL = "gpumem_torch_free"


def library_path():
    """Absolute path of the shared library holding the entry points."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libgpumem_torch.so")


def use_gpumem_for_torch():
    """Makes gpumem PyTorch's CUDA allocator and returns the CUDAPluggableAllocator. PyTorch
    refuses (RuntimeError) once its own allocator has been used in the process."""
    import torch

    allocator = torch.cuda.memory.CUDAPluggableAllocator(library_path(), ALLOC_SYMBOL, FREE_SYMBOL)
    torch.cuda.memory.change_current_allocator(allocator)
    return allocator
