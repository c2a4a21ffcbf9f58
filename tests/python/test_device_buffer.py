"""gpumem.DeviceBuffer: allocation, copies, lifetime, and the CUDA array interface and DLPack."""

import ctypes
import gc
import sys

import pytest

import gpumem

# ---- DLPack, read back with ctypes as a consumer would -------------------------


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))),
]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


DLManagedTensorVersioned._fields_ = [
    ("version", DLPackVersion),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))),
    ("flags", ctypes.c_uint64),
    ("dl_tensor", DLTensor),
]

_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_set_name = ctypes.pythonapi.PyCapsule_SetName
_set_name.restype = ctypes.c_int
_set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]
_USED = b"used_dltensor"  # a capsule keeps a pointer to its name: keep it alive


def consume(capsule, name, struct):
    """Takes the tensor out of the capsule the way a DLPack consumer does."""
    managed = ctypes.cast(_get_pointer(capsule, name), ctypes.POINTER(struct))
    assert _set_name(capsule, _USED) == 0
    return managed


# ---- allocation and lifetime ------------------------------------------------------


def test_allocates_from_the_current_resource(fresh_pool):
    b = gpumem.DeviceBuffer(1000)
    assert b.ptr != 0 and b.ptr % 256 == 0
    assert b.size == b.nbytes == 1000
    assert b.device == 0
    assert b.stream == 0
    assert b.resource is fresh_pool
    stats = fresh_pool.statistics()
    assert stats["allocations"] == 1 and stats["used_bytes"] == 1024
    del b
    assert fresh_pool.statistics()["allocations"] == 0


def test_copies_round_trip():
    data = bytes(range(256)) * 17
    b = gpumem.DeviceBuffer.from_host(data)
    assert b.size == len(data)
    assert b.copy_to_host() == data
    out = bytearray(len(data))
    assert b.copy_to_host(out) is out
    assert out == data
    b.copy_from_host(bytearray(len(data)))
    assert b.copy_to_host() == bytes(len(data))


def test_copy_size_mismatch_is_logic_error():
    b = gpumem.DeviceBuffer(16)
    with pytest.raises(gpumem.LogicError, match="source has 15 bytes"):
        b.copy_from_host(bytes(15))
    with pytest.raises(gpumem.LogicError, match="destination has 17 bytes"):
        b.copy_to_host(bytearray(17))
    with pytest.raises(BufferError):
        b.copy_to_host(bytes(16))  # not writable


def test_close_frees_at_once_and_is_idempotent(fresh_pool):
    b = gpumem.DeviceBuffer(4096)
    b.close()
    assert b.closed and b.ptr == 0 and b.resource is None
    assert fresh_pool.statistics()["allocations"] == 0
    b.close()
    with pytest.raises(gpumem.LogicError, match="closed"):
        b.copy_to_host()
    with pytest.raises(gpumem.LogicError, match="closed"):
        b.__cuda_array_interface__
    with pytest.raises(gpumem.LogicError, match="closed"):
        b.__dlpack__()


def test_buffer_keeps_its_resource(fresh_pool):
    b = gpumem.DeviceBuffer(2048)
    gpumem.set_current_resource(gpumem.CudaResource(0), 0)  # the fixture restores the pool
    c = gpumem.DeviceBuffer(2048)
    assert isinstance(c.resource, gpumem.CudaResource)
    assert b.resource is fresh_pool
    del b  # goes back to the pool, not to the new current resource
    assert fresh_pool.statistics()["allocations"] == 0


def test_explicit_resource_and_device():
    r = gpumem.CudaResource(0)
    b = gpumem.DeviceBuffer(300, resource=r)
    assert r.allocation_count == 1 and r.allocated_bytes == 300
    del b
    assert r.allocation_count == 0
    with pytest.raises(gpumem.LogicError, match="differs from the resource's device"):
        gpumem.DeviceBuffer(300, device=1, resource=r)


def test_device_one():
    if gpumem.device_count() < 2:
        pytest.skip("needs two devices")
    b = gpumem.DeviceBuffer(1 << 16, device=1)
    assert b.device == 1
    assert b.resource.device == 1
    assert b.__dlpack_device__() == (2, 1)
    b.copy_from_host(b"\x07" * (1 << 16))
    assert b.copy_to_host() == b"\x07" * (1 << 16)


def test_zero_size_allocates_nothing(fresh_pool):
    b = gpumem.DeviceBuffer(0)
    assert b.ptr == 0 and b.size == 0 and b.resource is None
    assert fresh_pool.statistics()["allocations"] == 0
    assert b.copy_to_host() == b""
    b.copy_from_host(b"")
    cai = b.__cuda_array_interface__
    assert cai["data"] == (0, False) and cai["shape"] == (0,) and cai["stream"] is None
    assert gpumem.DeviceBuffer.from_host(b"").ptr == 0
    b.close()


def test_sizes_that_are_not_byte_counts_are_refused_saying_why():
    with pytest.raises(gpumem.LogicError, match="the size must be >= 0, not -1"):
        gpumem.DeviceBuffer(-1)
    with pytest.raises(gpumem.LogicError, match="past 2\\^64 - 1"):
        gpumem.DeviceBuffer(1 << 64)
    for bad in ("10", b"10", 10.0, True, None):
        with pytest.raises(TypeError, match="the size must be an int, not"):
            gpumem.DeviceBuffer(bad)


def test_every_form_of_the_constructor_gives_the_same_buffer(fresh_pool):
    # DeviceBuffer(size) and DeviceBuffer(size, stream) take a fast path on Python >= 3.12
    # (Note [Constructing a DeviceBuffer without argument parsing]); every form must agree.
    s = gpumem.Stream()
    forms = [
        lambda: gpumem.DeviceBuffer(512),
        lambda: gpumem.DeviceBuffer(512, None),
        lambda: gpumem.DeviceBuffer(512, s),
        lambda: gpumem.DeviceBuffer(512, stream=s),
        lambda: gpumem.DeviceBuffer(size=512),
        lambda: gpumem.DeviceBuffer(512, None, device=0),
        lambda: gpumem.DeviceBuffer(512, s, resource=fresh_pool),
    ]
    for make in forms:
        b = make()
        assert b.size == 512 and b.ptr != 0 and b.device == 0 and b.resource is fresh_pool
        assert fresh_pool.statistics()["allocations"] == 1
        del b
        assert fresh_pool.statistics()["allocations"] == 0
    assert gpumem.DeviceBuffer(512, s).stream == s.handle


def test_the_constructor_s_errors_are_typed_on_every_path(fresh_pool):
    with pytest.raises(TypeError, match="expected a stream"):
        gpumem.DeviceBuffer(16, "not a stream")
    with pytest.raises(gpumem.OutOfMemoryError):
        gpumem.DeviceBuffer(1 << 62)
    with pytest.raises(gpumem.OutOfMemoryError):
        gpumem.DeviceBuffer(1 << 62, None)
    with pytest.raises(TypeError):
        gpumem.DeviceBuffer()
    with pytest.raises(TypeError):
        gpumem.DeviceBuffer(16, None, 0)  # device is keyword-only
    with pytest.raises(TypeError):
        gpumem.DeviceBuffer(16, colour="red")
    assert fresh_pool.statistics()["allocations"] == 0


def test_a_subclass_runs_its_own_init(fresh_pool):
    class Tagged(gpumem.DeviceBuffer):
        def __init__(self, size, tag):
            super().__init__(size)
            self.tag = tag

    t = Tagged(64, "x")
    assert t.tag == "x" and t.size == 64 and isinstance(t, gpumem.DeviceBuffer)
    del t
    assert fresh_pool.statistics()["allocations"] == 0


def test_sizes_with_index_are_taken():
    class Count:
        def __index__(self):
            return 4096

    assert gpumem.DeviceBuffer(Count()).size == 4096


# ---- __cuda_array_interface__ -------------------------------------------------


def test_cuda_array_interface_v3():
    b = gpumem.DeviceBuffer(777)
    assert b.__cuda_array_interface__ == {
        "shape": (777,),
        "strides": None,
        "typestr": "|u1",
        "data": (b.ptr, False),
        "version": 3,
        "stream": 1,  # the legacy default stream in the protocol's numbering
    }


@pytest.mark.parametrize(
    "stream, expected", [(gpumem.PER_THREAD_DEFAULT_STREAM, 2), (gpumem.LEGACY_DEFAULT_STREAM, 1)]
)
def test_cuda_array_interface_default_streams(stream, expected):
    assert gpumem.DeviceBuffer(64, stream).__cuda_array_interface__["stream"] == expected


def test_cuda_array_interface_own_stream():
    s = gpumem.Stream()
    assert gpumem.DeviceBuffer(64, s).__cuda_array_interface__["stream"] == s.handle


# ---- DLPack ------------------------------------------------------------------------


def test_dlpack_device():
    assert gpumem.DeviceBuffer(8).__dlpack_device__() == (2, 0)  # kDLCUDA, device 0


def check_tensor(t, b):
    assert t.data == b.ptr
    assert (t.device.device_type, t.device.device_id) == (2, b.device)
    assert t.ndim == 1
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (1, 8, 1)  # uint8
    assert t.shape[0] == b.size
    assert t.strides[0] == 1
    assert t.byte_offset == 0


def test_dlpack_legacy_capsule_and_deleter():
    b = gpumem.DeviceBuffer(1234)
    refs = sys.getrefcount(b)
    capsule = b.__dlpack__()
    assert sys.getrefcount(b) == refs + 1  # the export holds the buffer
    managed = consume(capsule, b"dltensor", DLManagedTensor)
    check_tensor(managed.contents.dl_tensor, b)
    del capsule  # consumed: the consumer owns it now
    assert sys.getrefcount(b) == refs + 1
    managed.contents.deleter(managed)
    assert sys.getrefcount(b) == refs


def test_dlpack_versioned_capsule():
    b = gpumem.DeviceBuffer(4096)
    refs = sys.getrefcount(b)
    capsule = b.__dlpack__(max_version=(1, 2))
    managed = consume(capsule, b"dltensor_versioned", DLManagedTensorVersioned)
    m = managed.contents
    assert (m.version.major, m.version.minor) == (1, 1)
    assert m.flags == 0
    check_tensor(m.dl_tensor, b)
    m.deleter(managed)
    assert sys.getrefcount(b) == refs


def test_dlpack_old_consumers_get_the_legacy_capsule():
    b = gpumem.DeviceBuffer(16)
    assert _get_pointer(b.__dlpack__(max_version=(0, 8)), b"dltensor")


def test_unconsumed_capsule_releases_the_buffer(fresh_pool):
    b = gpumem.DeviceBuffer(4096)
    refs = sys.getrefcount(b)
    for kwargs in ({}, {"max_version": (1, 0)}):
        capsule = b.__dlpack__(**kwargs)
        del capsule
        assert sys.getrefcount(b) == refs
    del b
    gc.collect()
    assert fresh_pool.statistics()["allocations"] == 0


def test_dlpack_buffer_outlives_its_python_name(fresh_pool):
    b = gpumem.DeviceBuffer(4096)
    capsule = b.__dlpack__()
    managed = consume(capsule, b"dltensor", DLManagedTensor)
    del b, capsule
    gc.collect()
    assert fresh_pool.statistics()["allocations"] == 1  # the consumer still holds it
    managed.contents.deleter(managed)
    assert fresh_pool.statistics()["allocations"] == 0


def test_dlpack_streams():
    s = gpumem.Stream()
    consumer = gpumem.Stream()
    b = gpumem.DeviceBuffer(4096, s)
    for stream in (None, 1, 2, -1, consumer.handle, s.handle, consumer):
        capsule = b.__dlpack__(stream=stream)
        del capsule
    consumer.synchronize()
    with pytest.raises(gpumem.LogicError, match="stream 0 is ambiguous"):
        b.__dlpack__(stream=0)


def test_dlpack_refuses_copies_and_other_devices():
    b = gpumem.DeviceBuffer(64)
    with pytest.raises(BufferError, match="copy=True"):
        b.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="another device"):
        b.__dlpack__(dl_device=(1, 0))
    assert _get_pointer(b.__dlpack__(dl_device=(2, 0), copy=False), b"dltensor")


def test_dlpack_arguments_of_the_wrong_type_say_which():
    b = gpumem.DeviceBuffer(64)
    with pytest.raises(TypeError, match="max_version must be a tuple of two ints, not 'x'"):
        b.__dlpack__(max_version="x")
    with pytest.raises(TypeError, match="dl_device must be a tuple of two ints"):
        b.__dlpack__(dl_device="cuda")
    with pytest.raises(TypeError, match="copy must be None or a bool"):
        b.__dlpack__(copy="yes")


def test_repr():
    b = gpumem.DeviceBuffer(10)
    assert "size=10" in repr(b) and "device=0" in repr(b)
    b.close()
    assert "closed" in repr(b)


def test_a_thread_without_a_context_gets_device_0_s_primary_context():
    # Note [A thread's first context] (python/src/system.cpp): as the CUDA runtime's first call.
    import threading

    seen = []

    def work():
        seen.append(gpumem.current_context_device())
        gpumem.DeviceBuffer(4096)
        seen.append(gpumem.current_context_device())

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    assert seen == [None, 0]
