"""gpumem on Dask workers: a worker plugin that sets gpumem up on every worker, and helpers
that gather every worker's figures into one table (docs/distributed.md).

    from distributed import Client, LocalCluster      # or dask_cuda.LocalCUDACluster
    import gpumem.dask

    client = Client(LocalCluster(n_workers=2, threads_per_worker=1))
    client.register_plugin(gpumem.dask.GpumemPlugin(
        "pool", maximum="45%",                       # each worker's budget: 45% of its GPU
        external_libs=["cupy", "torch"],             # point CuPy and PyTorch at gpumem
        log_directory="gpumem-logs"))                # one CSV log and statistics per worker
    ...
    print(gpumem.dask.format_statistics(gpumem.dask.gather_statistics(client)))

The plugin is dask-cuda's ``rmm_*`` options on gpumem's engines: the resource stack comes
from a GPUMEM_CONF string and/or keywords (docs/configuration.md), made the current resource
of the worker's device(s) in ``setup`` (register the plugin before the first task touches
the GPU), with a statistics adaptor so that current and peak bytes can be gathered, and a
log per worker. ``distributed`` is imported by this module; numba, cupy and torch only by
the plugin's ``setup`` on the workers, and only those named in ``external_libs``.
"""

import datetime
import importlib.util
import json
import os
import re

try:
    from distributed import WorkerPlugin as _WorkerPlugin
except ImportError as _e:  # pragma: no cover - exercised where distributed is missing
    raise ImportError(
        "gpumem.dask needs Dask's 'distributed' package on the client and every worker "
        "(pip install distributed): %s" % (_e,)
    ) from _e

import gpumem
from gpumem import _core

__all__ = [
    "EXTERNAL_LIBS",
    "GpumemPlugin",
    "flush_logs",
    "format_statistics",
    "gather_statistics",
    "log_name",
    "report_logs",
]

#: The frameworks ``external_libs`` may name, and the gpumem module that points each at gpumem.
EXTERNAL_LIBS = {"numba": "gpumem.numba", "cupy": "gpumem.cupy", "torch": "gpumem.torch"}

# GPUMEM_CONF options whose value is a size: a float in (0, 1] given as a keyword is a
# fraction of the device (0.4 -> "40%"), as dask-cuda's rmm_pool_size takes it.
_SIZE_OPTIONS = ("initial", "maximum", "min_chunk", "max_chunk", "release_threshold", "limit")


def _size_text(name, value):
    if isinstance(value, float):
        if not 0.0 < value <= 1.0:
            raise ValueError(
                "gpumem.dask: %s=%r: a float is a fraction of the device's memory, in (0, 1]; "
                "give bytes as an int or text such as '8GiB'" % (name, value)
            )
        return "%g%%" % (value * 100.0)
    return value


def _option_names(conf):
    """The option names of a GPUMEM_CONF string (the base left out), lower-case."""
    tokens = [t.strip() for t in (conf or "").split(",")][1:]
    return {t.split("=", 1)[0].strip().lower() for t in tokens if t}


def log_name(worker_name, pid, device=None):
    """The file name (no folder) of a worker's log: ``gpumem-<worker name>-<pid>.csv``, with
    ``-device<d>`` before ``.csv`` when the plugin configures several devices. Characters
    other than letters, digits, ``.``, ``_`` and ``-`` in the name become ``_`` (a worker
    started by ``dask worker`` is named after its address)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", str(worker_name)).strip("_") or "worker"
    suffix = "" if device is None else "-device%d" % device
    return "gpumem-%s-%d%s.csv" % (safe, pid, suffix)


class GpumemPlugin(_WorkerPlugin):
    """A Dask worker plugin that makes a gpumem resource stack the current resource of the
    worker's device(s) before its tasks use the GPU, points the frameworks in
    ``external_libs`` at it, and writes a log and statistics per worker.

    ``conf`` is a GPUMEM_CONF string (``"pool,maximum=40%"``; None: ``"default"``) and the
    keywords add options as ``gpumem.make_resource`` takes them: ``initial``, ``maximum``,
    ``release_threshold``, ``limit``, ``min_chunk``, ``max_chunk``, ``peers``, ``defer``,
    ``track`` (True for a flag; a float in (0, 1] for a size is a fraction of the device).
    ``maximum`` is the worker's budget on ``pool``, ``async``, ``vmm`` and ``default``, a
    hard cap on what the process holds; ``limit`` caps live bytes over any base. Either cap
    makes an allocation past it raise ``gpumem.OutOfMemoryError`` naming it.

    ``devices``: the ordinals to configure: an int, a list, or None for every device the
    worker sees. The default, 0, is the worker's GPU under dask-cuda (which gives each
    worker one through CUDA_VISIBLE_DEVICES) and the first GPU under a plain LocalCluster.

    ``external_libs``: any of ``"numba"``, ``"cupy"``, ``"torch"`` (a list, or text with
    commas, as dask-cuda's ``rmm_allocator_external_lib_list``). A framework that is not
    installed on the worker fails ``setup`` with ``ImportError`` naming it, before gpumem is
    reconfigured.

    ``log_directory``: a folder (made if missing; a path each worker can reach, so on one
    host or a shared file system) that gets, per worker, the CSV event log
    ``gpumem-<worker>-<pid>.csv`` (see ``log_name``; gpumem-report draws it) and, when the
    plugin is torn down (worker closing, plugin unregistered), ``gpumem-<worker>-<pid>.json``
    with the final statistics. ``log_sites`` adds the allocation site column.

    ``statistics`` (default True) adds the ``stats`` adaptor, so that ``gather_statistics``
    has current, peak and total bytes (it costs about 1.5 ns per call,
    docs/observability.md); the adaptor also prints its counters on the worker's stderr at
    exit, as GPUMEM_CONF's ``stats`` does.

    A bad configuration is a ``gpumem.LogicError`` here, on the client, before anything is
    sent to the workers.
    """

    name = "gpumem"

    def __init__(
        self,
        conf=None,
        *,
        devices=0,
        external_libs=(),
        log_directory=None,
        log_sites=False,
        statistics=True,
        **options,
    ):
        for key in list(options):
            if key in _SIZE_OPTIONS:
                options[key] = _size_text(key, options[key])
        if options.get("log") is not None or options.get("sites"):
            raise ValueError(
                "gpumem.dask.GpumemPlugin: name the logs' folder with log_directory= (one log "
                "per worker), not log= / sites= (a single path every worker would share)"
            )
        given = _option_names(conf) | {k for k, v in options.items() if v is not None and v is not False}
        if log_directory is not None and ("log" in given or "sites" in given):
            raise ValueError(
                "gpumem.dask.GpumemPlugin: the configuration %r has its own log= and "
                "log_directory=%r names another place; give one of them" % (conf, log_directory)
            )
        if log_sites and log_directory is None:
            raise ValueError("gpumem.dask.GpumemPlugin: log_sites=True needs log_directory=")
        if statistics and "stats" not in given:
            options["stats"] = True
        self.conf = gpumem._conf_text(conf, options)
        # Checked here, on the client: the probe path stands for each worker's log.
        gpumem.describe_config(self.conf + (",log=probe.csv" if log_directory is not None else ""))

        if isinstance(external_libs, str):
            external_libs = [s for s in (p.strip() for p in external_libs.split(",")) if s]
        self.external_libs = []
        for lib in external_libs:
            key = str(lib).strip().lower()
            if key not in EXTERNAL_LIBS:
                raise ValueError(
                    "gpumem.dask.GpumemPlugin: external_libs names %r; gpumem can be the "
                    "allocator of %s" % (lib, ", ".join(sorted(EXTERNAL_LIBS)))
                )
            if key not in self.external_libs:
                self.external_libs.append(key)

        if devices is not None and not isinstance(devices, int):
            devices = [int(d) for d in devices]
        self.devices = devices
        self.log_directory = None if log_directory is None else os.path.abspath(os.fspath(log_directory))
        self.log_sites = bool(log_sites)
        # Set on the worker by setup():
        self.worker_name = None
        self.logs = {}  # device -> log path
        self.statistics_path = None
        self.configured_devices = []
        self._stacks = {}  # device -> the stack setup() made current (not pickled)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_stacks"] = {}
        return state

    def __repr__(self):
        return "<gpumem.dask.GpumemPlugin conf=%r devices=%r external_libs=%r log_directory=%r>" % (
            self.conf,
            self.devices,
            self.external_libs,
            self.log_directory,
        )

    # ---- on the worker ----------------------------------------------------------------

    def setup(self, worker):
        """Runs on the worker when the plugin is registered or the worker starts: checks that
        the frameworks in ``external_libs`` are installed, makes the stack current for each
        device (opening this worker's logs), then points the frameworks at gpumem."""
        self.worker_name = getattr(worker, "name", None)
        if self.worker_name is None:
            self.worker_name = getattr(worker, "address", "worker")
        for lib in self.external_libs:
            if importlib.util.find_spec(lib) is None:
                raise ImportError(
                    "gpumem.dask: external_libs names %r, which is not installed on worker %s "
                    "(pid %d); install it there or leave it out" % (lib, self.worker_name, os.getpid()),
                    name=lib,
                )

        devices = self.devices
        if devices is None:
            devices = list(range(gpumem.device_count()))
        elif isinstance(devices, int):
            devices = [devices]
        logs = {}
        self.statistics_path = None
        if self.log_directory is not None:
            os.makedirs(self.log_directory, exist_ok=True)
            logs, self.statistics_path = self._fresh_paths(devices)
        stacks = {}
        for d in devices:
            conf = self.conf
            if d in logs:
                conf += ",log=%s%s" % (logs[d], ",sites" if self.log_sites else "")
            stacks[d] = _core.make_resource(conf, d)  # all built before any is made current
        for d, stack in stacks.items():
            gpumem.set_current_resource(stack, d)
        self._stacks = stacks
        self.logs = logs
        self.configured_devices = list(devices)

        for lib in self.external_libs:
            module = importlib.import_module(EXTERNAL_LIBS[lib])
            try:
                getattr(module, "use_gpumem_for_" + lib)()
            except Exception as e:
                raise RuntimeError(
                    "gpumem.dask: could not make gpumem the allocator of %s on worker %s: %s (the "
                    "plugin must be registered before the worker's first GPU allocation)"
                    % (lib, self.worker_name, e)
                ) from e

    def teardown(self, worker):
        """Runs when the worker closes or the plugin is removed: writes every log's pending
        events and, with ``log_directory``, the worker's statistics as JSON beside its log."""
        if not self.configured_devices:
            return  # setup failed or never ran
        for stack in self._stacks.values():
            _core._flush_logs(stack)
        if self.statistics_path is not None:
            path = self.statistics_path
            data = {
                "worker": str(self.worker_name),
                "address": getattr(worker, "address", None),
                "pid": os.getpid(),
                "written": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                "devices": self.statistics(),
            }
            with open(path, "w") as f:
                json.dump(data, f, indent=1)

    def statistics(self):
        """This worker's figures: one ``gpumem.stack_report`` dict per configured device, of
        the stack ``setup`` made (also after the program replaced the current resource)."""
        return [gpumem.stack_report(resource=self._stacks[d]) for d in self.configured_devices]

    def _fresh_paths(self, devices):
        # A plugin registered again on the same worker gets new files: the old stack may
        # still hold its log open (its memory goes back to it), so ".2", ".3", ... is added.
        stem = os.path.join(self.log_directory, log_name(self.worker_name, os.getpid())[: -len(".csv")])
        n = 1
        while True:
            base = stem if n == 1 else "%s.%d" % (stem, n)
            if len(devices) == 1:
                logs = {devices[0]: base + ".csv"}
            else:
                logs = {d: "%s-device%d.csv" % (base, d) for d in devices}
            paths = list(logs.values()) + [base + ".json"]
            if not any(os.path.exists(p) for p in paths):
                return logs, base + ".json"
            n += 1


# ---- on the client ------------------------------------------------------------------------


def _find_plugin(dask_worker):
    for plugin in getattr(dask_worker, "plugins", {}).values():
        if isinstance(plugin, GpumemPlugin) and plugin.configured_devices:
            return plugin
    return None


_ROW_KEYS = (
    "current_bytes",
    "peak_bytes",
    "total_bytes",
    "current_count",
    "peak_count",
    "total_count",
)


def _worker_rows(dask_worker):
    """Runs on each worker (through client.run): one row per configured device."""
    plugin = _find_plugin(dask_worker)
    head = {"worker": str(dask_worker.name), "address": dask_worker.address, "pid": os.getpid()}
    if plugin is None:
        row = dict(head, device=None, stack=None, log=None)
        row.update((k, None) for k in _ROW_KEYS + ("limit_bytes", "maximum_bytes", "used_bytes", "reserved_bytes"))
        return [row]
    rows = []
    for report in plugin.statistics():
        counters = report["statistics"] or {}
        row = dict(head, device=report["device"], stack=report["stack"])
        row.update((k, counters.get(k)) for k in _ROW_KEYS)
        for k in ("limit_bytes", "maximum_bytes", "used_bytes", "reserved_bytes"):
            row[k] = report[k]
        row["log"] = plugin.logs.get(report["device"])
        rows.append(row)
    return rows


def gather_statistics(client, workers=None):
    """Every worker's gpumem figures, one row (a dict) per worker and device, sorted by
    worker name: ``worker``, ``address``, ``pid``, ``device``, ``stack`` (the layers, as
    ``gpumem.describe_config`` writes them), ``current_bytes``, ``peak_bytes``,
    ``total_bytes`` and the same three as counts (from the stack's statistics adaptor; None
    without one), ``limit_bytes`` and ``maximum_bytes`` (the caps; None where unset),
    ``used_bytes`` and ``reserved_bytes`` (what the base resource hands out and holds from
    the device), ``log`` (the worker's log path). A worker without the plugin gets one row
    whose figures are None (nothing is read there, so no GPU is touched).
    ``workers``: addresses to ask (default: all)."""
    answers = client.run(_worker_rows, workers=workers)
    rows = [row for address in answers for row in answers[address]]

    def key(row):
        name = row["worker"]
        return (0, int(name), "") if name.isdigit() else (1, 0, name)

    return sorted(rows, key=lambda r: (key(r), r["device"] if r["device"] is not None else -1))


def _human(n):
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.2f %s" % (n, unit))
        n /= 1024.0
    return str(n)  # not reached


def format_statistics(rows):
    """``gather_statistics``'s rows as a text table (sizes in binary units), with a last line
    adding up current and peak bytes over the workers (the sum of peaks bounds what the
    workers held at once)."""
    header = ("worker", "pid", "dev", "current", "peak", "total", "allocs", "cap", "reserved", "stack")
    lines = [header]
    for r in rows:
        cap = r["limit_bytes"] if r["limit_bytes"] is not None else r["maximum_bytes"]
        if r["limit_bytes"] is not None and r["maximum_bytes"] is not None:
            cap = min(r["limit_bytes"], r["maximum_bytes"])
        lines.append(
            (
                r["worker"],
                str(r["pid"]),
                "-" if r["device"] is None else str(r["device"]),
                _human(r["current_bytes"]),
                _human(r["peak_bytes"]),
                _human(r["total_bytes"]),
                "-" if r["total_count"] is None else str(r["total_count"]),
                _human(cap),
                _human(r["reserved_bytes"]),
                r["stack"] or "(no gpumem plugin)",
            )
        )
    current = sum(r["current_bytes"] or 0 for r in rows)
    peak = sum(r["peak_bytes"] or 0 for r in rows)
    lines.append(("sum", "", "", _human(current), _human(peak), "", "", "", "", ""))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = []
    for line in lines:
        text.append("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip())
    return "\n".join(text)


def _worker_flush(dask_worker):
    plugin = _find_plugin(dask_worker)
    if plugin is None:
        return []
    paths = []
    for stack in plugin._stacks.values():
        paths += _core._flush_logs(stack)
    return paths


def flush_logs(client, workers=None):
    """Makes every worker write its log's pending events now (they are otherwise written
    when a thread's buffer fills, about once a second while the thread allocates, and when
    the worker closes). Returns ``{worker address: [log paths]}``."""
    return client.run(_worker_flush, workers=workers)


def report_logs(directory, output=None, title="gpumem: memory of every worker"):
    """Draws every worker log in ``directory`` (``gpumem-*.csv``) on one page with the bundled
    ``gpumem-report``: one chart per log, named by its file name, on one time scale and one
    byte scale, and a table of every log's figures (events, peaks, out-of-memory counts).
    Writes ``output`` (default ``directory/index.html``) and returns its path. Run it after
    ``flush_logs`` or once the workers have closed. ``FileNotFoundError`` when this
    installation has no gpumem-report or the folder has no log; ``RuntimeError`` with
    gpumem-report's message (naming the file) when a log cannot be read."""
    import subprocess

    tool = os.path.join(os.path.dirname(os.path.abspath(gpumem.__file__)), "bin", "gpumem-report")
    if not os.access(tool, os.X_OK):
        raise FileNotFoundError(
            "gpumem.dask.report_logs: %s is missing; gpumem-report is built with the C++ tools "
            "(cmake -DGPUMEM_BUILD_TOOLS=ON) and comes with the wheel" % tool
        )
    directory = os.path.abspath(os.fspath(directory))
    # Worker 2 before worker 10: numbers in names compare as numbers.
    logs = sorted(
        (f for f in os.listdir(directory) if f.startswith("gpumem-") and f.endswith(".csv")),
        key=lambda f: [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", f)],
    )
    if not logs:
        raise FileNotFoundError("gpumem.dask.report_logs: no gpumem-*.csv log in %s" % directory)
    output = os.path.join(directory, "index.html") if output is None else os.fspath(output)
    done = subprocess.run(
        [tool] + [os.path.join(directory, name) for name in logs] + ["-o", output, "--title", title],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError("gpumem.dask.report_logs: gpumem-report failed: %s" % done.stderr.strip())
    return output
