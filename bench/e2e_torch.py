#!/usr/bin/env python3
"""End-to-end benchmark: a PyTorch bf16 transformer training loop whose sequence length
changes from step to step, under each allocator, each in its own process.

Configurations:
  torch             PyTorch's caching allocator
  torch-expandable  the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  gpumem-default    gpumem as PyTorch's allocator (gpumem.torch), GPUMEM_CONF unset: the
                    stack every program gets by default
  gpumem-pool       the same with GPUMEM_CONF=pool (pool_resource over cuMemAlloc)

Figures per configuration: the median milliseconds per step over the timed steps (each
step ends with a device synchronisation), and the peak device memory above what the
device had in use before the first step: the lowest free memory the driver reported
(cuMemGetInfo, through torch.cuda.mem_get_info) sampled every millisecond by a thread
and after every step. That counts what each allocator holds, whatever it reports of
itself.

    python3 bench/e2e_torch.py [--steps 40] [--warmup 8] [--json OUT.json]
    python3 bench/e2e_torch.py --config gpumem-default     # one configuration, this process

The table goes to stdout; docs/benchmarks.md has measured runs.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "python"))
import torch_models  # noqa: E402  (bench/python)

CONFIGS = ("torch", "torch-expandable", "gpumem-default", "gpumem-pool")


def parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=CONFIGS, help="run one configuration in this process")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, each in its own process")
    ap.add_argument("--steps", type=int, default=40, help="timed steps")
    ap.add_argument("--warmup", type=int, default=8, help="untimed steps first (the memory peak counts them)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--json", help="also write the results to this file")
    return ap.parse_args()


def prepare(config):
    """Environment and allocator for `config`, before PyTorch's first CUDA allocation."""
    if config == "torch-expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if config.startswith("gpumem"):
        if config == "gpumem-pool":
            os.environ["GPUMEM_CONF"] = "pool"
        else:
            os.environ.pop("GPUMEM_CONF", None)
        import gpumem

        gpumem.select_backend("cuda")
        import gpumem.torch

        gpumem.torch.use_gpumem_for_torch()


class FreeMemorySampler:
    """The lowest free device memory seen, sampled by a thread."""

    def __init__(self, torch, period_s=0.001):
        self.torch = torch
        self.period_s = period_s
        self.lowest = torch.cuda.mem_get_info()[0]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def sample(self):
        self.lowest = min(self.lowest, self.torch.cuda.mem_get_info()[0])

    def run(self):
        while not self.stop.wait(self.period_s):
            self.sample()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.sample()


def run_one(args):
    prepare(args.config)
    import torch

    torch.manual_seed(0)
    vocab, d, heads = 32000, args.width, max(1, args.width // 64)

    torch.cuda.init()
    torch.cuda.synchronize()
    free_before = torch.cuda.mem_get_info()[0]
    # Dynamic padding: the batch's longest sequence sets the length, a different one each step.
    lengths = [512, 1024, 768, 1024, 896, 640, 1024, 512, 960, 704]
    times = []
    with FreeMemorySampler(torch) as sampler:
        # Inside: the model and its optimizer state count in the peak.
        model = torch_models.transformer(vocab, d, args.layers, heads, 2048).to("cuda")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for step in range(args.warmup + args.steps):
            seq = lengths[step % len(lengths)]
            start = time.perf_counter()
            torch_models.train_step(model, optimizer, vocab, args.batch, seq)
            torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            sampler.sample()
            if step >= args.warmup:
                times.append(elapsed * 1e3)
    peak = free_before - sampler.lowest
    return {
        "config": args.config,
        "ms_per_step": statistics.median(times),
        "ms_per_step_all": times,
        "peak_bytes_above_start": peak,
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
    }


def run_all(args):
    results = []
    for config in [c for c in args.configs.split(",") if c]:
        if config not in CONFIGS:
            raise SystemExit("e2e_torch: unknown configuration %r (one of %s)" % (config, ", ".join(CONFIGS)))
        cmd = [sys.executable, os.path.abspath(__file__), "--config", config, "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--batch", str(args.batch), "--width", str(args.width),
               "--layers", str(args.layers)]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "GPUMEM_CONF")}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            results.append({"config": config, "error": (done.stderr or done.stdout).strip().splitlines()[-1:]})
            continue
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    ok = [r for r in results if "error" not in r]
    base = next((r for r in ok if r["config"] == "torch"), None)
    expandable = next((r for r in ok if r["config"] == "torch-expandable"), None)
    if ok:
        print("e2e PyTorch training, varying sequence length: %s, torch %s" % (ok[0]["device"], ok[0]["torch"]))
        print("batch %d, width %d, %d layers; %d warm-up + %d timed steps; each configuration in its own process"
              % (args.batch, args.width, args.layers, args.warmup, args.steps))
    print("%-18s | %10s | %8s | %22s | %14s" % ("configuration", "ms/step", "vs torch", "peak above start (GiB)",
                                                 "vs expandable"))
    for r in results:
        if "error" in r:
            print("%-18s | failed: %s" % (r["config"], " ".join(r["error"])))
            continue
        gib = r["peak_bytes_above_start"] / 2**30
        vs_torch = r["ms_per_step"] / base["ms_per_step"] if base else float("nan")
        vs_exp = r["peak_bytes_above_start"] / expandable["peak_bytes_above_start"] if expandable else float("nan")
        print("%-18s | %10.1f | %7.3fx | %22.2f | %13.3fx" % (r["config"], r["ms_per_step"], vs_torch, gib, vs_exp))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if len(ok) == len(results) else 1


def main():
    args = parse()
    if args.config:
        print(json.dumps(run_one(args)))
        return 0
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())
