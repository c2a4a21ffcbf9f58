"""gpumem.ipc across processes (multiprocessing, spawn): for each kind of memory the child
opens the parent's handle, checks the parent's bytes, writes its own, and the parent sees
them; bad bytes raise typed errors."""

import multiprocessing as mp
import pickle

import pytest

import gpumem
import gpumem.ipc


def _parent_bytes(n):
    return bytes((i * 7 + 1) & 0xFF for i in range(n))


def _child_bytes(n):
    return bytes((i * 13 + 5) & 0xFF for i in range(n))


def _child(handle, result, device=None):
    try:
        with handle.open(device) as mem:
            assert mem.size == handle.size
            assert mem.user_device == (mem.device if device is None else device)
            cai = mem.__cuda_array_interface__
            assert cai["shape"] == (handle.size,) and cai["data"][0] == mem.ptr
            if mem.copy_to_host() != _parent_bytes(mem.size):
                result.put("the parent's bytes are not there")
                return
            mem.copy_from_host(_child_bytes(mem.size))
        result.put("ok")
    except gpumem.UnsupportedError as e:
        result.put("skip: %s" % e)
    except Exception as e:  # reported to the parent's assertion
        result.put("child failed: %r" % (e,))


def _round_trip(buf, kind, device=None):
    buf.copy_from_host(_parent_bytes(buf.size))
    handle = gpumem.ipc.export(buf)
    assert handle.kind == kind
    assert handle.size == buf.size
    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    child = ctx.Process(target=_child, args=(handle, result, device))
    child.start()
    outcome = result.get(timeout=120)
    child.join(timeout=120)
    if outcome.startswith("skip: "):
        pytest.skip(outcome)
    assert outcome == "ok"
    assert child.exitcode == 0
    assert buf.copy_to_host() == _child_bytes(buf.size)


def _default_kind():
    """The IPC kind of the default resource's memory: pages (vmm) where the device has
    virtual memory management, else a pool over cuMemAlloc (legacy)."""
    return "vmm" if isinstance(gpumem.get_current_resource(0), gpumem.VmmPoolResource) else "legacy"


def test_pool_sub_allocation_is_shared_with_its_offset():
    first = gpumem.DeviceBuffer(1 << 20)  # the default resource
    second = gpumem.DeviceBuffer(70001)
    handle = gpumem.ipc.export(second)
    assert handle.kind == _default_kind()
    assert handle.offset > 0  # inside the pool's chunk or page, not at its start
    _round_trip(second, _default_kind())
    first.close()


def test_opened_for_another_device_through_peer_access():
    if gpumem.device_count() < 2:
        pytest.skip("needs two devices")
    buf = gpumem.DeviceBuffer(70001, device=0)
    _round_trip(buf, _default_kind(), device=1)


def test_cuda_resource_buffer():
    previous = gpumem.set_current_resource(gpumem.CudaResource(0), device=0)
    try:
        buf = gpumem.DeviceBuffer(300000)
    finally:
        gpumem.set_current_resource(previous, device=0)
    _round_trip(buf, "legacy")


def test_raw_pointer_export():
    buf = gpumem.DeviceBuffer(4096)
    handle = gpumem.ipc.export(buf.ptr, buf.size)
    assert handle.size == 4096 and handle.kind == _default_kind()


def test_pickled_handle_is_bytes_and_bad_bytes_are_refused():
    buf = gpumem.DeviceBuffer(4096)
    handle = gpumem.ipc.export(buf)
    again = pickle.loads(pickle.dumps(handle))
    assert again.to_bytes() == handle.to_bytes()
    assert (again.kind, again.size, again.offset) == (handle.kind, handle.size, handle.offset)
    data = handle.to_bytes()
    for bad in (data[:-1], data[:10], b"", data[:20] + bytes([data[20] ^ 0x40]) + data[21:], b"x" * 200):
        with pytest.raises(gpumem.LogicError):
            gpumem.ipc.IpcHandle.from_bytes(bad)
    with pytest.raises(gpumem.LogicError, match="exported by this process"):
        handle.open()
