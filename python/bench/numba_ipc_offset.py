"""numba-cuda's test_ipc_handle, after one earlier allocation, under a chosen memory manager.

That test sends only the raw legacy handle bytes and the size to a spawned process, which
opens them at offset 0. This script does the same after one earlier allocation (as in any
longer program) and says whether the child read the array or the first bytes of the
allocation that holds it.

    python3 numba_ipc_offset.py gpumem     # gpumem.numba, the current resource (GPUMEM_CONF)
    python3 numba_ipc_offset.py rmm        # RMM's plugin, RMM's default resource
    python3 numba_ipc_offset.py rmm-pool   # RMM's plugin over rmm.reinitialize(pool_allocator=True)
    python3 numba_ipc_offset.py numba      # Numba's own manager
Needs a GPU (legacy IPC).
"""
import multiprocessing as mp
import sys

import numpy as np


def child(handle, size, queue):
    from numba import cuda

    try:
        with cuda.open_ipc_array(handle, shape=size // 8, dtype=np.intp) as d:
            queue.put(d.copy_to_host())
    except Exception as e:  # reported by the parent
        queue.put(repr(e))


def main(which):
    from numba import cuda

    if which == "gpumem":
        import gpumem.numba

        gpumem.numba.use_gpumem_for_numba()
    elif which in ("rmm", "rmm-pool"):
        import rmm

        if which == "rmm-pool":
            rmm.reinitialize(pool_allocator=True)
        from rmm.allocators.numba import RMMNumbaManager

        cuda.set_memory_manager(RMMNumbaManager)
    elif which != "numba":
        sys.exit(f"unknown manager {which!r}")
    keep = cuda.device_array(1000, dtype=np.uint8)  # an earlier allocation  # noqa: F841
    arr = np.arange(10, dtype=np.intp)
    dev = cuda.to_device(arr)
    ipch = cuda.current_context().get_ipc_handle(dev.gpu_data)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    p = ctx.Process(target=child, args=(ipch.handle.reserved, ipch.size, queue))
    p.start()
    out = queue.get(timeout=60)
    p.join()
    ok = isinstance(out, np.ndarray) and (out == arr).all()
    print(f"{which:10s} offset={ipch.offset:<8d} the child read "
          f"{'the array' if ok else 'other bytes: ' + str(out)[:60]}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gpumem")
