"""Stream arguments: None, gpumem.Stream, raw ints, and the __cuda_stream__ protocol."""

import gc
import weakref

import pytest

import gpumem


class MethodStream:
    """What cuda.core, CuPy and PyTorch streams look like: __cuda_stream__() -> (0, handle)."""

    def __init__(self, handle):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


class AttributeStream:
    def __init__(self, handle):
        self.__cuda_stream__ = (0, handle)


def test_stream_basics():
    s = gpumem.Stream()
    assert s.handle != 0
    assert s.device == 0
    assert s.__cuda_stream__() == (0, s.handle)
    assert int(s) == s.handle
    s.synchronize()
    assert s.ready()
    assert "gpumem.Stream" in repr(s)


def test_stream_on_another_device():
    if gpumem.device_count() < 2:
        pytest.skip("needs two devices")
    assert gpumem.Stream(1).device == 1


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda s: None, 0),
        (lambda s: 0, 0),
        (lambda s: gpumem.LEGACY_DEFAULT_STREAM, 1),
        (lambda s: gpumem.PER_THREAD_DEFAULT_STREAM, 2),
        (lambda s: s, "handle"),
        (lambda s: s.handle, "handle"),
        (lambda s: MethodStream(s.handle), "handle"),
        (lambda s: AttributeStream(s.handle), "handle"),
    ],
)
def test_accepted_stream_forms(make, expected):
    s = gpumem.Stream()
    want = s.handle if expected == "handle" else expected
    assert gpumem._core._stream_handle(make(s)) == want
    b = gpumem.DeviceBuffer(512, make(s))
    assert b.stream == want
    b.close()  # a raw handle does not keep `s` alive: free while it is


@pytest.mark.parametrize(
    "bad, error, message",
    [
        ("0", TypeError, "expected a stream"),
        (1.5, TypeError, "expected a stream"),
        (True, TypeError, "expected a stream"),
        (-3, gpumem.LogicError, "cannot be negative"),
        (AttributeStream.__new__(AttributeStream), TypeError, "expected a stream"),
    ],
)
def test_rejected_stream_forms(bad, error, message):
    with pytest.raises(error, match=message):
        gpumem.DeviceBuffer(64, bad)


def test_bad_protocol_answers():
    class Version1:
        def __cuda_stream__(self):
            return (1, 0)

    class NotATuple:
        def __cuda_stream__(self):
            return 5

    with pytest.raises(TypeError, match="version 1 is not supported"):
        gpumem.DeviceBuffer(64, Version1())
    with pytest.raises(TypeError, match=r"\(version, handle\) tuple"):
        gpumem.DeviceBuffer(64, NotATuple())


def test_buffer_keeps_its_stream_object_alive(pool):
    s = gpumem.Stream()
    ref = weakref.ref(s)
    b = gpumem.DeviceBuffer(4096, s)
    del s
    gc.collect()
    assert ref() is not None, "the stream must outlive the free queued on it"
    del b
    gc.collect()
    assert ref() is None


def test_allocations_on_a_stream_use_its_own_arena(fresh_pool):
    s = gpumem.Stream()
    a = gpumem.DeviceBuffer(1024)
    b = gpumem.DeviceBuffer(1024, s)
    assert fresh_pool.statistics()["streams"] == 2
    assert fresh_pool.statistics()["allocations"] == 2
    del a, b
    assert fresh_pool.statistics()["allocations"] == 0
