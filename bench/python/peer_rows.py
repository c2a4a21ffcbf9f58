"""The rows of bench/python/peers.py: one allocator each (CuPy, PyTorch, gpumem's
binding, RMM), made in the child process that measures it."""

import os

MiB = 1 << 20


class Row:
    """alloc(n) -> handle; free(handle); sync(); mem_info() -> (free, total); oom: the
    exceptions that mean out of memory; close() hands cached memory back."""

    oom = (MemoryError,)

    def close(self):
        pass


class CupyRow(Row):
    def __init__(self, kind):
        import cupy

        self.cupy = cupy
        if kind == "async":
            self.pool = cupy.cuda.MemoryAsyncPool()
        else:
            self.pool = cupy.cuda.MemoryPool()
        cupy.cuda.set_allocator(self.pool.malloc)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.stream.use()
        self.alloc = cupy.cuda.alloc  # a MemoryPointer; freed when the last reference goes
        self.oom = (cupy.cuda.memory.OutOfMemoryError, MemoryError)

    def free(self, handle):
        pass  # the caller drops the reference

    def sync(self):
        self.stream.synchronize()

    def mem_info(self):
        return self.cupy.cuda.runtime.memGetInfo()

    def close(self):
        self.stream.synchronize()
        self.pool.free_all_blocks()


class TorchRow(Row):
    def __init__(self, expandable):
        # Read once, when PyTorch's allocator first runs: set before torch is imported.
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:%s" % ("True" if expandable else "False")
        import torch

        self.torch = torch
        torch.cuda.init()
        self.stream = torch.cuda.Stream()  # PyTorch makes its streams non-blocking
        self.raw_stream = self.stream.cuda_stream
        self._alloc = torch.cuda.caching_allocator_alloc
        self.free = torch.cuda.caching_allocator_delete
        self.oom = (torch.cuda.OutOfMemoryError, MemoryError)

    def alloc(self, n):
        return self._alloc(n, 0, self.raw_stream)

    def sync(self):
        self.stream.synchronize()

    def mem_info(self):
        return self.torch.cuda.mem_get_info(0)

    def close(self):
        self.stream.synchronize()
        self.torch.cuda.empty_cache()


class GpumemRow(Row):
    def __init__(self):
        import gpumem

        if not os.environ.get("GPUMEM_BACKEND"):
            gpumem.select_backend("cuda_or_sim")
        self.gpumem = gpumem
        self.mr = gpumem.get_current_resource(0)
        self.stream = gpumem.Stream(0, non_blocking=True)
        self.oom = (gpumem.OutOfMemoryError,)

    def alloc(self, n):
        return (self.mr.allocate(n, self.stream), n)

    def free(self, handle):
        self.mr.deallocate(handle[0], handle[1], self.stream)

    def sync(self):
        self.stream.synchronize()

    def mem_info(self):
        return self.gpumem.device_memory_info(0)

    def close(self):
        self.stream.synchronize()
        self.mr.release()


class RmmRow(Row):
    """RMM's pool from Python: initial size half of the free memory, no maximum."""

    def __init__(self):
        import rmm
        from rmm.pylibrmm.stream import CudaStreamFlags, Stream

        self.rmm = rmm
        free, _ = self.mem_info()
        initial = free // 2 // (2 * MiB) * (2 * MiB)
        self.mr = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=initial)
        self.stream = Stream(flags=CudaStreamFlags.NON_BLOCKING)

    def alloc(self, n):
        return (self.mr.allocate(n, self.stream), n)

    def free(self, handle):
        self.mr.deallocate(handle[0], handle[1], self.stream)

    def sync(self):
        self.stream.synchronize()

    def mem_info(self):
        from cuda.bindings import runtime

        err, free, total = runtime.cudaMemGetInfo()
        if int(err) != 0:
            raise RuntimeError("cudaMemGetInfo: %s" % err)
        return free, total

    def close(self):
        self.stream.synchronize()
        self.mr = None


ROWS = {
    # name: (label, kind, make, needs)
    "cupy-pool": ("CuPy MemoryPool", "peer", lambda: CupyRow("pool"), ["cupy"]),
    "cupy-async": ("CuPy MemoryAsyncPool", "peer", lambda: CupyRow("async"), ["cupy"]),
    "torch": ("torch caching", "peer", lambda: TorchRow(False), ["torch"]),
    "torch-expandable": ("torch caching (expandable)", "peer", lambda: TorchRow(True), ["torch"]),
    "rmm-pool": ("RMM pool (Python)", "peer", RmmRow, ["rmm", "cuda.bindings"]),
    "gpumem": ("gpumem pool_resource (Python)", "gpumem", GpumemRow, ["gpumem"]),
}
NEEDS_GPU = {"cupy-pool", "cupy-async", "torch", "torch-expandable", "rmm-pool"}

# W7 rows: python/bench/w7.py's, and RMM's Numba plugin beside them.
W7_EXTRA = {"numba-rmm": ("device_array, RMM's plugin (peer)", ["numba", "numpy", "rmm"])}


def row_numba_rmm():
    """numba.cuda.device_array through rmm.allocators.numba over RMM's pool (its
    default initial size, as rmm.reinitialize(pool_allocator=True) makes it)."""
    import numpy as np
    import rmm
    from numba import cuda
    from rmm.allocators.numba import RMMNumbaManager

    rmm.reinitialize(pool_allocator=True)
    cuda.set_memory_manager(RMMNumbaManager)
    cuda.current_context()
    device_array, u8 = cuda.device_array, np.uint8

    def run(ns):
        for n in ns:
            device_array(n, dtype=u8)

    return run
