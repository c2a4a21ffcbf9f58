"""Adaptors from Python: each composes over a pool, does its one thing, keeps its upstream
alive, and refuses bad options with gpumem's errors (docs/observability.md)."""

import csv
import gc
import threading

import pytest
from conftest import run_python

import gpumem

MiB = 1 << 20


@pytest.fixture
def pool():
    return gpumem.PoolResource(gpumem.CudaResource(0))


ADAPTORS = {
    "stats": lambda up: gpumem.StatisticsAdaptor(up),
    "track": lambda up: gpumem.TrackingAdaptor(up, report_at_exit=False),
    "log": lambda up, path=None: gpumem.LoggingAdaptor(up, path),
    "limit": lambda up: gpumem.LimitingAdaptor(up, 64 * MiB),
    "oom_retry": lambda up: gpumem.OomRetryAdaptor(up),
    "defer": lambda up: gpumem.DeferredFreeAdaptor(up),
    "thread_safe": lambda up: gpumem.ThreadSafeAdaptor(up),
}


@pytest.mark.parametrize("name", sorted(ADAPTORS))
def test_every_adaptor_composes_over_a_pool_and_serves_buffers(name, pool, tmp_path):
    make = ADAPTORS[name]
    a = make(pool, str(tmp_path / "log.csv")) if name == "log" else make(pool)
    assert isinstance(a, gpumem.ResourceAdaptor) and isinstance(a, gpumem.MemoryResource)
    assert a.layer_name == name and a.layers() == [name, "pool", "cuda"]
    assert a.upstream is pool and a.device == 0
    assert a == a and a != pool
    data = bytes(range(256)) * 64
    buf = gpumem.DeviceBuffer.from_host(data, resource=a)
    assert buf.resource is a and buf.copy_to_host() == data
    s = gpumem.Stream()
    p = a.allocate(1000, s, 512)
    a.deallocate(p, 1000, s, 512)
    del buf
    if name == "defer":
        a.flush()
    assert pool.statistics()["allocations"] == 0
    assert "over pool" in repr(a)


def test_an_adaptor_keeps_its_upstream_alive():
    cuda = gpumem.CudaResource(0)
    stats = gpumem.StatisticsAdaptor(gpumem.PoolResource(cuda, initial_bytes=MiB))
    buf = gpumem.DeviceBuffer(100, resource=gpumem.LimitingAdaptor(stats, MiB))
    del stats
    gc.collect()
    # Only the buffer holds the stack now: the limit, the statistics, the pool.
    limit = buf.resource
    assert limit.upstream.upstream.statistics()["allocations"] == 1
    assert limit.upstream.statistics()["current_bytes"] == 100
    del buf, limit
    gc.collect()
    assert cuda.allocated_bytes == 0  # the pool went, and gave its chunk back


def test_every_adaptor_stacked():
    pool = gpumem.PoolResource(gpumem.CudaResource(0))
    top = gpumem.ThreadSafeAdaptor(
        gpumem.OomRetryAdaptor(
            gpumem.DeferredFreeAdaptor(
                gpumem.LimitingAdaptor(
                    gpumem.TrackingAdaptor(gpumem.StatisticsAdaptor(pool), report_at_exit=False), 8 * MiB),
                max_pending_count=1)))
    assert top.layers() == ["thread_safe", "oom_retry", "defer", "limit", "track", "stats", "pool", "cuda"]
    bufs = [gpumem.DeviceBuffer(n, resource=top) for n in (1, 1000, MiB)]
    assert top.find_layer("track").live_count == 3
    assert top.find_layer("stats").statistics()["current_count"] == 3
    del bufs
    top.find_layer("defer").flush()
    assert top.find_layer("track").live_count == 0


# ---- statistics ----------------------------------------------------------------


def test_statistics_count_current_peak_and_total(pool):
    stats = gpumem.StatisticsAdaptor(pool)
    a = gpumem.DeviceBuffer(1000, resource=stats)
    b = gpumem.DeviceBuffer(3000, resource=stats)
    del a
    assert stats.statistics() == {
        "current_bytes": 3000, "peak_bytes": 4000, "total_bytes": 4000,
        "current_count": 1, "peak_count": 2, "total_count": 2,
    }
    del b
    assert stats.statistics()["current_bytes"] == 0


def test_statistics_scopes_nest_and_give_their_counters(pool):
    stats = gpumem.StatisticsAdaptor(pool)
    outside = gpumem.DeviceBuffer(500, resource=stats)
    with stats.scope() as outer:
        assert stats.scope_depth == 1 and outer.counters is None
        x = gpumem.DeviceBuffer(1000, resource=stats)
        with stats.scope() as inner:
            y = gpumem.DeviceBuffer(2000, resource=stats)
            del y
        del x
    assert stats.scope_depth == 0
    assert inner.counters["total_bytes"] == 2000 and inner.counters["peak_bytes"] == 3500
    assert outer.counters["total_bytes"] == 3000 and outer.counters["total_count"] == 2
    assert outer.counters["peak_bytes"] == 3500 and outer.counters["current_bytes"] == 500
    # push/pop as rmm.statistics has them.
    stats.push_scope()
    gpumem.DeviceBuffer(64, resource=stats).close()
    assert stats.pop_scope()["total_bytes"] == 64
    with pytest.raises(gpumem.LogicError, match="no scope"):
        stats.pop_scope()
    scope = stats.scope()
    with scope:
        pass
    with pytest.raises(gpumem.LogicError, match="entered once"):
        with scope:
            pass
    del outside


def test_profile_decorator_and_block(pool):
    stats = gpumem.StatisticsAdaptor(pool)
    records = gpumem.ProfileRecords()

    @gpumem.profile(statistics=stats, records=records)
    def step(n):
        return gpumem.DeviceBuffer(n, resource=stats).size

    assert step(1000) == 1000 and step(3000) == 3000
    assert step.__name__ == "step"
    with gpumem.profile(name="block", statistics=stats, records=records):
        gpumem.DeviceBuffer(10, resource=stats).close()
    r = records.records
    name = __name__ + ".test_profile_decorator_and_block.<locals>.step"
    assert r[name] == {"calls": 2, "total_bytes": 4000, "total_count": 2, "peak_bytes": 3000, "peak_count": 1}
    assert r["block"]["calls"] == 1 and r["block"]["total_bytes"] == 10
    assert "block" in records.report() and name in records.report()
    records.clear()
    assert records.records == {}


def test_profile_uses_the_current_stacks_statistics():
    @gpumem.profile
    def work():
        gpumem.DeviceBuffer(12345).close()

    previous = gpumem.set_current_resource(gpumem.make_resource("pool,stats"), 0)
    try:
        gpumem.profile_records.clear()
        work()
        ((name, rec),) = gpumem.profile_records.records.items()
        assert name.endswith(".work") and rec["total_bytes"] == 12345 and rec["calls"] == 1
        gpumem.set_current_resource(gpumem.PoolResource(device=0), 0)
        with pytest.raises(gpumem.LogicError, match="no statistics layer"):
            work()
    finally:
        gpumem.set_current_resource(previous, 0)
        gpumem.profile_records.clear()


# ---- limit ---------------------------------------------------------------------


def test_limit_refuses_with_an_error_naming_it(pool):
    limit = gpumem.LimitingAdaptor(pool, MiB)
    assert (limit.limit_bytes, limit.used_bytes) == (MiB, 0)
    a = gpumem.DeviceBuffer(MiB // 2, resource=limit)
    assert limit.used_bytes == MiB // 2
    with pytest.raises(gpumem.OutOfMemoryError, match="limit of 1048576 bytes") as e:
        gpumem.DeviceBuffer(MiB // 2 + 1, resource=limit)
    assert e.value.requested_bytes == MiB // 2 + 1
    assert pool.statistics()["allocations"] == 1  # the upstream was not asked
    del a
    gpumem.DeviceBuffer(MiB, resource=limit).close()
    with pytest.raises(gpumem.LogicError, match="above 0"):
        gpumem.LimitingAdaptor(pool, 0)
    with pytest.raises(gpumem.LogicError, match=">= 0"):
        gpumem.LimitingAdaptor(pool, -1)


# ---- OOM retry -----------------------------------------------------------------


def test_oom_callback_frees_and_the_retry_succeeds(pool):
    retry = gpumem.OomRetryAdaptor(gpumem.LimitingAdaptor(pool, MiB))
    cache = [gpumem.DeviceBuffer(768 << 10, resource=retry)]
    events = []

    def drop_cache(event):
        events.append((event.bytes, event.attempt, event.error))
        if not cache:
            return False
        cache.pop().close()
        return True

    cid = retry.add_callback(drop_cache)
    b = gpumem.DeviceBuffer(512 << 10, resource=retry)  # does not fit until the cache goes
    assert b.size == 512 << 10 and not cache
    ((nbytes, attempt, error),) = events
    assert nbytes == 512 << 10 and attempt == 1
    assert isinstance(error, gpumem.OutOfMemoryError) and error.requested_bytes == 512 << 10
    # Nothing left to drop: the callback says no, the caller gets the error.
    with pytest.raises(gpumem.OutOfMemoryError):
        gpumem.DeviceBuffer(768 << 10, resource=retry)
    assert retry.remove_callback(cid) and not retry.remove_callback(cid)
    assert retry.max_retries == 16


def test_oom_callbacks_run_with_the_gil_from_other_threads_and_give_up_after_max_retries(pool):
    retry = gpumem.OomRetryAdaptor(gpumem.LimitingAdaptor(pool, MiB), max_retries=3)
    calls = []

    def always_retry(event):
        calls.append((event.attempt, threading.get_ident()))
        return True

    retry.add_callback(always_retry)
    failures = []

    def worker():
        try:
            gpumem.DeviceBuffer(2 * MiB, resource=retry)  # the GIL is released around allocate
        except gpumem.OutOfMemoryError as e:
            failures.append(e)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert len(failures) == 1
    assert [a for a, _ in calls] == [1, 2, 3]
    assert {tid for _, tid in calls} == {t.ident}


def test_an_exception_in_the_callback_reaches_the_caller(pool):
    retry = gpumem.OomRetryAdaptor(gpumem.LimitingAdaptor(pool, MiB))

    def broken(event):
        raise KeyError("no cache here")

    retry.add_callback(broken)
    with pytest.raises(KeyError, match="no cache here") as e:
        gpumem.DeviceBuffer(2 * MiB, resource=retry)
    assert isinstance(e.value.__context__, gpumem.OutOfMemoryError)
    with pytest.raises(gpumem.LogicError, match="expected a callable"):
        retry.add_callback(42)
    with pytest.raises(gpumem.LogicError, match="negative"):
        gpumem.OomRetryAdaptor(pool, max_retries=-1)


@pytest.mark.sim_only
def test_oom_retry_of_a_real_out_of_memory(pool):
    retry = gpumem.OomRetryAdaptor(gpumem.CudaResource(0))
    seen = []
    retry.add_callback(lambda e: seen.append(e.attempt) or True)
    gpumem.sim.fail_nth_allocation(1)  # the next driver allocation fails
    buf = gpumem.DeviceBuffer(4096, resource=retry)
    assert seen == [1] and buf.size == 4096


# ---- tracking ------------------------------------------------------------------


def test_tracking_lists_live_allocations_and_reports_leaks(pool, tmp_path):
    track = gpumem.TrackingAdaptor(pool, report_at_exit=False)
    assert track.leak_report() == ""
    s = gpumem.Stream()
    a = gpumem.DeviceBuffer(123, s, resource=track)
    b = gpumem.DeviceBuffer(4567, resource=track)
    live = track.live()
    assert [x["ptr"] for x in live] == [a.ptr, b.ptr]  # oldest first
    assert live[0]["bytes"] == 123 and live[0]["stream"] == s.handle and live[0]["seq"] == 1
    assert live[0]["stack"] == [] and live[1]["alignment"] == 256
    assert (track.live_count, track.live_bytes) == (2, 123 + 4567)
    assert "2 allocation(s)" in track.leak_report()
    snapshot = tmp_path / "live.csv"
    track.write_snapshot(snapshot)
    rows = list(csv.DictReader(snapshot.open()))
    assert sorted(int(r["bytes"]) for r in rows) == [123, 4567] and {r["source"] for r in rows} == {"snapshot"}
    with pytest.raises(gpumem.LogicError):
        track.deallocate(a.ptr, 999)  # the wrong size, caught before the upstream sees it
    del a, b
    assert track.live_count == 0


def test_tracking_captures_native_stacks_and_checks_its_options(pool):
    track = gpumem.TrackingAdaptor(pool, capture_stacks=True, stack_depth=8, report_at_exit=False)
    buf = gpumem.DeviceBuffer(64, resource=track)
    (entry,) = track.live()
    assert 0 < len(entry["stack"]) <= 8 and all(isinstance(f, str) for f in entry["stack"])
    del buf
    for depth in (0, 257):
        with pytest.raises(gpumem.LogicError, match="stack_depth"):
            gpumem.TrackingAdaptor(pool, stack_depth=depth)
    with pytest.raises(gpumem.LogicError):
        gpumem.TrackingAdaptor(pool, report_limit=-1)


# ---- logging -------------------------------------------------------------------


def test_logging_writes_rows_to_a_csv_file(pool, tmp_path):
    path = tmp_path / "run.csv"
    log = gpumem.LoggingAdaptor(pool, path)
    assert log.path == str(path)
    a = gpumem.DeviceBuffer(1000, resource=log)
    b = gpumem.DeviceBuffer(2000, resource=log)
    a_ptr = a.ptr
    del a
    with pytest.raises(gpumem.LogicError):
        log.deallocate(b.ptr + 1, 10)
    log.flush()
    rows = sorted(csv.DictReader(path.open()), key=lambda r: int(r["seq"]))
    assert [(r["op"], r["bytes"], r["outcome"]) for r in rows] == [
        ("allocate", "1000", "ok"), ("allocate", "2000", "ok"), ("deallocate", "1000", "ok"),
        ("deallocate", "10", "logic_error")]
    assert int(rows[0]["ptr"], 16) == a_ptr and {r["source"] for r in rows} == {"app"}
    assert log.events == 4
    del b


def test_logging_shares_a_log_above_and_below_a_pool(tmp_path):
    path = tmp_path / "both.csv"
    below = gpumem.LoggingAdaptor(gpumem.CudaResource(0), path, source="upstream")
    above = gpumem.LoggingAdaptor(gpumem.PoolResource(below), log=below)
    assert above.path == below.path
    gpumem.DeviceBuffer(1000, resource=above).close()
    above.flush()
    sources = {r["source"] for r in csv.DictReader(path.open())}
    assert sources == {"app", "upstream"}
    with pytest.raises(gpumem.LogicError, match="either a path or log="):
        gpumem.LoggingAdaptor(gpumem.CudaResource(0))
    with pytest.raises(gpumem.LogicError, match="1 to 64 characters"):
        gpumem.LoggingAdaptor(gpumem.CudaResource(0), tmp_path / "x.csv", source="")
    with pytest.raises(gpumem.LogicError, match="cannot create"):
        gpumem.LoggingAdaptor(gpumem.CudaResource(0), tmp_path / "no" / "such" / "dir.csv")


# ---- deferred frees ------------------------------------------------------------


def test_deferred_frees_are_queued_then_flushed(pool):
    d = gpumem.DeferredFreeAdaptor(pool, max_pending_count=2, max_pending_ratio=0.5)
    assert d.max_pending_count == 2 and d.max_pending_bytes > 0
    bufs = [gpumem.DeviceBuffer(1000, resource=d) for _ in range(3)]
    bufs.pop()
    bufs.pop()
    s = d.statistics()
    assert (s["pending_count"], s["pending_bytes"], s["frees"]) == (2, 2000, 0)
    assert pool.statistics()["allocations"] == 3  # the pool still holds them
    bufs.pop()  # the third free passes max_pending_count: the queue is flushed
    s = d.statistics()
    assert (s["pending_count"], s["flushes_by_count"], s["frees"]) == (0, 1, 3)
    assert pool.statistics()["allocations"] == 0


def test_defer_cleanup_holds_every_free(pool):
    d = gpumem.DeferredFreeAdaptor(pool, max_pending_count=1)
    bufs = [gpumem.DeviceBuffer(100, resource=d) for _ in range(4)]
    with d.defer_cleanup():
        assert d.cleanup_deferrals == 1
        with d.defer_cleanup():
            assert d.cleanup_deferrals == 2
            bufs.clear()
        assert d.statistics()["pending_count"] == 4
    assert d.cleanup_deferrals == 0
    assert d.statistics()["pending_count"] == 0  # past the limit: flushed at the end
    gpumem.DeviceBuffer(100, resource=d).close()
    d.flush()
    assert d.statistics()["flushes_requested"] == 1 and pool.statistics()["allocations"] == 0
    with pytest.raises(gpumem.LogicError, match=r"\(0, 1\]"):
        gpumem.DeferredFreeAdaptor(pool, max_pending_ratio=1.5)


def test_deferred_free_defaults_come_from_the_environment():
    done = run_python(
        "import gpumem\n"
        "d = gpumem.DeferredFreeAdaptor(gpumem.CudaResource(0))\n"
        "print(d.max_pending_count)\n",
        env={"GPUMEM_MAX_PENDING_DEALLOCS_COUNT": "7"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "7"


# ---- thread safety -------------------------------------------------------------


def test_thread_safe_adaptor_serves_many_threads(pool):
    ts = gpumem.ThreadSafeAdaptor(gpumem.StatisticsAdaptor(pool))
    assert ts.properties.thread_safe
    errors = []

    def churn():
        try:
            for i in range(200):
                gpumem.DeviceBuffer(256 + i, resource=ts).close()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert ts.upstream.statistics()["total_count"] == 800
    assert ts.upstream.statistics()["current_count"] == 0
