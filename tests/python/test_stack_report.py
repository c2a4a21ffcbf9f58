"""gpumem.stack_report and gpumem.flush_logs: what a stack from the GPUMEM_CONF grammar has
counted, read without allocating, and its logs written on demand (docs/python.md)."""

import pytest

import gpumem

MiB = 1 << 20


def test_every_layer_is_read(tmp_path):
    log = str(tmp_path / "run.csv")
    mr = gpumem.make_resource("pool", device=0, maximum="64MiB", limit="48MiB", stats=True, log=log)
    a = mr.allocate(3 * MiB)
    b = mr.allocate(5 * MiB)
    mr.deallocate(b, 5 * MiB)
    with pytest.raises(gpumem.OutOfMemoryError):
        mr.allocate(50 * MiB)  # past the limit: refused, not counted
    r = gpumem.stack_report(resource=mr)
    assert r["stack"] == "log(stats(limit(pool(log(cuda)))))" == gpumem.describe_config(
        "pool,maximum=64MiB,limit=48MiB,stats,log=x.csv"
    ).replace("log:upstream", "log")
    assert r["device"] == 0
    assert r["statistics"] == {
        "current_bytes": 3 * MiB,
        "peak_bytes": 8 * MiB,
        "total_bytes": 8 * MiB,
        "current_count": 1,
        "peak_count": 2,
        "total_count": 2,
    }
    assert (r["limit_bytes"], r["limit_used_bytes"]) == (48 * MiB, 3 * MiB)
    assert r["maximum_bytes"] == 64 * MiB
    assert r["used_bytes"] >= 3 * MiB and r["reserved_bytes"] >= 8 * MiB
    assert r["logs"] == [log] and r["log_events"] >= 5
    assert gpumem.flush_logs(resource=mr) == [log]
    with open(log) as f:
        rows = f.read().splitlines()[1:]
    assert sum(",app,allocate," in row for row in rows) == 3  # the refused one too
    assert sum(",upstream,allocate," in row for row in rows) >= 1
    mr.deallocate(a, 3 * MiB)
    assert gpumem.stack_report(resource=mr)["statistics"]["current_bytes"] == 0


def test_bare_bases():
    vmm = gpumem.stack_report(resource=gpumem.make_resource("default", device=0, maximum="10%"))
    assert vmm["stack"] == "vmm" and vmm["statistics"] is None and vmm["logs"] == []
    assert vmm["maximum_bytes"] == int(gpumem.device_memory_info(0)[1] * 0.10)
    cuda = gpumem.make_resource("cuda", device=0, stats=True)
    p = cuda.allocate(MiB)
    r = gpumem.stack_report(resource=cuda)
    assert r["stack"] == "stats(cuda)" and r["used_bytes"] == r["reserved_bytes"] == MiB
    assert r["maximum_bytes"] is None and r["limit_bytes"] is None and r["log_events"] is None
    assert gpumem.flush_logs(resource=cuda) == []
    cuda.deallocate(p, MiB)


def test_the_current_resource_by_default():
    assert gpumem.stack_report()["stack"] == gpumem.stack_report(device=gpumem.current_device())["stack"]
