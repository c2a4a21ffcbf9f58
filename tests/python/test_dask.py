"""gpumem.dask on a distributed.LocalCluster of two worker processes (one thread each): the
plugin configures gpumem on every worker, tasks allocate through gpumem.DeviceBuffer, the
statistics come back in one table, the caps are enforced with errors that name them, each
worker writes its own log and statistics, and an allocation exported by one worker is
opened by the other (docs/distributed.md). Skipped where distributed is not installed."""

import importlib.util
import json
import logging
import os
import subprocess
import sys

import pytest

distributed = pytest.importorskip("distributed")

import gpumem  # noqa: E402
import gpumem.dask  # noqa: E402
import gpumem.ipc  # noqa: E402
from conftest import BACKEND  # noqa: E402

MiB = 1 << 20


@pytest.fixture(scope="module")
def client():
    # One cluster for the module (starting one costs about a second); each test registers
    # the plugin it needs, which replaces the previous one on every worker.
    cluster = distributed.LocalCluster(
        n_workers=2,
        processes=True,
        threads_per_worker=1,
        dashboard_address=None,
        worker_dashboard_address=None,
        silence_logs=logging.ERROR,
        env={"GPUMEM_BACKEND": BACKEND},
    )
    c = distributed.Client(cluster)
    try:
        c.wait_for_workers(2, timeout=60)
        yield c
    finally:
        c.close()
        cluster.close()


def _workers(client):
    """The two workers' addresses, ordered by worker name."""
    info = client.scheduler_info()["workers"]
    return [a for a, _ in sorted(info.items(), key=lambda item: str(item[1]["name"]))]


def _allocate(sizes, keep):
    """A task: allocates `sizes` through gpumem.DeviceBuffer, frees all but the first `keep`
    (kept on the worker until _release), and returns the worker's pid."""
    buffers = [gpumem.DeviceBuffer(n) for n in sizes]
    for b in buffers[:keep]:
        b.copy_from_host(bytes(b.size))
    held = distributed.get_worker().__dict__.setdefault("_gpumem_test_held", [])
    held.extend(buffers[:keep])
    del buffers
    return os.getpid()


def _release():
    distributed.get_worker().__dict__.pop("_gpumem_test_held", None)
    return True


def _allocate_one(nbytes):
    gpumem.DeviceBuffer(nbytes).close()
    return nbytes


def test_plugin_statistics_caps_and_logs(client, tmp_path):
    logs = tmp_path / "logs"
    plugin = gpumem.dask.GpumemPlugin("pool", maximum="32MiB", limit="48MiB", log_directory=logs)
    assert plugin.conf == "pool,maximum=32MiB,limit=48MiB,stats"
    client.register_plugin(plugin)
    w0, w1 = _workers(client)

    # Worker 0: 3 + 5 MiB live at once, then 5 freed; worker 1: 1, 2 and 4 MiB, 1 kept.
    pid0 = client.submit(_allocate, [3 * MiB, 5 * MiB], 1, workers=[w0], pure=False).result()
    pid1 = client.submit(_allocate, [MiB, 2 * MiB, 4 * MiB], 1, workers=[w1], pure=False).result()
    assert pid0 != pid1 != os.getpid()

    rows = gpumem.dask.gather_statistics(client)
    assert [r["address"] for r in rows] == [w0, w1]
    by_address = {r["address"]: r for r in rows}
    r0, r1 = by_address[w0], by_address[w1]
    assert (r0["pid"], r1["pid"]) == (pid0, pid1)
    for r in rows:
        assert r["device"] == 0
        assert r["stack"] == "log(stats(limit(pool(log(cuda)))))"
        assert r["limit_bytes"] == 48 * MiB
        assert r["maximum_bytes"] == 32 * MiB
        assert r["log"].startswith(str(logs)) and r["log"].endswith("-%d.csv" % r["pid"])
    assert (r0["current_bytes"], r0["peak_bytes"], r0["total_bytes"]) == (3 * MiB, 8 * MiB, 8 * MiB)
    assert (r0["current_count"], r0["peak_count"], r0["total_count"]) == (1, 2, 2)
    assert (r1["current_bytes"], r1["peak_bytes"], r1["total_bytes"]) == (MiB, 7 * MiB, 7 * MiB)
    assert r0["used_bytes"] >= 3 * MiB and r0["reserved_bytes"] >= r0["used_bytes"]

    table = gpumem.dask.format_statistics(rows)
    lines = table.splitlines()
    assert lines[0].split()[:5] == ["worker", "pid", "dev", "current", "peak"]
    assert "8.00 MiB" in lines[1] and "7.00 MiB" in lines[2]
    assert lines[-1].split()[:5] == ["sum", "4.00", "MiB", "15.00", "MiB"]

    # The caps, enforced on the workers, reach the client as gpumem's typed error naming them.
    with pytest.raises(gpumem.OutOfMemoryError, match="the limit of 50331648 bytes"):
        client.submit(_allocate_one, 56 * MiB, workers=[w0], pure=False).result()
    with pytest.raises(gpumem.OutOfMemoryError, match="maximum_bytes 33554432") as info:
        client.submit(_allocate_one, 40 * MiB, workers=[w1], pure=False).result()
    assert info.value.requested_bytes == 40 * MiB
    # Under the caps the same workers go on allocating.
    assert client.submit(_allocate_one, 20 * MiB, workers=[w1], pure=False).result() == 20 * MiB

    # One log per worker, named after the worker and its pid, with that worker's calls.
    paths = gpumem.dask.flush_logs(client)
    assert sorted(p for v in paths.values() for p in v) == sorted([r0["log"], r1["log"]])
    for r, sizes in ((r0, {3 * MiB, 5 * MiB}), (r1, {MiB, 2 * MiB, 4 * MiB, 20 * MiB})):
        name = os.path.basename(r["log"])
        assert name == gpumem.dask.log_name(r["worker"], r["pid"])
        with open(r["log"]) as f:
            header, *events = f.read().splitlines()
        assert header.startswith("seq,time_ns,thread,device,stream,source,op,ptr,bytes")
        app = [e.split(",") for e in events if ",app,allocate," in e]
        assert {int(e[8]) for e in app if e[10] == "ok"} == sizes
        assert any(e[10] == "oom" for e in app)  # the refused request is logged too

    client.submit(_release, workers=[w0], pure=False).result()
    client.submit(_release, workers=[w1], pure=False).result()
    rows = gpumem.dask.gather_statistics(client)
    assert [r["current_bytes"] for r in rows] == [0, 0]
    assert [r["peak_bytes"] for r in rows] == [8 * MiB, 21 * MiB]  # 1 MiB was held with the 20

    # Removing the plugin tears it down on each worker: logs flushed, statistics written.
    client.unregister_worker_plugin(plugin.name)
    for r in rows:
        with open(r["log"][: -len(".csv")] + ".json") as f:
            saved = json.load(f)
        assert saved["pid"] == r["pid"] and saved["worker"] == r["worker"]
        assert saved["devices"][0]["statistics"]["peak_bytes"] == r["peak_bytes"]

    # gpumem-report draws every worker's log on one page, one chart each, named by its file.
    try:
        index = gpumem.dask.report_logs(logs)
    except FileNotFoundError as e:
        pytest.skip(str(e))
    assert index == os.path.join(os.path.abspath(logs), "index.html")
    page = open(index).read()
    assert page.count("<svg") == len(rows) == 2
    for r in rows:
        assert 'data-log="%s"' % os.path.basename(r["log"]) in page
    assert "no wall-clock time" in page  # the caption: each chart starts at its own log's opening


def _budget_probe():
    report = gpumem.stack_report(device=0)
    try:
        gpumem.DeviceBuffer(report["maximum_bytes"] + MiB)
    except gpumem.OutOfMemoryError as e:
        return report, str(e)
    return report, None


def test_budget_as_a_fraction_of_the_device(client):
    # A float is a fraction of each worker's device: the budget of gpumem's default stack.
    client.register_plugin(gpumem.dask.GpumemPlugin(maximum=0.05, statistics=False))
    total = client.submit(lambda: gpumem.device_memory_info(0)[1], pure=False).result()
    answers = client.run(_budget_probe)
    assert len(answers) == 2
    for report, error in answers.values():
        assert report["maximum_bytes"] == int(total * 0.05)
        assert report["statistics"] is None and report["logs"] == []
        assert error is not None and "maximum_bytes %d (the budget)" % report["maximum_bytes"] in error
    rows = gpumem.dask.gather_statistics(client)
    assert [r["peak_bytes"] for r in rows] == [None, None]  # no stats adaptor asked for
    assert all(r["maximum_bytes"] == int(total * 0.05) for r in rows)


def _export(nbytes):
    buf = gpumem.DeviceBuffer.from_host(bytes((i * 7 + 1) & 0xFF for i in range(nbytes)))
    distributed.get_worker().__dict__["_gpumem_test_exported"] = buf
    # The handle keeps the buffer alive too, and Dask keeps the handle (the task's result) on
    # this worker while the client holds its future: the importer can open it.
    return gpumem.ipc.export(buf)


def _open_and_write(handle):
    try:
        with handle.open() as mem:
            seen = mem.copy_to_host()
            mem.copy_from_host(bytes((i * 13 + 5) & 0xFF for i in range(mem.size)))
    except gpumem.UnsupportedError as e:
        return "unsupported: %s" % e
    return os.getpid(), handle.exporter_pid, seen == bytes((i * 7 + 1) & 0xFF for i in range(len(seen)))


def _read_exported():
    buf = distributed.get_worker().__dict__.pop("_gpumem_test_exported")
    return buf.copy_to_host() == bytes((i * 13 + 5) & 0xFF for i in range(buf.size))


def test_ipc_between_workers(client):
    # A pool over cuMemAlloc: legacy IPC handles, which another worker (a sibling process,
    # not a child) opens through the driver (the simulator: /proc/<pid>/fd).
    client.register_plugin(gpumem.dask.GpumemPlugin("pool", statistics=False))
    w0, w1 = _workers(client)
    handle = client.submit(_export, 70001, workers=[w0], pure=False)
    opened = client.submit(_open_and_write, handle, workers=[w1], pure=False).result()
    if isinstance(opened, str):
        pytest.skip(opened)
    importer, exporter, parent_bytes_seen = opened
    assert importer != exporter
    assert parent_bytes_seen
    assert client.submit(_read_exported, workers=[w0], pure=False).result()


def test_plugin_checks_its_arguments_on_the_client():
    with pytest.raises(gpumem.LogicError, match="initail"):
        gpumem.dask.GpumemPlugin("pool,initail=1G")
    with pytest.raises(ValueError, match="cupy, numba, torch"):
        gpumem.dask.GpumemPlugin(external_libs=["jax"])
    with pytest.raises(ValueError, match="log_directory"):
        gpumem.dask.GpumemPlugin("pool,log=x.csv", log_directory="logs")
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        gpumem.dask.GpumemPlugin(maximum=1.5)
    with pytest.raises(ValueError, match="log_sites=True needs log_directory"):
        gpumem.dask.GpumemPlugin(log_sites=True)
    plugin = gpumem.dask.GpumemPlugin("pool,stats", external_libs="CuPy, torch", initial=0.25)
    assert plugin.conf == "pool,stats,initial=25%"  # stats not added twice
    assert plugin.external_libs == ["cupy", "torch"]


class _Worker:
    name = "stand-in"
    address = "inproc://stand-in"


def test_a_framework_that_is_not_installed_is_named(monkeypatch):
    # Checked before anything is reconfigured, so running setup here changes nothing.
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "torch" else real(n, *a))
    before = gpumem.get_current_resource(0)
    plugin = gpumem.dask.GpumemPlugin("pool", external_libs=["torch"])
    with pytest.raises(ImportError, match="names 'torch', which is not installed on worker stand-in") as info:
        plugin.setup(_Worker())
    assert info.value.name == "torch"
    assert gpumem.get_current_resource(0) == before
    plugin.teardown(_Worker())  # nothing was set up: nothing to do


def test_log_names():
    assert gpumem.dask.log_name(0, 123) == "gpumem-0-123.csv"
    assert gpumem.dask.log_name("tcp://10.0.0.1:4000", 7, device=1) == "gpumem-tcp_10.0.0.1_4000-7-device1.csv"


def _raise_oom():
    # A stack of its own: the process's current resource is left alone.
    gpumem.make_resource("pool", limit="1MiB", device=0).allocate(2 * MiB)


def test_gpumem_errors_cross_to_the_client_typed():
    # Dask sends a task's exception through tblib's pickling; each of gpumem's error types
    # must come back as itself with its attributes (OutOfMemoryError's bases are ordered
    # for that: python/src/errors.cpp).
    from distributed.core import error_message
    from distributed.protocol import pickle

    def sent(error):
        try:
            raise error
        except gpumem.GpumemError as e:
            # What a worker sends (it falls back to Exception(repr) for what cannot make the trip).
            return pickle.loads(error_message(e)["exception"].data)

    with pytest.raises(gpumem.OutOfMemoryError) as info:
        _raise_oom()
    for error in (info.value, gpumem.LogicError("bad"), gpumem.UnsupportedError("no"), gpumem.CudaError("x")):
        again = sent(error)
        assert type(again) is type(error) and str(again) == str(error)
    oom = sent(info.value)
    assert oom.requested_bytes == 2 * MiB and oom.resource == "limiting_adaptor"
    assert isinstance(oom, MemoryError) and isinstance(oom, gpumem.GpumemError)


def test_the_example_runs():
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "examples", "python", "dask_workers.py")
    env = dict(os.environ, GPUMEM_BACKEND=BACKEND)
    done = subprocess.run([sys.executable, script, "--tasks", "4"], capture_output=True, text=True,
                          timeout=180, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gpumem on 2 worker(s), %s backend" % BACKEND in done.stdout, done.stdout
    assert "\nsum " in done.stdout and "4 tasks allocated" in done.stdout, done.stdout


def _hold_framework_arrays():
    import cupy
    import torch

    held = distributed.get_worker().__dict__.setdefault("_gpumem_test_held", [])
    held.append(cupy.zeros(8 * MiB, dtype=cupy.uint8))
    held.append(torch.zeros(16 * MiB, dtype=torch.uint8, device="cuda"))
    torch.cuda.synchronize()
    return gpumem.stack_report(device=0)["statistics"]["current_bytes"]


@pytest.mark.gpu_only
def test_cupy_and_torch_on_the_workers_allocate_through_gpumem(client):
    pytest.importorskip("cupy")
    pytest.importorskip("torch")
    client.register_plugin(gpumem.dask.GpumemPlugin("pool", maximum=0.2, external_libs=["cupy", "torch"]))
    workers = _workers(client)
    for w in workers:
        assert client.submit(_hold_framework_arrays, workers=[w], pure=False).result() >= 24 * MiB
    rows = gpumem.dask.gather_statistics(client)
    assert all(r["current_bytes"] >= 24 * MiB and r["peak_bytes"] >= 24 * MiB for r in rows)
    for w in workers:
        client.submit(_release, workers=[w], pure=False).result()


def _cupy_task(n):
    import cupy

    a = cupy.arange(n, dtype=cupy.float32)
    return float(a.sum())


@pytest.mark.gpu_only
def test_local_cuda_cluster(tmp_path):
    dask_cuda = pytest.importorskip("dask_cuda")
    pytest.importorskip("cupy")
    cluster = dask_cuda.LocalCUDACluster(threads_per_worker=1, dashboard_address=None, silence_logs=logging.ERROR)
    try:
        with distributed.Client(cluster) as c:
            c.register_plugin(
                gpumem.dask.GpumemPlugin("pool", maximum=0.5, external_libs=["cupy"], log_directory=tmp_path)
            )
            assert c.gather(c.map(_cupy_task, [1 << 20, 1 << 21], pure=False)) == [
                float(sum(range(1 << 20))),
                float(sum(range(1 << 21))),
            ]
            rows = gpumem.dask.gather_statistics(c)
            assert len(rows) == gpumem.device_count()  # one worker per GPU, each sees its GPU as 0
            assert all(r["device"] == 0 and r["stack"] == "log(stats(pool(log(cuda))))" for r in rows)
            assert sum(r["peak_bytes"] for r in rows) >= 4 << 20
            assert all(os.path.exists(p) for paths in gpumem.dask.flush_logs(c).values() for p in paths)
    finally:
        cluster.close()
