#!/usr/bin/env python3
"""gpumem-bench's workloads from Python, for the peers that live in Python: CuPy's
MemoryPool and MemoryAsyncPool, PyTorch's caching allocator with and without
expandable segments, RMM's pool through its Python package, and gpumem's own Python
binding beside them (docs/benchmarks.md, docs/benchmarks-method.md).

Workloads, defined as in gpumem-bench (bench/workloads/):

  W1 pair    allocate and free 256 B, 1 MiB, 64 MiB over and over; ns per pair
  W2 random  the same op sequence as gpumem-bench's W2 (std::mt19937_64, seed 1, the
             same arithmetic), max 4 KiB and 4 MiB; ns per op; frees and a stream
             synchronisation at the end inside the timed region
  W4 frag.   64 MiB blocks to 90% of the device, every other one freed; the time of
             one allocation of 25% of total memory; the largest allocation that then
             succeeds (bisection over MiB) / (total - live)
  W7 python  python/bench/w7.py's rows (raw alloc+free, numba device_array through
             gpumem's plugin and Numba's own manager), plus device_array through
             RMM's Numba plugin (rmm.allocators.numba)

Every row runs in its own interpreter (PyTorch's allocator settings and Numba's memory
manager are chosen once per process), on device 0 and a non-blocking stream of the
row's own library. Tables print like gpumem-bench's: each figure with its ratio to the
best peer of the column, below 1 better. Rows whose library is missing are skipped
and say so; a row that fails says why; the others go on.

    python3 bench/python/peers.py [--workloads W1,W2,W4,W7] [--rows a,b] [--reps 5]
                                  [--rep-ms 100] [--quick] [--json FILE] [--list]
    python3 bench/python/peers.py --self-test   # the op sequence matches gpumem-bench's
"""

import argparse
import gc
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
W7_SCRIPT = os.path.join(REPO, "python", "bench", "w7.py")
KiB, MiB = 1 << 10, 1 << 20

from peer_rows import NEEDS_GPU, ROWS, W7_EXTRA, row_numba_rmm  # noqa: E402
from random_ops import random_ops, self_test  # noqa: E402


# ---- workloads, in the child ---------------------------------------------------------


def timed(fn):
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        fn()
        return time.perf_counter_ns() - t0
    finally:
        gc.enable()


def w1(row, opts):
    """ns per alloc+free pair, calibrated so that a repetition lasts about rep_ms."""
    out = []
    for n in (256, 1 * MiB, 64 * MiB):
        try:
            alloc, free, sync = row.alloc, row.free, row.sync

            def body(count):
                for _ in range(count):
                    free(alloc(n))
                sync()

            body(1)  # first use
            count, elapsed = 1, timed(lambda: body(1))
            target = opts.rep_ms * 1e6
            while elapsed < target / 5 and count < 1 << 22:
                count *= 8 if elapsed < target / 100 else 2
                elapsed = timed(lambda: body(count))
            count = max(1, min(1 << 22, int(count * target / max(elapsed, 1))))
            reps = [timed(lambda: body(count)) / count for _ in range(opts.reps)]
            out.append(ok(reps, count))
        except row.oom as e:
            out.append(failed("out of memory: %s" % first_line(e)))
    return out


def w2(row, opts):
    """ns per op over W2's sequence; the final frees and a synchronisation are timed."""
    out = []
    count = 4000 if opts.quick else 20000
    for max_bytes in (4 * KiB, 4 * MiB):
        ops = random_ops(count, max_bytes)
        alloc, free, sync = row.alloc, row.free, row.sync

        def body():
            live = []
            for b, i in ops:
                if b:
                    live.append(alloc(b))
                else:
                    free(live[i])
                    live[i] = live[-1]
                    live.pop()
            while live:
                free(live.pop())
            sync()

        try:
            t0 = time.perf_counter()
            body()  # warm-up
            warm = time.perf_counter() - t0
            n = opts.reps
            if opts.cell_budget_s and warm * n > opts.cell_budget_s:
                n = max(1, int(opts.cell_budget_s / max(warm, 1e-9)))
            reps = [timed(body) / len(ops) for _ in range(n)]
            out.append(ok(reps, len(ops)))
        except row.oom as e:
            out.append(failed("out of memory: %s" % first_line(e)))
    return out


def w4(row, opts):
    """[25% alloc ms, largest / (total - live)], one repetition, no warm-up."""
    _, total = row.mem_info()
    block = 64 * MiB
    blocks = []
    try:
        while len(blocks) * block * 10 < total * 9:
            try:
                blocks.append(row.alloc(block))
            except row.oom:
                break
        kept = []
        for i, b in enumerate(blocks):
            if i % 2 == 0:
                kept.append(b)
            else:
                row.free(b)
        b = None  # (CuPy frees when the last reference goes)
        blocks = kept
        row.sync()
        live = len(blocks) * block
        quarter = total // 4
        t0 = time.perf_counter()
        try:
            big = row.alloc(quarter)
            oom = None
        except row.oom as e:
            oom = first_line(e)
        ms = (time.perf_counter() - t0) * 1e3
        if oom is None:
            row.free(big)
            big = None
            row.sync()
            first = ok([ms], 1)
        else:
            first = failed(oom, outcome="OOM", reps=[ms])
        free_bytes = total - live
        fits, fails, probes = 0, free_bytes // MiB + 1, 0
        while fails - fits > 1:
            mid = fits + (fails - fits) // 2
            probes += 1
            try:
                p = row.alloc(mid * MiB)
                row.free(p)
                p = None
                row.sync()
                fits = mid
            except row.oom:
                fails = mid
        second = ok([fits * MiB / free_bytes], probes)
        return [first, second]
    finally:
        for b in blocks:
            row.free(b)
        blocks = []
        row.sync()


WORKLOADS = {
    # id: (name, figure, columns [(label, unit, lower_is_better)], function)
    "W1": ("pair", "ns per allocate+free pair", [("256 B", "ns", True), ("1 MiB", "ns", True),
                                                  ("64 MiB", "ns", True)], w1),
    "W2": ("random", "ns per op (allocate or free)", [("max 4 KiB", "ns", True), ("max 4 MiB", "ns", True)], w2),
    "W4": ("fragmentation", "ms to allocate 25% of total memory; largest allocation that succeeds / (total - live)",
           [("25% alloc (ms)", "ms", True), ("largest/(total-live)", "", False)], w4),
}


def ok(reps, iterations):
    return {"status": "ok", "reps": reps, "iterations": iterations}


def failed(message, outcome=None, reps=None):
    r = {"status": "failed", "message": message}
    if outcome:
        r["outcome"] = outcome
        r["reps"] = reps or []
    return r


def first_line(e):
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def child(name, workloads, opts):
    """Measures one row in this process; prints one JSON line."""
    row = ROWS[name][2]()
    results = {}
    for wid in workloads:  # W4 last: it fills the device
        try:
            results[wid] = WORKLOADS[wid][3](row, opts)
        except Exception as e:  # noqa: BLE001 - a failed workload is reported, the rest go on
            results[wid] = [failed("%s: %s" % (type(e).__name__, first_line(e)))] * len(WORKLOADS[wid][2])
    row.close()
    print(json.dumps({"row": name, "results": results}))


def child_w7(name, reps, rep_ms):
    """Measures a W7 row with w7.py's own method (its sizes, calibration and output)."""
    spec = importlib.util.spec_from_file_location("w7", W7_SCRIPT)
    w7 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(w7)
    label, needs = W7_EXTRA[name]
    w7.ROWS[name] = (label, row_numba_rmm, needs, "b")
    w7.child(name, reps, rep_ms)


# ---- the parent: run rows, print tables ---------------------------------------------


def importable(module):
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def run_child(args, timeout):
    try:
        p = subprocess.run([sys.executable, os.path.abspath(__file__)] + args, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timed out after %d s" % timeout
    if p.returncode != 0:
        lines = (p.stderr.strip() or p.stdout.strip()).splitlines()
        return None, "exit %d: %s" % (p.returncode, lines[-1] if lines else "?")
    try:
        return json.loads(p.stdout.strip().splitlines()[-1]), None
    except (ValueError, IndexError):
        return None, "no result in the output"


def median(v):
    return statistics.median(v) if v else 0.0


def fmt_figure(v):
    a = abs(v)
    if a >= 999.5:
        return "{:,}".format(int(round(v)))
    if a >= 99.95:
        return "%.0f" % v
    if a >= 9.995:
        return "%.1f" % v
    if a >= 0.9995:
        return "%.2f" % v
    if a >= 0.01:
        return "%.3f" % v
    return "%.2g" % v


def fmt_ratio(r):
    if r >= 99.5:
        return "{:,}x".format(int(round(r)))
    return ("%.1fx" if r >= 9.995 else "%.2fx") % r


def print_table(wid, info, table, out=sys.stdout):
    """gpumem-bench's layout: figure (ratio to the best peer, below 1 better)."""
    name, figure, columns, _ = WORKLOADS[wid]
    best = []
    for c, (_, _, lower) in enumerate(columns):
        cands = [(median(r["cells"][c]["reps"]), r["name"]) for r in table
                 if r["kind"] == "peer" and r["cells"][c]["status"] == "ok" and r["cells"][c]["reps"]]
        best.append((min(cands) if lower else max(cands)) if cands else None)
    notes, text = [], []
    for r in table:
        cells = []
        for c, (_, unit, lower) in enumerate(columns):
            cell = r["cells"][c]
            if cell["status"] != "ok":
                # One footnote per row and reason, as gpumem-bench's tables.
                same = [i for i, other in enumerate(r["cells"]) if other.get("message") == cell.get("message")]
                where = "" if len(same) == len(columns) else ", " + ", ".join(columns[i][0] for i in same)
                note = "%s%s: %s" % (r["name"], where, cell.get("message", ""))
                if note not in notes:
                    notes.append(note)
                mark = " [%d]" % (notes.index(note) + 1)
                if cell.get("outcome") and cell.get("reps"):
                    cells.append("%s %s %s%s" % (cell["outcome"], fmt_figure(median(cell["reps"])), unit, mark))
                else:
                    cells.append(cell["status"] + mark)
                continue
            m = median(cell["reps"])
            t = fmt_figure(m) + (" " + unit if unit else "")
            b = best[c]
            if b and b[0] > 0 and m > 0:
                ratio = m / b[0] if lower else b[0] / m
                cell["ratio_to_best_peer"] = ratio
                t += " (%s)" % fmt_ratio(ratio)
            cells.append(t)
        text.append((r["name"] + (" (peer)" if r["kind"] == "peer" else ""), cells))
    widths = [max([len("subject")] + [len(n) for n, _ in text])]
    for c, col in enumerate(columns):
        widths.append(max([len(col[0])] + [len(cells[c]) for _, cells in text]))
    print("%s %s (Python) on %s (%s)" % (wid, name, info.get("device", "?"), info.get("backend", "?")), file=out)
    print(" | ".join(["subject".ljust(widths[0])] + [col[0].rjust(widths[i + 1]) for i, col in enumerate(columns)]),
          file=out)
    print("-" * (sum(widths) + 3 * len(columns)), file=out)
    for n, cells in text:
        print(" | ".join([n.ljust(widths[0])] + [cells[i].rjust(widths[i + 1]) for i in range(len(cells))]), file=out)
    print("figure: %s; median of the repetitions after a warm-up (Python perf_counter)" % figure, file=out)
    print("(x): figure / the best peer's (the best's / figure where higher is better); below 1 is better", file=out)
    for i, note in enumerate(notes, 1):
        print("[%d] %s" % (i, note), file=out)
    print(file=out)
    return [b[1] if b else None for b in best]


def header():
    info = {"python": platform.python_version(), "executable": sys.executable}
    try:
        import gpumem

        if not os.environ.get("GPUMEM_BACKEND"):
            gpumem.select_backend("cuda_or_sim")
        info.update(gpumem=gpumem.__version__, backend=gpumem.current_backend(), device=gpumem.device_name(0),
                    driver_cuda_version=gpumem.driver_version())
    except Exception as e:  # noqa: BLE001 - without gpumem, ask the peers
        info["gpumem"] = "not importable: %s" % first_line(e)
        try:
            import subprocess as sp

            q = sp.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                       capture_output=True, text=True, timeout=30)
            if q.returncode == 0 and q.stdout.strip():
                name, driver = [s.strip() for s in q.stdout.strip().splitlines()[0].split(",")][:2]
                info.update(device=name, backend="cuda", nvidia_driver=driver)
        except Exception:  # noqa: BLE001
            pass
    for module in ("numba", "numba_cuda", "cupy", "torch", "rmm", "numpy"):
        if importable(module):
            try:
                info[module] = __import__(module).__version__
            except Exception as e:  # noqa: BLE001 - present but broken: said so
                info[module] = "import fails: %s" % first_line(e)
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="W1,W2,W4,W7", help="comma-separated: W1, W2, W4, W7")
    ap.add_argument("--rows", default=",".join(ROWS), help="comma-separated rows (see --list)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rep-ms", type=float, default=100.0)
    ap.add_argument("--cell-budget-s", type=float, default=0.0, help="W2: fewer repetitions where one is long")
    ap.add_argument("--row-timeout-s", type=int, default=180, help="a row's process is stopped after this")
    ap.add_argument("--quick", action="store_true", help="fewer W2 ops, shorter repetitions")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--self-test", action="store_true", help="check the op sequences against gpumem-bench's")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-w7", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.reps = min(args.reps, 2)
        args.rep_ms = min(args.rep_ms, 10.0)
    if args.self_test:
        return self_test()
    if args.list:
        for name, (label, kind, _, needs) in ROWS.items():
            print("%-17s %s (%s), needs %s" % (name, label, kind, ", ".join(needs)))
        for name, (label, needs) in W7_EXTRA.items():
            print("%-17s W7: %s, needs %s" % (name, label, ", ".join(needs)))
        return 0
    workloads = [w.strip().upper() for w in args.workloads.split(",") if w.strip()]
    for w in workloads:
        if w not in WORKLOADS and w != "W7":
            print("unknown workload %r (W1, W2, W4, W7)" % w, file=sys.stderr)
            return 2
    if args.child:
        child(args.child, [w for w in workloads if w in WORKLOADS], args)
        return 0
    if args.child_w7:
        child_w7(args.child_w7, args.reps, args.rep_ms)
        return 0

    info = header()
    print("gpumem-bench peers from Python on %s (%s), Python %s" % (info.get("device", "?"), info.get("backend", "?"),
                                                                   info["python"]))
    print("  " + "; ".join("%s %s" % (k, info[k]) for k in ("gpumem", "numba", "numba_cuda", "cupy", "torch", "rmm")
                           if k in info))
    on_gpu = info.get("backend") == "cuda"
    if not on_gpu:
        print("  (no GPU in use: host-side cost only; rows that need a GPU are skipped)")
    print()
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    for r in rows:
        if r not in ROWS:
            print("unknown row %r (see --list)" % r, file=sys.stderr)
            return 2
    document = {"tool": "gpumem-bench-python", "info": info,
                "options": {"reps": args.reps, "rep_ms": args.rep_ms, "quick": args.quick}, "workloads": []}

    # Rows x (W1, W2, W4): one child per row, every workload in it.
    own = [w for w in workloads if w in WORKLOADS]
    per_row = {}
    if own:
        for name in rows:
            label, kind, _, needs = ROWS[name]
            missing = [m for m in needs if not importable(m)]
            if not on_gpu and name in NEEDS_GPU:
                missing.append("a GPU")
            if missing:
                per_row[name] = {"skipped": "needs " + ", ".join(missing)}
                print("%s: skipped (needs %s)" % (label, ", ".join(missing)))
                continue
            t0 = time.time()
            argv = ["--child", name, "--workloads", ",".join(own), "--reps", str(args.reps), "--rep-ms",
                    str(args.rep_ms), "--cell-budget-s", str(args.cell_budget_s)] + (["--quick"] if args.quick else [])
            result, why = run_child(argv, args.row_timeout_s)
            if result is None:
                per_row[name] = {"failed": why}
                print("%s: failed (%s)" % (label, why))
            else:
                per_row[name] = result["results"]
                print("%s: measured in %.1f s" % (label, time.time() - t0))
        print()
        for wid in own:
            _, figure, columns, _ = WORKLOADS[wid]
            table = []
            for name in rows:
                label, kind, _, _ = ROWS[name]
                r = per_row.get(name, {})
                if "skipped" in r or "failed" in r:
                    status = "skipped" if "skipped" in r else "failed"
                    cells = [{"status": status, "message": r.get(status)} for _ in columns]
                else:
                    cells = r.get(wid) or [{"status": "failed", "message": "no result"} for _ in columns]
                table.append({"name": label, "kind": kind, "cells": cells})
            best = print_table(wid, info, table)
            document["workloads"].append({
                "id": wid, "name": WORKLOADS[wid][0], "figure": figure,
                "columns": [{"variant": c[0], "unit": c[1], "lower_is_better": c[2], "best_peer": best[i]}
                            for i, c in enumerate(columns)],
                "subjects": [{"name": t["name"], "kind": t["kind"], "results": [
                    dict(c, variant=columns[i][0], median=median(c.get("reps", [])) if c.get("reps") else None)
                    for i, c in enumerate(t["cells"])]} for t in table]})

    def save():
        # Written after each part, so that a run stopped by a time limit keeps what it has.
        if args.json:
            with open(args.json, "w") as f:
                json.dump(document, f, indent=1)

    save()
    if "W7" in workloads:
        w7_json = None
        if os.path.exists(W7_SCRIPT):
            tmp = (args.json or os.path.join(os.getcwd(), "peers")) + ".w7.json"
            print("W7 python (python/bench/w7.py)")
            try:
                p = subprocess.run([sys.executable, W7_SCRIPT, "--reps", str(args.reps), "--rep-ms",
                                    str(max(args.rep_ms, 20.0)), "--json", tmp], text=True,
                                   timeout=args.row_timeout_s * 4)
                if p.returncode == 0 and os.path.exists(tmp):
                    with open(tmp) as f:
                        w7_json = json.load(f)
                    os.remove(tmp)
                else:
                    print("w7.py failed (exit %d)" % p.returncode)
            except subprocess.TimeoutExpired:
                print("w7.py timed out")
        else:
            print("W7: python/bench/w7.py not found")
        extra = []
        for name, (label, needs) in W7_EXTRA.items():
            missing = [m for m in needs if not importable(m)]
            if not on_gpu:
                missing.append("a GPU")
            if missing:
                extra.append({"row": name, "status": "skipped", "why": "needs " + ", ".join(missing)})
                print("%-40s skipped: needs %s" % (label, ", ".join(missing)))
                continue
            result, why = run_child(["--child-w7", name, "--reps", str(args.reps), "--rep-ms",
                                     str(max(args.rep_ms, 20.0))], args.row_timeout_s)
            if result is None:
                extra.append({"row": name, "status": "failed", "why": why})
                print("%-40s failed: %s" % (label, why))
            else:
                result["status"] = "ok"
                extra.append(result)
                print("%-40s %14s ns/alloc+free (min %s)" % (label, "{:,.0f}".format(result["median_ns"]),
                                                              "{:,.0f}".format(result["min_ns"])))
        print()
        document["workloads"].append({"id": "W7", "w7_py": w7_json, "extra_rows": extra})

    save()
    if args.json:
        print("results written to %s" % args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
