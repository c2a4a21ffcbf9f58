"""Two Dask workers sharing one GPU through gpumem (docs/distributed.md).

    python examples/python/dask_workers.py                      # a plain LocalCluster
    python examples/python/dask_workers.py --cuda               # dask-cuda's LocalCUDACluster
    python examples/python/dask_workers.py --libs cupy,torch    # their arrays too

Each worker gets gpumem's default stack capped at its share of the GPU (the budget), a
statistics adaptor and a CSV log of its own. The tasks allocate and free device buffers of
varying sizes (with --libs, CuPy arrays and PyTorch tensors as well); then the script
prints every worker's current and peak bytes in one table, the wall time, and draws the
logs into one page with gpumem-report. Without a GPU it runs on gpumem's simulator.
"""

import argparse
import logging
import os
import sys
import tempfile
import time


def work(seed, libs):
    """A task: allocates buffers of sizes from 4 KiB to 8 MiB, keeps half of them live at a
    time, and returns how many bytes it allocated."""
    import random

    import gpumem

    rng = random.Random(seed)
    live, total = [], 0
    for _ in range(200):
        n = rng.randint(4 << 10, 8 << 20)
        live.append(gpumem.DeviceBuffer(n))
        total += n
        if len(live) > 8:
            live.pop(rng.randrange(len(live)))
    if "cupy" in libs:
        import cupy

        a = cupy.arange(1 << 20, dtype=cupy.float32)
        total += a.nbytes
    if "torch" in libs:
        import torch

        t = torch.ones(1 << 20, device="cuda")
        total += t.numel() * t.element_size()
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cuda", action="store_true", help="dask_cuda.LocalCUDACluster (one worker per GPU)")
    parser.add_argument("--workers", type=int, default=2, help="workers of a plain LocalCluster (default 2)")
    parser.add_argument("--libs", default="", help="frameworks to point at gpumem: numba, cupy, torch")
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--logs", default=None, help="the logs' folder (default: a new temporary one)")
    args = parser.parse_args()

    import gpumem
    import gpumem.dask
    from distributed import Client, LocalCluster

    backend = os.environ.get("GPUMEM_BACKEND")
    if not backend:
        gpumem.select_backend("cuda_or_sim")
        backend = os.environ["GPUMEM_BACKEND"] = gpumem.current_backend()  # the workers' too
    libs = [s for s in args.libs.split(",") if s]
    logs = args.logs or tempfile.mkdtemp(prefix="gpumem-dask-")

    if args.cuda:
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError:
            print("--cuda needs dask-cuda (pip install dask-cuda)")
            return 0
        cluster = LocalCUDACluster(threads_per_worker=1, dashboard_address=None, silence_logs=logging.ERROR)
        share = 0.9  # one worker per GPU
    else:
        cluster = LocalCluster(
            n_workers=args.workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=logging.ERROR,
        )
        share = 0.9 / args.workers  # the workers share GPU 0
    with cluster, Client(cluster) as client:
        plugin = gpumem.dask.GpumemPlugin(maximum=share, external_libs=libs, log_directory=logs)
        client.register_plugin(plugin)
        start = time.perf_counter()
        allocated = sum(client.gather(client.map(work, range(args.tasks), libs=libs)))
        seconds = time.perf_counter() - start
        rows = gpumem.dask.gather_statistics(client)
        print("gpumem on %d worker(s), %s backend, stack %s" % (len(rows), backend, rows[0]["stack"]))
        print(gpumem.dask.format_statistics(rows))
        print("%d tasks allocated %.1f MiB in %.2f s" % (args.tasks, allocated / 2**20, seconds))
        gpumem.dask.flush_logs(client)
    try:
        print("logs drawn on one page: %s" % gpumem.dask.report_logs(logs))
    except FileNotFoundError as e:
        print("logs in %s (not drawn: %s)" % (logs, e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
