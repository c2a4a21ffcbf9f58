"""gpumem.cupy and gpumem.torch, checked without CuPy or PyTorch installed.

gpumem.cupy runs against a stand-in `cupy` module with the few names it uses (a CuPy
without CFunctionAllocator: the Python route; test_cupy_allocator.py has the C route); the
PyTorch entry points are called through ctypes exactly as CUDAPluggableAllocator
calls them. tests/python/test_gpu_interop.py uses the real libraries on a GPU.
"""

import ctypes
import gc
import importlib
import logging
import os
import sys
import types
import weakref

import pytest

import gpumem
import gpumem.torch as gtorch

# ---- CuPy ----------------------------------------------------------------------


class FakeStream:
    """A CuPy stream: only .ptr (all gpumem.cupy reads)."""

    def __init__(self, ptr):
        self.ptr = ptr


class FakeFunctionMemory:
    """CuPy's PythonFunctionAllocatorMemory: malloc at creation, free when dropped."""

    def __init__(self, size, malloc, free, device_id):
        self.size, self.device_id, self._free, self.ptr = size, device_id, free, 0
        self.ptr = malloc(size, device_id) if size > 0 else 0

    def __del__(self):
        if self.ptr:
            self._free(self.ptr, self.device_id)


class FakeMemoryPointer:
    def __init__(self, mem, offset):
        self.mem, self.ptr = mem, mem.ptr + offset


class FakePythonFunctionAllocator:
    """cupy.cuda.memory.PythonFunctionAllocator as CuPy 13/14 define it."""

    def __init__(self, malloc_func, free_func):
        self._malloc, self._free = malloc_func, free_func

    def malloc(self, size):
        return FakeMemoryPointer(FakeFunctionMemory(size, self._malloc, self._free, state_device[0]), 0)


state_device = [0]


@pytest.fixture
def fake_cupy(monkeypatch):
    state = types.SimpleNamespace(device=0, stream=FakeStream(0), allocator=None)
    state_device[0] = 0
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(
        get_current_stream=lambda: state.stream,
        stream=types.SimpleNamespace(get_current_stream_ptr=lambda: state.stream.ptr),
        memory=types.SimpleNamespace(PythonFunctionAllocator=FakePythonFunctionAllocator,
                                     OutOfMemoryError=type("OutOfMemoryError", (MemoryError,), {})),
        set_allocator=lambda f: setattr(state, "allocator", f),
    )
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.delitem(sys.modules, "gpumem.cupy", raising=False)
    hook = importlib.import_module("gpumem.cupy")
    yield hook, state
    sys.modules.pop("gpumem.cupy", None)


def test_cupy_allocator_allocates_from_gpumem_on_the_current_stream(fake_cupy, fresh_pool):
    hook, state = fake_cupy
    stream = gpumem.Stream()
    state.stream = FakeStream(stream.handle)
    mp = hook.allocator(5000)
    assert mp.ptr != 0 and mp.ptr % 256 == 0
    assert mp.mem.size == 5000 and mp.mem.device_id == 0
    stats = fresh_pool.statistics()
    assert stats["allocations"] == 1 and stats["streams"] == 1  # on CuPy's stream
    assert hook.hook.live_allocations() == 1
    del mp
    gc.collect()
    assert fresh_pool.statistics()["allocations"] == 0
    assert hook.hook.live_allocations() == 0


def test_cupy_allocations_do_not_overlap(fake_cupy, fresh_pool):
    hook, _ = fake_cupy
    held = [hook.allocator(size) for size in (1, 300, 5000, 1 << 20, 7)]
    spans = sorted((mp.ptr, mp.ptr + mp.mem.size) for mp in held)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))
    assert fresh_pool.statistics()["allocations"] == len(held)
    del held
    gc.collect()
    assert fresh_pool.statistics()["allocations"] == 0


def test_cupy_stream_object_lives_until_the_free(fake_cupy):
    hook, state = fake_cupy
    stream = gpumem.Stream()
    state.stream = FakeStream(stream.handle)
    ref = weakref.ref(state.stream)
    mp = hook.allocator(100)
    state.stream = FakeStream(0)
    gc.collect()
    assert ref() is not None
    del mp
    gc.collect()
    assert ref() is None


def test_cupy_default_stream_objects_are_not_kept(fake_cupy):
    hook, state = fake_cupy
    ref = weakref.ref(state.stream)  # ptr 0: the legacy default stream
    mp = hook.allocator(100)
    state.stream = FakeStream(0)
    gc.collect()
    assert ref() is None
    del mp


def test_cupy_zero_size_allocates_nothing(fake_cupy, fresh_pool):
    hook, _ = fake_cupy
    mp = hook.allocator(0)
    assert mp.ptr == 0
    assert fresh_pool.statistics()["allocations"] == 0
    assert hook.hook.malloc(0, 0) == 0


def test_cupy_out_of_memory_raises(fake_cupy):
    hook, _ = fake_cupy
    with pytest.raises(gpumem.OutOfMemoryError):
        hook.allocator(1 << 62)
    assert hook.hook.live_allocations() == 0
    assert hook.last_out_of_memory().requested_bytes == 1 << 62


def test_cupy_foreign_free_is_reported_not_raised(fake_cupy, caplog):
    hook, _ = fake_cupy
    with caplog.at_level(logging.ERROR, logger="gpumem"):
        hook.hook.free(0x1000, 0)
    assert any("which gpumem.cupy did not allocate" in r.getMessage() for r in caplog.records)


def test_cupy_device_follows_cupy(fake_cupy):
    if gpumem.device_count() < 2:
        pytest.skip("needs two devices")
    hook, state = fake_cupy
    state_device[0] = 1
    mp = hook.allocator(4096)
    assert mp.mem.device_id == 1


def test_cupy_without_get_current_stream_ptr_reads_the_stream_object(fake_cupy, monkeypatch):
    hook, state = fake_cupy
    from gpumem import _core

    plain = _core.CupyHook(lambda: state.stream)
    stream = gpumem.Stream()
    state.stream = FakeStream(stream.handle)
    p = plain.malloc(256, 0)
    assert p != 0 and plain.live_allocations() == 1
    plain.free(p, 0)
    assert plain.live_allocations() == 0


def test_use_gpumem_for_cupy(fake_cupy):
    hook, state = fake_cupy
    assert hook.route == "python"  # the stand-in is a CuPy without CFunctionAllocator
    hook.use_gpumem_for_cupy()
    assert state.allocator == hook.allocator


# ---- PyTorch ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def torch_lib():
    lib = ctypes.CDLL(gtorch.library_path())
    lib.gpumem_torch_alloc.restype = ctypes.c_void_p
    lib.gpumem_torch_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.gpumem_torch_free.restype = None
    lib.gpumem_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.gpumem_torch_live_allocations.restype = ctypes.c_size_t
    return lib


def test_torch_library_is_beside_the_extension():
    path = gtorch.library_path()
    assert os.path.isabs(path) and os.path.exists(path)
    assert os.path.dirname(path) == os.path.dirname(gpumem.__file__)


def test_torch_alloc_and_free(torch_lib, fresh_pool):
    stream = gpumem.Stream()
    before = torch_lib.gpumem_torch_live_allocations()
    p = torch_lib.gpumem_torch_alloc(12345, 0, stream.handle)
    assert p and p % 256 == 0
    assert torch_lib.gpumem_torch_live_allocations() == before + 1
    stats = fresh_pool.statistics()
    assert stats["allocations"] == 1 and stats["streams"] == 1  # on the stream PyTorch passed
    torch_lib.gpumem_torch_free(p, 12345, 0, stream.handle)
    assert torch_lib.gpumem_torch_live_allocations() == before
    assert fresh_pool.statistics()["allocations"] == 0


def test_torch_zero_size_and_null_free(torch_lib, fresh_pool):
    assert torch_lib.gpumem_torch_alloc(0, 0, None) is None
    torch_lib.gpumem_torch_free(None, 0, 0, None)
    assert fresh_pool.statistics()["allocations"] == 0


def test_torch_free_goes_to_the_allocating_resource(torch_lib, fresh_pool):
    p = torch_lib.gpumem_torch_alloc(4096, 0, None)
    previous = gpumem.set_current_resource(gpumem.CudaResource(0), 0)
    try:
        torch_lib.gpumem_torch_free(p, 4096, 0, None)
    finally:
        gpumem.set_current_resource(previous, 0)
    assert fresh_pool.statistics()["allocations"] == 0


def test_torch_bad_free_is_reported_not_raised(torch_lib, capfd):
    torch_lib.gpumem_torch_free(0x1000, 64, 0, None)
    err = capfd.readouterr().err
    assert "gpumem: PyTorch free of 64 bytes" in err
    assert "was not allocated by this pool" in err


def test_torch_failed_alloc_raises_through_the_caller(torch_lib):
    # PyTorch turns the C++ exception into a Python error; called from ctypes, a C++
    # exception cannot be caught, so a subprocess shows the message reaches stderr
    # and nothing is returned as if it had worked.
    from conftest import run_python

    p = run_python(
        "import ctypes, gpumem, gpumem.torch as t\n"
        "lib = ctypes.CDLL(t.library_path())\n"
        "lib.gpumem_torch_alloc.restype = ctypes.c_void_p\n"
        "lib.gpumem_torch_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]\n"
        "print(lib.gpumem_torch_alloc(1 << 62, 0, None))\n"
    )
    assert p.returncode != 0
    assert "out of memory" in p.stderr


def test_use_gpumem_for_torch_installs_the_entry_points(monkeypatch):
    calls = {}

    class PluggableAllocator:
        def __init__(self, path, alloc, free):
            calls["args"] = (path, alloc, free)

    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(
        memory=types.SimpleNamespace(
            CUDAPluggableAllocator=PluggableAllocator,
            change_current_allocator=lambda a: calls.setdefault("installed", a),
        )
    )
    monkeypatch.setitem(sys.modules, "torch", torch)
    allocator = gtorch.use_gpumem_for_torch()
    assert calls["args"] == (gtorch.library_path(), "gpumem_torch_alloc", "gpumem_torch_free")
    assert calls["installed"] is allocator
    lib = ctypes.CDLL(calls["args"][0])
    assert lib.gpumem_torch_alloc and lib.gpumem_torch_free
