"""Several PyTorch ranks on one machine, each allocating through gpumem within its share of
the GPU (docs/distributed.md, "torchrun and torch.multiprocessing").

    torchrun --nproc-per-node 2 examples/python/torch_ranks.py     # torchrun starts the ranks
    python examples/python/torch_ranks.py --nprocs 2                # torch.multiprocessing.spawn

Each rank, before its first CUDA allocation: makes gpumem's default stack, capped at
``--share`` of the GPU divided among the ranks that use it (the budget), with statistics and
a log named after the rank and its pid, the current resource of its device; then makes gpumem
PyTorch's allocator. Ranks that share a GPU use the gloo backend (NCCL refuses two ranks on
one device), ranks with a GPU each NCCL. Each trains a small DistributedDataParallel model for
a few steps, then reports its peak and shows that a request past its budget is refused.
"""

import argparse
import os
import sys
import time


def setup_gpumem(rank, local_rank, local_world_size, share, log_dir):
    """gpumem for this rank: the budget, statistics, a log per rank. Call it before the
    rank's first CUDA allocation. Returns (device, budget in bytes)."""
    import torch

    import gpumem
    import gpumem.torch

    device = local_rank % torch.cuda.device_count()
    # Ranks that share this device (round-robin assignment, as above).
    sharing = len(range(device, local_world_size, torch.cuda.device_count()))
    percent = "%g%%" % (100.0 * share / sharing)
    log = os.path.join(log_dir, "gpumem-rank%d-%%p.csv" % rank)  # %p: the process id
    gpumem.reinitialize("default", devices=[device], maximum=percent, stats=True, log=log)
    gpumem.torch.use_gpumem_for_torch()
    torch.cuda.set_device(device)
    return device, gpumem.stack_report(device=device)["maximum_bytes"]


def run(rank, world_size, local_rank, local_world_size, args):
    import torch
    import torch.distributed as dist

    import gpumem

    device, budget = setup_gpumem(rank, local_rank, local_world_size, args.share, args.logs)
    backend = "nccl" if local_world_size <= torch.cuda.device_count() else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world_size)

    start = time.perf_counter()
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        batch = 64 * (1 + (step + rank) % 4)  # varying shapes
        x = torch.randn(batch, 1024, device="cuda")
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start

    report = gpumem.stack_report(device=device)
    refused = None
    try:
        torch.empty(budget + (64 << 20), dtype=torch.uint8, device="cuda")
    except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError
        refused = "the budget" in str(e)
    rows = [None] * world_size
    dist.all_gather_object(rows, (rank, os.getpid(), device, report, seconds, refused))
    if rank == 0:
        print("%d ranks (%s), gpumem stack %s" % (world_size, backend, report["stack"]))
        print("rank  pid      dev  peak        budget      steps/s  over budget")
        for r, pid, dev, rep, sec, ref in rows:
            print(
                "%-4d  %-7d  %-3d  %7.2f MiB  %7.2f MiB  %7.1f  %s"
                % (
                    r,
                    pid,
                    dev,
                    rep["statistics"]["peak_bytes"] / 2**20,
                    rep["maximum_bytes"] / 2**20,
                    args.steps / sec,
                    "refused" if ref else "NOT refused" if ref is False else "allowed",
                )
            )
        print("logs: %s" % ", ".join(sorted(os.path.basename(p) for _, _, _, rep, _, _ in rows for p in rep["logs"])))
    dist.barrier()
    dist.destroy_process_group()
    gpumem.flush_logs(device=device)


def _spawned(local_rank, nprocs, args):
    # torch.multiprocessing.spawn: one machine, ranks 0..nprocs-1.
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    run(local_rank, nprocs, local_rank, nprocs, args)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nprocs", type=int, default=2, help="ranks to spawn when not under torchrun")
    parser.add_argument("--share", type=float, default=0.9, help="fraction of each GPU for its ranks together")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--log-folder", dest="logs", default=".", help="folder of the per-rank logs")
    parser.add_argument("--port", type=int, default=29533, help="rendezvous port for --nprocs")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("this recipe needs PyTorch")
        return 0
    if not torch.cuda.is_available():
        print("this recipe needs a CUDA GPU")
        return 0
    os.makedirs(args.logs, exist_ok=True)
    if "LOCAL_RANK" in os.environ:  # started by torchrun
        env = os.environ
        run(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"]), args)
    else:
        import torch.multiprocessing as mp

        mp.spawn(_spawned, args=(args.nprocs, args), nprocs=args.nprocs, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
