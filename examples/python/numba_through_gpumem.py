#!/usr/bin/env python3
"""Numba allocating through gpumem: after ``use_gpumem_for_numba()``, every device
array Numba makes comes from gpumem's default resource (docs/python-frameworks.md, "Numba").
A kernel computes y = 2 x + 1 on arrays from the pool, and the pool says what it
holds. It needs a GPU and numba-cuda; elsewhere it says so and exits 0."""

import sys

import gpumem


def main():
    if gpumem.select_backend("cuda_or_sim") != "cuda":
        print("needs a GPU: Numba's kernels do not run on gpumem's host simulator")
        return 0
    try:
        import numpy as np

        if not hasattr(np, "row_stack"):  # numba-cuda 0.30 still calls it; numpy 2.5 removed it
            np.row_stack = np.vstack
        from numba import cuda
    except ImportError:
        print("needs numba-cuda and numpy (pip install numba-cuda)")
        return 0

    from gpumem import numba as gpumem_numba

    gpumem_numba.use_gpumem_for_numba()  # before Numba makes its context

    @cuda.jit
    def axpy(a, x, y):
        i = cuda.grid(1)
        if i < x.size:
            y[i] = a * x[i] + y[i]

    n = 1 << 20
    x = cuda.to_device(np.arange(n, dtype=np.float32))
    y = cuda.to_device(np.ones(n, dtype=np.float32))
    axpy[(n + 255) // 256, 256](np.float32(2), x, y)
    ok = np.array_equal(y.copy_to_host(), 2 * np.arange(n, dtype=np.float32) + 1)
    print("y = 2 x + 1:", "equal" if ok else "DIFFERENT")
    pool = gpumem.get_current_resource(0)
    if isinstance(pool, gpumem.VmmPoolResource):
        st = pool.statistics()
        print("the pool: %d allocations, %d bytes in use" % (st["allocations"], st["used_bytes"]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
