"""Resources from Python: the contract calls, the pool, the current resource, memory_info."""

import logging
import threading

import pytest

import gpumem


def test_default_current_resource_is_the_paged_pool():
    r = gpumem.get_current_resource(0)
    assert isinstance(r, gpumem.VmmPoolResource)
    assert r is gpumem.get_current_resource()  # None: the current device, 0 here
    p = r.properties
    assert (p.device, p.device_accessible, p.host_accessible, p.thread_safe) == (0, True, False, True)


def test_set_current_resource_returns_the_previous_and_none_restores_a_default():
    mine = gpumem.PoolResource(gpumem.CudaResource(0))
    previous = gpumem.set_current_resource(mine, 0)
    try:
        assert gpumem.get_current_resource(0) is mine
        assert gpumem.DeviceBuffer(100).resource is mine
        assert gpumem.set_current_resource(None, 0) is mine
        fresh = gpumem.get_current_resource(0)
        assert isinstance(fresh, gpumem.VmmPoolResource) and fresh is not mine
    finally:
        gpumem.set_current_resource(previous, 0)
    assert gpumem.get_current_resource(0) is previous


def test_resource_of_another_device_is_refused():
    if gpumem.device_count() < 2:
        pytest.skip("needs two devices")
    with pytest.raises(gpumem.LogicError, match="memory of device 1, not of device 0"):
        gpumem.set_current_resource(gpumem.CudaResource(1), 0)


def test_allocate_and_deallocate(fresh_pool):
    p = fresh_pool.allocate(5000, None, 4096)
    assert p % 4096 == 0
    assert fresh_pool.statistics()["allocations"] == 1
    fresh_pool.deallocate(p, 5000, None, 4096)
    assert fresh_pool.statistics()["allocations"] == 0


def test_equality():
    a = gpumem.CudaResource(0)
    b = gpumem.CudaResource(0)
    assert a == a and a.is_equal(a)
    assert a != b
    assert len({a, a, b}) == 2


def test_pool_options_statistics_trim_and_release():
    up = gpumem.CudaResource(0)
    pool = gpumem.PoolResource(up, initial_bytes=4 << 20, min_chunk_bytes=2 << 20)
    assert up.allocated_bytes == 4 << 20
    s = pool.statistics()
    assert s["reserved_bytes"] == 4 << 20 and s["free_bytes"] == 4 << 20 and s["chunks"] == 1
    big = gpumem.DeviceBuffer(8 << 20, resource=pool)
    assert pool.statistics()["chunks"] == 2
    del big
    released = pool.release()
    assert released > 0
    assert up.allocated_bytes == (4 << 20) + (8 << 20) - released
    assert pool.trim() == 0  # nothing fully free is left unreleased
    assert pool.trim(gpumem.Stream()) == 0


def test_pools_that_watch_captures_serve_as_usual():
    # The capture watch (docs/pool.md, "CUDA graphs") changes how a pool learns of
    # captures, not what it hands out.
    for pool in (gpumem.PoolResource(device=0, watch_captures=True),
                 gpumem.VmmPoolResource(0, watch_captures=True)):
        s = gpumem.Stream()
        bufs = [gpumem.DeviceBuffer(n, resource=pool, stream=s) for n in (1, 4096, 3 << 20)]
        assert len({b.ptr for b in bufs}) == 3
        assert pool.statistics()["allocations"] == 3
        del bufs
        s.synchronize()
        assert pool.statistics()["allocations"] == 0


def test_pool_maximum_is_out_of_memory():
    pool = gpumem.PoolResource(device=0, maximum_bytes=4 << 20)
    keep = gpumem.DeviceBuffer(3 << 20, resource=pool)
    with pytest.raises(gpumem.OutOfMemoryError):
        gpumem.DeviceBuffer(3 << 20, resource=pool)
    assert keep.ptr != 0


def test_bad_pool_options_are_logic_errors():
    with pytest.raises(gpumem.LogicError, match="fence_interval"):
        gpumem.PoolResource(device=0, fence_interval=0)
    with pytest.raises(gpumem.LogicError, match="initial_bytes 8388608 exceeds maximum_bytes 4194304"):
        gpumem.PoolResource(device=0, initial_bytes=8 << 20, maximum_bytes=4 << 20)


def test_pool_keeps_a_python_upstream_alive():
    pool = gpumem.PoolResource(gpumem.CudaResource(0))
    b = gpumem.DeviceBuffer(1 << 20, resource=pool)
    assert isinstance(pool.upstream, gpumem.CudaResource)
    assert pool.upstream.allocated_bytes >= 1 << 20
    del b


def test_memory_info_counts_what_the_pool_holds_free(fresh_pool):
    held = gpumem.DeviceBuffer(1 << 20)
    free, total = gpumem.memory_info(0)
    dev_free, dev_total = gpumem.device_memory_info(0)
    assert total == dev_total
    pool_free = fresh_pool.statistics()["free_bytes"]
    assert pool_free > 0
    assert free == dev_free + pool_free
    del held


def test_memory_info_of_a_cuda_resource_is_the_device_s():
    previous = gpumem.set_current_resource(gpumem.CudaResource(0), 0)
    try:
        assert gpumem.memory_info(0) == gpumem.device_memory_info(0)
    finally:
        gpumem.set_current_resource(previous, 0)


def test_threads_share_the_pool(fresh_pool):
    errors = []

    def work(seed):
        try:
            s = gpumem.Stream()
            for i in range(300):
                b = gpumem.DeviceBuffer(1 + (seed * 7919 + i * 104729) % (1 << 20), s)
                del b
            s.synchronize()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert fresh_pool.statistics()["allocations"] == 0


@pytest.mark.sim_only
def test_upstream_failure_surfaces_as_out_of_memory():
    r = gpumem.CudaResource(0)
    before = gpumem.sim.injected_failures()
    gpumem.sim.fail_nth_allocation(1)
    try:
        with pytest.raises(gpumem.OutOfMemoryError) as info:
            r.allocate(4096)
    finally:
        gpumem.sim.fail_nth_allocation(0)
    assert gpumem.sim.injected_failures() == before + 1
    assert info.value.resource == "cuda_resource"
    p = r.allocate(4096)  # still usable
    r.deallocate(p, 4096)


@pytest.mark.sim_only
def test_sim_counts_device_memory():
    used = gpumem.sim.used_bytes(0)
    live = gpumem.sim.live_allocations(0)
    r = gpumem.CudaResource(0)
    p = r.allocate(1 << 20)
    assert gpumem.sim.used_bytes(0) >= used + (1 << 20)
    assert gpumem.sim.live_allocations(0) == live + 1
    r.deallocate(p, 1 << 20)
    assert gpumem.sim.live_allocations(0) == live


@pytest.mark.sim_only
def test_sim_counts_driver_calls():
    r = gpumem.CudaResource(0)
    allocs, frees = gpumem.sim.driver_calls("cuMemAlloc"), gpumem.sim.driver_calls("cuMemFree")
    p = r.allocate(4096)
    r.deallocate(p, 4096)
    assert gpumem.sim.driver_calls("cuMemAlloc") == allocs + 1
    assert gpumem.sim.driver_calls("cuMemFree") == frees + 1
    with pytest.raises(gpumem.LogicError, match="not a driver entry point"):
        gpumem.sim.driver_calls("cuNoSuchCall")


@pytest.mark.sim_only
def test_a_pool_whose_capture_watch_cannot_start_warns_and_works(caplog):
    gpumem.sim.set_capture_watch_available(False)
    try:
        with caplog.at_level(logging.WARNING, logger="gpumem"):
            pool = gpumem.VmmPoolResource(0, watch_captures=True)
    finally:
        gpumem.sim.set_capture_watch_available(True)
    said = [r.getMessage() for r in caplog.records if r.name == "gpumem" and r.levelno == logging.WARNING]
    assert any("the capture watch did not start" in m and "another subscriber" in m for m in said), said
    p = pool.allocate(1 << 20)
    pool.deallocate(p, 1 << 20)


def test_vmm_pool_small_and_large_allocations_statistics_and_release():
    pool = gpumem.VmmPoolResource(0)
    small = gpumem.DeviceBuffer(1000, resource=pool)  # shares a page with the next block
    large = gpumem.DeviceBuffer(8 << 20, resource=pool)
    s = pool.statistics()
    assert s["allocations"] == 2 and s["used_bytes"] == 1024 + (8 << 20)
    assert s["mapped_bytes"] >= s["used_bytes"] and s["pages"] >= 4 and s["pages_created"] == s["pages"]
    with pytest.raises(gpumem.LogicError):
        pool.deallocate(small.ptr, 999)
    with pytest.raises(gpumem.LogicError):
        pool.deallocate(large.ptr, 1000)
    assert pool.statistics()["allocations"] == 2
    del small, large
    assert pool.statistics()["allocations"] == 0
    assert pool.release() > 0
    assert pool.statistics()["mapped_bytes"] == 0
    assert pool.trim() == 0 and pool.trim(gpumem.Stream()) == 0
    assert "VmmPoolResource device=0" in repr(pool)


def test_vmm_pool_as_the_current_resource_and_memory_info():
    pool = gpumem.VmmPoolResource(0, maximum_bytes=1 << 30, release_threshold_bytes=64 << 20)
    previous = gpumem.set_current_resource(pool, 0)
    try:
        b = gpumem.DeviceBuffer(3 << 20)
        assert b.resource is pool
        free, total = gpumem.memory_info(0)
        assert 0 < free <= total
        assert free >= gpumem.device_memory_info(0)[0]
    finally:
        gpumem.set_current_resource(previous, 0)


def test_bad_vmm_pool_options_are_logic_errors():
    with pytest.raises(gpumem.LogicError, match="fence_interval"):
        gpumem.VmmPoolResource(0, fence_interval=0)
    with pytest.raises(gpumem.LogicError, match="page_bytes"):
        gpumem.VmmPoolResource(0, page_bytes=3 << 20)
    with pytest.raises(gpumem.LogicError, match="maximum_bytes"):
        gpumem.VmmPoolResource(0, maximum_bytes=1 << 20)
    with pytest.raises(gpumem.LogicError, match="idle_stream_ms"):
        gpumem.VmmPoolResource(0, idle_stream_ms=0)
    quick_to_idle = gpumem.VmmPoolResource(0, idle_stream_ms=5)
    p = quick_to_idle.allocate(256, None, 256)
    assert p != 0
    quick_to_idle.deallocate(p, 256, None, 256)


def test_the_simulator_controls_import_as_a_module():
    import importlib

    import gpumem.sim
    from gpumem.sim import injected_failures

    assert importlib.import_module("gpumem.sim") is gpumem.sim
    assert callable(injected_failures)


def test_peers_of_names_the_other_devices():
    if gpumem.device_count() < 2:
        pytest.skip("needs two devices")
    assert gpumem.peers_of(0) == [1] or gpumem.peers_of(0) == []  # [] where the devices have no peer access
    with pytest.raises(gpumem.LogicError):
        gpumem.peers_of(gpumem.device_count())


def test_vmm_pool_takes_access_for_every_peer():
    pool = gpumem.VmmPoolResource(0, access_for_every_peer=False)
    p = pool.allocate(4096, None)
    pool.deallocate(p, 4096, None)
