#!/usr/bin/env python3
"""W7 (python) from docs/benchmarks-method.md: allocation cost as Python code sees it.

  (a) a raw buffer alloc+free: gpumem.DeviceBuffer(n) created and dropped, beside
      CuPy's MemoryPool and MemoryAsyncPool (cupy.cuda.alloc) and torch.empty;
  (b) numba.cuda.device_array(n) created and dropped, through the gpumem EMM plugin
      and through Numba's own memory manager; and through a plugin that allocates
      nothing, which shows what Numba itself costs per array on the machine (the hosts
      of one GPU kind differ by 2-3x here from one machine to the next);
  and, where the libraries exist, CuPy and PyTorch switched to gpumem. CuPy through
  gpumem is measured on the route gpumem.cupy takes (CuPy >= 14.1: CFunctionAllocator
  over C functions, no Python call per allocation; the row says which) and on the
  Python-callable route older CuPy gets (PythonFunctionAllocator over CupyHook).

Sizes are uniform in [1, 1 MiB] bytes (seed 1). Every row runs in its own
interpreter (Numba's manager and PyTorch's allocator are chosen once per process)
on device 0 and the default stream: a warm-up pass, then calibrated repetitions
(each about --rep-ms long), the rows alternating over --rounds rounds; the figure is
the median ns per alloc+free over every repetition.

    python3 python/bench/w7.py [--rows a,b] [--reps 5] [--rounds 3] [--rep-ms 200] [--json FILE] [--list]

Targets (ratios within one run, since Python hosts differ 2-3x): raw DeviceBuffer
<= 500 ns and <= 0.5x CuPy's own MemoryPool (also measured in one process, the two
alternating pass by pass: the row raw-vs-cupy-pool, whose figure is the median of the
per-pass ratios; the hosts' slow spells, seconds long, otherwise fall on one row's
process and not the other's); device_array through the plugin <= 20 us
and within 2 us of the plugin that allocates nothing; CuPy through gpumem within 1.3x
of CuPy's own MemoryPool.
On the simulator only the host side is measured: a smoke test, not a GPU figure.
"""

import argparse
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time

SIZES = 1 << 16  # distinct sizes, cycled
MAX_BYTES = 1 << 20


def sizes():
    rng = random.Random(1)
    return [rng.randint(1, MAX_BYTES) for _ in range(SIZES)]


# ---- rows: each returns a function f(sizes) doing one alloc+free per size ---------


def row_gpumem_raw():
    from gpumem import DeviceBuffer

    def run(ns):
        for n in ns:
            DeviceBuffer(n)

    return run


def _numba(use_gpumem):
    import numpy as np
    from numba import cuda

    if use_gpumem:
        import gpumem.numba

        gpumem.numba.use_gpumem_for_numba()
    cuda.current_context()  # the context (and its memory manager) now
    device_array, u8 = cuda.device_array, np.uint8

    def run(ns):
        for n in ns:
            device_array(n, dtype=u8)

    return run


def row_numba_gpumem():
    return _numba(True)


def row_numba_default():
    return _numba(False)


def row_numba_floor():
    """device_array through a plugin that allocates nothing: every array gets the same
    1 MiB block (made once; device_array writes nothing) and no finalizer. What is left is
    Numba's own work per array, the floor for any plugin on this machine."""
    import contextlib

    from cuda.bindings import driver as cu
    from numba import cuda

    class NothingPlugin(cuda.HostOnlyCUDAMemoryManager):
        block = None

        def initialize(self):
            pass

        def memalloc(self, size):
            if NothingPlugin.block is None:
                err, NothingPlugin.block = cu.cuMemAlloc(MAX_BYTES)
                if err != cu.CUresult.CUDA_SUCCESS:
                    raise RuntimeError(f"cuMemAlloc: {err}")
            return cuda.MemoryPointer(self.context, NothingPlugin.block, size)

        def get_memory_info(self):
            raise NotImplementedError

        def get_ipc_handle(self, memory):
            raise NotImplementedError

        def reset(self):
            pass

        def defer_cleanup(self):
            return contextlib.nullcontext()

        @property
        def interface_version(self):
            return 1

    cuda.set_memory_manager(NothingPlugin)
    return _numba(False)


#: What a row measured beyond its label (the route gpumem.cupy took), set by its builder.
DETAIL = {}


def _cupy(kind):
    import cupy

    if kind == "async":
        cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)
    elif kind == "gpumem":
        import gpumem.cupy

        gpumem.cupy.use_gpumem_for_cupy()
        DETAIL["cupy-gpumem"] = "%s route" % gpumem.cupy.route
    elif kind == "gpumem-python":
        from gpumem import _core

        hook = _core.CupyHook(cupy.cuda.get_current_stream, None)
        cupy.cuda.set_allocator(cupy.cuda.memory.PythonFunctionAllocator(hook.malloc, hook.free).malloc)
    alloc = cupy.cuda.alloc

    def run(ns):
        for n in ns:
            alloc(n)

    return run


def row_cupy_pool():
    return _cupy("pool")


def row_cupy_async():
    return _cupy("async")


def row_cupy_gpumem():
    return _cupy("gpumem")


def row_cupy_gpumem_python():
    return _cupy("gpumem-python")


def _torch(use_gpumem):
    import torch

    if use_gpumem:
        import gpumem.torch

        gpumem.torch.use_gpumem_for_torch()
    empty, u8 = torch.empty, torch.uint8

    def run(ns):
        for n in ns:
            empty(n, dtype=u8, device="cuda")

    return run


def row_torch_default():
    return _torch(False)


def row_torch_gpumem():
    return _torch(True)


ROWS = {
    # name: (label, builder, needs, part)
    "gpumem-raw": ("gpumem DeviceBuffer", row_gpumem_raw, [], "a"),
    "cupy-pool": ("CuPy MemoryPool (peer)", row_cupy_pool, ["cupy"], "a"),
    "cupy-async": ("CuPy MemoryAsyncPool (peer)", row_cupy_async, ["cupy"], "a"),
    "cupy-gpumem": ("CuPy through gpumem", row_cupy_gpumem, ["cupy"], "a"),
    "cupy-gpumem-python": ("CuPy through gpumem, Python route", row_cupy_gpumem_python, ["cupy"], "a"),
    "torch-default": ("torch.empty, caching allocator (peer)", row_torch_default, ["torch"], "a"),
    "torch-gpumem": ("torch.empty through gpumem", row_torch_gpumem, ["torch"], "a"),
    "numba-gpumem": ("device_array, gpumem plugin", row_numba_gpumem, ["numba", "numpy"], "b"),
    "numba-default": ("device_array, Numba's manager (peer)", row_numba_default, ["numba", "numpy"], "b"),
    "numba-floor": ("device_array, plugin allocating nothing", row_numba_floor, ["numba", "numpy"], "b"),
}
TARGETS_NS = {"gpumem-raw": 500, "numba-gpumem": 20000}
TARGETS_RELATIVE = {"cupy-gpumem": ("cupy-pool", 1.3), "gpumem-raw": ("cupy-pool", 0.5)}  # at most x that row's
TARGETS_GAP_NS = {"numba-gpumem": ("numba-floor", 2000)}  # at most this many ns above that row's figure
# Rows measured against each other in one process, pass by pass alternating, so that
# a slow spell of the host falls on both alike: the figure is the median of the
# per-pass ratios (first / second), with the target it must not exceed.
PAIRED = {"raw-vs-cupy-pool": ("gpumem-raw", "cupy-pool", 0.5)}
NEEDS_GPU = {"raw-vs-cupy-pool", "cupy-pool", "cupy-async", "cupy-gpumem", "cupy-gpumem-python", "torch-default", "torch-gpumem",
             "numba-gpumem", "numba-default", "numba-floor"}


def child(name, reps, rep_ms):
    """Measures one row in this process; prints one JSON line."""
    import gpumem

    if not os.environ.get("GPUMEM_BACKEND"):
        gpumem.select_backend("cuda_or_sim")
    if name in PAIRED:
        return child_paired(name, reps)
    run = ROWS[name][1]()
    all_sizes = sizes()

    def timed(count):
        ns = [all_sizes[i % SIZES] for i in range(count)]
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter_ns()
            run(ns)
            return time.perf_counter_ns() - t0
        finally:
            gc.enable()

    run(all_sizes[:2000])  # warm-up: pools grow, contexts and caches settle
    count = 256
    while True:  # calibrate: a repetition lasts about rep_ms
        elapsed = timed(count)
        if elapsed >= rep_ms * 1e6 / 4 or count >= 1 << 22:
            break
        count *= 4
    count = max(16, min(1 << 22, int(count * rep_ms * 1e6 / max(elapsed, 1))))
    figures = [timed(count) / count for _ in range(reps)]
    print(json.dumps({"row": name, "median_ns": statistics.median(figures), "min_ns": min(figures),
                      "max_ns": max(figures), "ops": count, "reps": figures, "detail": DETAIL.get(name)}))


def child_paired(name, reps):
    """Both rows of a pair in this process, alternating pass by pass; prints one JSON line."""
    first, second, _ = PAIRED[name]
    runs = (ROWS[first][1](), ROWS[second][1]())
    ns = sizes()[: 1 << 14]

    def once(run):
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter_ns()
            run(ns)
            return (time.perf_counter_ns() - t0) / len(ns)
        finally:
            gc.enable()

    for run in runs:
        once(run)  # warm-up
    a, b = [], []
    for _ in range(reps * 20):
        a.append(once(runs[0]))
        b.append(once(runs[1]))
    ratios = [x / y for x, y in zip(a, b)]
    print(json.dumps({"row": name, "ratios": ratios, "first_ns": statistics.median(a),
                      "second_ns": statistics.median(b), "passes": len(ratios), "ops": len(ns)}))


def header():
    import gpumem

    if not os.environ.get("GPUMEM_BACKEND"):
        gpumem.select_backend("cuda_or_sim")
    info = {
        "gpumem": gpumem.__version__,
        "backend": gpumem.current_backend(),
        "device": gpumem.device_name(0),
        "driver_cuda_version": gpumem.driver_version(),
        "python": platform.python_version(),
    }
    for module in ("numba", "numba_cuda", "cupy", "torch"):
        try:
            info[module] = __import__(module).__version__
        except Exception:  # noqa: BLE001 - absent or broken: not measured
            pass
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default=",".join(ROWS), help="comma-separated rows (see --list)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="times each row runs, the rows alternating (default 3)")
    ap.add_argument("--rep-ms", type=float, default=200.0)
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.list:
        for name, (label, _, needs, part) in ROWS.items():
            print("%-18s (%s) %s%s" % (name, part, label, "  needs " + ", ".join(needs) if needs else ""))
        for name, (first, second, factor) in PAIRED.items():
            print("%-18s (a) %s / %s in one process, target <= %.2f" % (name, first, second, factor))
        return 0
    if args.child:
        child(args.child, args.reps, args.rep_ms)
        return 0

    info = header()
    print("W7 python on %s (%s backend), CUDA driver %s, Python %s" % (
        info["device"], info["backend"], info["driver_cuda_version"], info["python"]))
    print("  " + ", ".join("%s %s" % (k, info[k]) for k in ("numba", "numba_cuda", "cupy", "torch") if k in info))
    if info["backend"] != "cuda":
        print("  (simulator: host-side cost only, not GPU figures; rows needing a GPU are skipped)")
    names = [r.strip() for r in args.rows.split(",") if r.strip()]
    if args.rows == ",".join(ROWS):
        names += list(PAIRED)  # every row: the pairs too
    for name in names:
        if name not in ROWS and name not in PAIRED:
            print("unknown row %r (see --list)" % name, file=sys.stderr)
            return 2
    if args.rounds < 1:
        print("--rounds must be at least 1", file=sys.stderr)
        return 2
    # Rows alternate, round after round, so that a slow spell of a shared host (they
    # last seconds) falls on every row alike rather than on the rows measured then.
    measured = {}
    for _ in range(args.rounds):
        for name in names:
            if name in measured and measured[name]["status"] != "ok":
                continue
            needs = sorted({m for row in PAIRED[name][:2] for m in ROWS[row][2]}) if name in PAIRED else ROWS[name][2]
            missing = [m for m in needs if not _importable(m)]
            if info["backend"] != "cuda" and name in NEEDS_GPU:
                missing.append("a GPU")
            if missing:
                measured[name] = {"row": name, "status": "skipped", "why": "needs " + ", ".join(missing)}
                continue
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", name, "--reps", str(args.reps),
                                "--rep-ms", str(args.rep_ms)], capture_output=True, text=True)
            if p.returncode != 0:
                measured[name] = {"row": name, "status": "failed",
                                  "why": (p.stderr.strip().splitlines() or ["?"])[-1]}
                continue
            r = json.loads(p.stdout.strip().splitlines()[-1])
            key = "ratios" if name in PAIRED else "reps"
            if name in measured:
                r[key] = measured[name][key] + r[key]
            r["status"] = "ok"
            measured[name] = r
    results = []
    for name in names:
        r = measured[name]
        if r["status"] == "ok" and name in PAIRED:
            q = sorted(r["ratios"])
            r["median_ratio"] = statistics.median(q)
            r["quartiles"] = [q[len(q) // 4], q[(3 * len(q)) // 4]]
        elif r["status"] == "ok":
            r["median_ns"] = statistics.median(r["reps"])
            r["min_ns"] = min(r["reps"])
            r["max_ns"] = max(r["reps"])
        results.append(r)

    print()
    print("%-4s %-40s %14s %14s %12s" % ("part", "row", "ns/alloc+free", "min", "target"))
    print("-" * 88)
    measured = {r["row"]: r["median_ns"] for r in results if r["status"] == "ok" and r["row"] not in PAIRED}
    for r in results:
        if r["row"] in PAIRED:
            first, second, factor = PAIRED[r["row"]]
            label = "%s / %s, paired" % (ROWS[first][0].replace("gpumem ", ""), ROWS[second][0].replace(" (peer)", ""))
            if r["status"] != "ok":
                print("%-4s %-40s %s: %s" % ("a", label, r["status"], r["why"]))
                continue
            print("%-4s %-40s %14s %14s %12s" % (
                "a", label, "%.3fx" % r["median_ratio"], "%.3f-%.3f" % tuple(r["quartiles"]),
                "%.2fx %s" % (factor, "met" if r["median_ratio"] <= factor else "MISSED")))
            continue
        label, _, _, part = ROWS[r["row"]]
        if r.get("detail"):
            label = "%s (%s)" % (label, r["detail"])
        target = TARGETS_NS.get(r["row"])
        if r["status"] != "ok":
            print("%-4s %-40s %s: %s" % (part, label, r["status"], r["why"]))
            continue
        verdict = ""
        if target and info["backend"] == "cuda":
            verdict = "%d %s" % (target, "met" if r["median_ns"] <= target else "MISSED")
        peer, factor = TARGETS_RELATIVE.get(r["row"], (None, None))
        if peer in measured and info["backend"] == "cuda":
            ratio = r["median_ns"] / measured[peer]
            verdict = "%.2fx %s %s" % (ratio, peer, "met" if ratio <= factor else "MISSED")
            r["ratio_to_" + peer] = ratio
        floor, gap = TARGETS_GAP_NS.get(r["row"], (None, None))
        if floor in measured and info["backend"] == "cuda":
            above = r["median_ns"] - measured[floor]
            verdict = "%+.1f us %s %s" % (above / 1000, floor, "met" if above <= gap else "MISSED")
            r["above_" + floor + "_ns"] = above
        print("%-4s %-40s %14s %14s %12s" % (part, label, "{:,.0f}".format(r["median_ns"]),
                                             "{:,.0f}".format(r["min_ns"]), verdict))
    print("figure: median of %d repetitions (%d rounds of %d, the rows alternating), each after a warm-up, "
          "sizes uniform in [1, 1 MiB] (seed 1)" % (args.rounds * args.reps, args.rounds, args.reps))
    if any(r["row"] in PAIRED and r["status"] == "ok" for r in results):
        print("pairs: the median of the per-pass ratios (min column: their quartiles), %d passes of 16,384 sizes "
              "a round, the two rows alternating in one process" % (args.reps * 20))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"workload": "W7", "info": info, "results": results}, f, indent=2)
    return 0


def _importable(module):
    import importlib.util

    return importlib.util.find_spec(module) is not None


if __name__ == "__main__":
    sys.exit(main())
