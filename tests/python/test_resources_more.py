"""The driver's other resources from Python (AsyncResource, ManagedResource,
PinnedHostResource), host registration as a context manager, and the capabilities every
stack answers (available_bytes, release_free_memory, layer_name, layers, find_layer)."""

import pytest

import gpumem

MiB = 1 << 20


def make_each_resource():
    return [
        gpumem.AsyncResource(0),
        gpumem.ManagedResource(0),
        gpumem.PinnedHostResource(),
    ]


@pytest.mark.parametrize("index", range(3), ids=["async", "managed", "pinned_host"])
def test_each_resource_allocates_frees_and_serves_buffers(index):
    r = make_each_resource()[index]
    p = r.allocate(5000, None, 4096)
    assert p != 0 and p % 4096 == 0
    assert r.allocated_bytes == 5000 and r.allocation_count == 1
    r.deallocate(p, 5000, None, 4096)
    assert r.allocated_bytes == 0 and r.allocation_count == 0

    data = bytes(range(256)) * 16
    buf = gpumem.DeviceBuffer.from_host(data, resource=r)
    assert buf.resource is r and buf.copy_to_host() == data
    s = gpumem.Stream()
    other = gpumem.DeviceBuffer(3 * MiB, s, resource=r)
    assert r.allocation_count == 2
    del buf, other
    s.synchronize()
    assert r.allocation_count == 0


def test_async_resource_options_statistics_and_trim():
    a = gpumem.AsyncResource(0, initial_bytes=MiB, maximum_bytes=256 * MiB)
    assert a.owns_pool and a.ipc == "none" and a.release_threshold is None
    assert a.layer_name == "async" and a.layers() == ["async"]
    # The primed memory is reserved (the driver, and the simulator, reserve 32 MiB at least).
    s = a.statistics()
    assert s["reserved_bytes"] >= MiB and s["used_bytes"] == 0 and s["used_high_bytes"] >= MiB
    s = gpumem.Stream()
    bufs = [gpumem.DeviceBuffer(n, s, resource=a) for n in (100, 4096, 2 * MiB)]
    assert a.statistics()["used_bytes"] >= 100 + 4096 + 2 * MiB
    del bufs
    s.synchronize()  # frees count as in use until the host has seen them complete
    a.trim_to(0)
    assert a.statistics()["reserved_bytes"] == 0
    a.reset_high_watermarks()
    assert a.statistics()["used_high_bytes"] == 0
    a.release_threshold = 4 * MiB
    assert a.release_threshold == 4 * MiB
    a.release_threshold = None
    assert a.release_threshold is None


def test_async_resource_reuse_policy_ipc_and_wrapped_pools():
    policy = gpumem.AsyncReusePolicy(allow_opportunistic=False)
    assert (policy.follow_event_dependencies, policy.allow_opportunistic, policy.allow_internal_dependencies) == (
        True, False, True)
    a = gpumem.AsyncResource(0, reuse=policy, ipc="posix_file_descriptor", access_for_every_peer=False)
    assert a.reuse_policy == policy and a.ipc == "posix_file_descriptor"
    a.reuse_policy = gpumem.AsyncReusePolicy()
    assert a.reuse_policy == gpumem.AsyncReusePolicy()
    w = gpumem.AsyncResource.wrap_existing_pool("device_default", 0)
    assert not w.owns_pool and w.pool_handle != 0
    gpumem.DeviceBuffer(1000, resource=w).close()


def test_async_resource_peer_access():
    if 1 not in gpumem.peers_of(0):
        pytest.skip("needs a device that can reach device 0's memory")
    a = gpumem.AsyncResource(0, access_for_every_peer=False)
    assert a.access_from(0) == "read_write" and a.access_from(1) == "none"
    a.set_access(1, "read_write")
    assert a.access_from(1) == "read_write"
    a.set_access(1, "none")
    assert a.access_from(1) == "none"
    with pytest.raises(gpumem.LogicError, match="owns the pool"):
        a.set_access(0, "read")


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: gpumem.AsyncResource(0, ipc="cuda"), "ipc='cuda' is not one of 'none', 'posix_file_descriptor'"),
        (lambda: gpumem.AsyncResource(0, initial_bytes=64 * MiB, maximum_bytes=32 * MiB), "above maximum_bytes"),
        (lambda: gpumem.AsyncResource(0, initial_bytes=2 * MiB, release_threshold_bytes=MiB), "release_threshold"),
        (lambda: gpumem.AsyncResource(0, maximum_bytes=-1), "must be >= 0"),
        (lambda: gpumem.AsyncResource.wrap_existing_pool("mine"), "'device_default', 'device_current'"),
        (lambda: gpumem.AsyncResource(0).set_access(1, "write"), "'none', 'read', 'read_write'"),
        (lambda: gpumem.ManagedResource(0, attach="device"), "attach='device' is not one of 'global', 'host'"),
        (lambda: gpumem.PinnedHostResource().device_pointer(4096), "pinned_host_resource::device_pointer"),
    ],
)
def test_bad_options_are_logic_errors(make, match):
    with pytest.raises(gpumem.LogicError, match=match):
        make()


def test_unknown_keywords_are_type_errors():
    with pytest.raises(TypeError):
        gpumem.AsyncResource(0, release_threshold=5)


def test_managed_resource_attach_and_host_access():
    m = gpumem.ManagedResource(0, attach="host")
    assert m.attach == "host" and m.layer_name == "managed"
    assert m.properties.host_accessible and m.properties.device == 0
    assert gpumem.ManagedResource().attach == "global"


def test_pinned_host_resource_options_and_device_pointers():
    p = gpumem.PinnedHostResource()
    assert (p.portable, p.device_mapped, p.write_combined) == (False, True, False)
    assert p.properties.device == -1 and p.properties.host_accessible
    buf = gpumem.DeviceBuffer(4096, resource=p)
    assert p.device_pointer(buf.ptr) == buf.ptr  # unified addressing
    assert buf.__dlpack_device__() == (3, 0)  # kDLCUDAHost
    assert buf.device == gpumem.current_device()
    wc = gpumem.PinnedHostResource(portable=True, write_combined=True)
    assert wc.portable and wc.write_combined and wc.driver_flags != p.driver_flags
    x = wc.allocate(1000)
    try:
        assert wc.device_pointer(x) not in (0,)
    finally:
        wc.deallocate(x, 1000)


def test_host_registration_is_a_context_manager():
    data = bytearray(range(256)) * 64
    with gpumem.HostRegistration(data, mapped=True) as reg:
        assert reg.registered and reg.size == len(data) and reg.obj is data and reg.mapped
        assert reg.device_pointer != 0
        with pytest.raises(BufferError):
            data.extend(b"x")  # the registration holds the buffer: it cannot move
        # Copies to and from registered memory work as for any host memory.
        buf = gpumem.DeviceBuffer.from_host(data)
        assert buf.copy_to_host() == bytes(data)
    assert not reg.registered and reg.obj is None and reg.ptr == 0
    data.extend(b"x")  # released
    reg.close()  # idempotent


def test_host_registration_options_and_errors():
    with gpumem.HostRegistration(b"read only bytes", read_only=True, portable=True) as reg:
        assert reg.read_only and reg.portable and not reg.mapped
        with pytest.raises(gpumem.LogicError, match="without `mapped`"):
            reg.device_pointer
    with pytest.raises(BufferError):
        gpumem.HostRegistration(b"immutable")  # the device could write it: needs a writable buffer
    with pytest.raises(gpumem.LogicError, match="0 bytes"):
        gpumem.HostRegistration(bytearray())
    data = bytearray(8192)
    with gpumem.HostRegistration(data):
        with pytest.raises(gpumem.LogicError, match="ALREADY_REGISTERED"):
            gpumem.HostRegistration(memoryview(data)[4096:])
    with gpumem.HostRegistration(data):  # registrable again once released
        pass


def test_host_registration_of_a_numpy_array():
    np = pytest.importorskip("numpy")
    a = np.arange(1000, dtype=np.float64)
    with gpumem.HostRegistration(a, mapped=True) as reg:
        assert reg.ptr == a.ctypes.data and reg.size == a.nbytes
    with pytest.raises(ValueError):
        gpumem.HostRegistration(np.ones((10, 10))[:, 1])  # not contiguous


# ---- Capabilities through a stack --------------------------------------------------


def test_capabilities_answer_through_any_stack():
    cuda = gpumem.CudaResource(0)
    pool = gpumem.PoolResource(cuda)
    stats = gpumem.StatisticsAdaptor(pool)
    limit = gpumem.LimitingAdaptor(stats, 4 * MiB)
    top = gpumem.TrackingAdaptor(limit, report_at_exit=False)
    assert top.layers() == ["track", "limit", "stats", "pool", "cuda"]
    assert [r.layer_name for r in (top, limit, stats, pool, cuda)] == top.layers()
    assert top.find_layer("stats") is stats and top.find_layer("pool") is pool
    assert top.find_layer("cuda") is cuda and top.find_layer("track") is top
    assert top.find_layer("async") is None

    # available_bytes: the pool's answer, capped by what the limit has left.
    assert top.available_bytes() == 4 * MiB
    b = gpumem.DeviceBuffer(MiB, resource=top)
    assert top.available_bytes() == 3 * MiB
    assert pool.available_bytes() > 4 * MiB
    # release_free_memory: the pool gives its free chunks back, asked from the top.
    b.close()
    assert cuda.allocated_bytes > 0
    assert top.release_free_memory() > 0
    assert cuda.allocated_bytes == 0


def test_capabilities_of_the_driver_resources():
    a = gpumem.AsyncResource(0)
    gpumem.DeviceBuffer(MiB, resource=a).close()
    assert isinstance(a.available_bytes(), int)
    assert gpumem.StatisticsAdaptor(a).release_free_memory() >= 0
    assert a.statistics()["reserved_bytes"] == 0
    # Resources that cannot say how much they could hand out answer None.
    assert gpumem.ManagedResource(0).available_bytes() is None
    assert gpumem.LimitingAdaptor(gpumem.PinnedHostResource(), MiB).available_bytes() is None
    assert gpumem.PinnedHostResource().release_free_memory() == 0


def test_capabilities_of_stacks_from_gpumem_conf():
    r = gpumem.make_resource("pool,stats,limit=64MiB")
    assert r.layers() == ["stats", "limit", "pool", "cuda"]
    assert isinstance(r, gpumem.StatisticsAdaptor)
    assert isinstance(r.find_layer("limit"), gpumem.LimitingAdaptor)
    assert r.available_bytes() == 64 * MiB
    assert r.release_free_memory() == 0


def test_driver_resources_can_be_current():
    a = gpumem.AsyncResource(0)
    previous = gpumem.set_current_resource(a, 0)
    try:
        buf = gpumem.DeviceBuffer(4096)
        assert buf.resource is a
        free, total = gpumem.memory_info(0)
        assert 0 < free <= total
    finally:
        gpumem.set_current_resource(previous, 0)
