"""gpumem.cupy's C route: the functions CuPy's CFunctionAllocator calls.

The C functions are called through ctypes as CuPy calls them (PYFUNCTYPE: with the GIL
held) and as a plain C caller would (CFUNCTYPE: without it), on the simulator. CuPy's
stream lookup is stood in for by a ctypes callback of the same C signature. The route
choice of gpumem.cupy runs against stand-in `cupy` modules; the tests at the end use
the real CuPy on a GPU and skip without it.
"""

import ctypes
import gc
import importlib
import logging
import pickle
import sys
import threading
import types
import weakref

import pytest
from conftest import BACKEND, run_python

import gpumem
from gpumem import _core

STREAM_FN = ctypes.CFUNCTYPE(ctypes.c_ssize_t, ctypes.c_int)  # intptr_t (int)
MALLOC_WITH_GIL = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
FREE_WITH_GIL = ctypes.PYFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)
MALLOC_NO_GIL = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
FREE_NO_GIL = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)

_python_api = ctypes.PyDLL(None, handle=ctypes.pythonapi._handle)  # its own function objects
_python_api.PyCapsule_New.restype = ctypes.py_object
_python_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]


def capsule(function, signature, keep):
    """What Cython puts in a module's __pyx_capi__: the function's address, named by its signature."""
    name = ctypes.create_string_buffer(signature)  # the capsule points at its name: keep it alive
    keep.extend([function, name])
    return _python_api.PyCapsule_New(ctypes.cast(function, ctypes.c_void_p).value, ctypes.addressof(name), None)


class FakeStream:
    """A CuPy stream object: its handle in .ptr."""

    def __init__(self, ptr):
        self.ptr = ptr


class Streams:
    """CuPy's current stream as get_stream_ptr gives it, and the stream objects CuPy has."""

    def __init__(self):
        self.handle = 0
        self.looked_up = []  # the device of each lookup
        self.objects = {}

    def lookup(self, device):
        self.looked_up.append(device)
        return self.handle

    def current_object(self, device=-1):
        return self.objects.setdefault(self.handle, FakeStream(self.handle))


class CAllocator:
    """One gpumem._core.CupyAllocator and its functions, callable from Python."""

    def __init__(self, with_gil=True):
        self.streams = Streams()
        self._stream_fn = STREAM_FN(self.streams.lookup)  # kept alive: the state holds its address
        self.state = _core.CupyAllocator(ctypes.cast(self._stream_fn, ctypes.c_void_p).value,
                                         keep_stream=self.streams.current_object)
        malloc_t, free_t = (MALLOC_WITH_GIL, FREE_WITH_GIL) if with_gil else (MALLOC_NO_GIL, FREE_NO_GIL)
        self._malloc = malloc_t(self.state.try_malloc_function)
        self._free = free_t(self.state.free_function)

    def malloc(self, size, device=0):
        return self._malloc(self.state.param, size, device) or 0

    def free(self, ptr, device=0):
        self._free(self.state.param, ptr, device)


@pytest.fixture(params=[True, False], ids=["gil-held", "gil-released"])
def c_alloc(request):
    return CAllocator(with_gil=request.param)


@pytest.fixture
def stats():
    """A StatisticsAdaptor over a fresh pool, current for device 0 during the test."""
    top = gpumem.StatisticsAdaptor(gpumem.PoolResource(gpumem.CudaResource(0)))
    previous = gpumem.set_current_resource(top, 0)
    yield top
    gpumem.set_current_resource(previous, 0)


def test_allocate_and_free_through_the_c_functions(c_alloc, stats):
    p = c_alloc.malloc(5000)
    assert p != 0 and p % 256 == 0
    (live,) = c_alloc.state.live()
    assert live == {"ptr": p, "bytes": 5000, "stream": 0, "device": 0, "keeps_stream_object": False}
    assert stats.statistics()["current_bytes"] == 5000
    c_alloc.free(p)
    assert c_alloc.state.live_allocations() == 0
    assert stats.statistics()["current_bytes"] == 0


def test_sizes_are_tracked_for_the_free(c_alloc, stats):
    sizes = [1, 300, 5000, 1 << 20, 7, 4096]
    ptrs = [c_alloc.malloc(n) for n in sizes]
    assert sorted((e["ptr"], e["bytes"]) for e in c_alloc.state.live()) == sorted(zip(ptrs, sizes))
    spans = sorted((p, p + n) for p, n in zip(ptrs, sizes))
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))
    assert stats.statistics()["current_bytes"] == sum(sizes)
    for p, n in zip(ptrs, sizes):
        before = stats.statistics()["current_bytes"]
        c_alloc.free(p)  # the free passes only the pointer; the pool is told the size
        assert stats.statistics()["current_bytes"] == before - n
    assert stats.statistics()["current_count"] == 0


def test_the_allocation_is_on_cupys_current_stream(c_alloc, fresh_pool):
    stream = gpumem.Stream()
    c_alloc.streams.handle = stream.handle
    p = c_alloc.malloc(4096)
    assert c_alloc.streams.looked_up == [0]  # looked up per allocation, for its device
    (live,) = c_alloc.state.live()
    assert live["stream"] == stream.handle and live["keeps_stream_object"]
    assert fresh_pool.statistics()["streams"] == 1
    c_alloc.free(p)
    assert fresh_pool.statistics()["allocations"] == 0


def test_a_user_stream_object_lives_until_the_free(c_alloc):
    stream = gpumem.Stream()
    c_alloc.streams.handle = stream.handle
    p = c_alloc.malloc(100)
    ref = weakref.ref(c_alloc.streams.objects.pop(stream.handle))
    gc.collect()
    assert ref() is not None  # CuPy dropped it; gpumem.cupy holds it for the free
    c_alloc.free(p)
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("handle", [0, 1, 2])
def test_default_streams_need_no_object(c_alloc, handle):
    c_alloc.streams.handle = handle
    p = c_alloc.malloc(100)
    assert not c_alloc.streams.objects  # keep_stream was not called
    assert c_alloc.state.live()[0]["stream"] == handle
    c_alloc.free(p)


def test_zero_bytes_allocate_nothing(c_alloc, fresh_pool):
    assert c_alloc.malloc(0) == 0
    assert fresh_pool.statistics()["allocations"] == 0 and c_alloc.state.live_allocations() == 0


def test_the_free_goes_to_the_allocating_resource(c_alloc, fresh_pool):
    p = c_alloc.malloc(4096)
    previous = gpumem.set_current_resource(gpumem.CudaResource(0), 0)
    try:
        c_alloc.free(p)
    finally:
        gpumem.set_current_resource(previous, 0)
    assert fresh_pool.statistics()["allocations"] == 0


def test_a_foreign_free_is_diagnosed_not_fatal(c_alloc, caplog):
    p = c_alloc.malloc(256)
    with caplog.at_level(logging.ERROR, logger="gpumem"):
        c_alloc.free(0x1000)
        c_alloc.free(p)
        c_alloc.free(p)  # twice
    messages = [r.getMessage() for r in caplog.records if r.name == "gpumem" and r.levelno == logging.ERROR]
    assert len(messages) == 2, messages
    assert "free of 0x1000 on device 0, which gpumem.cupy did not allocate" in messages[0]
    assert hex(p) in messages[1]
    assert c_alloc.state.live_allocations() == 0


def test_out_of_memory_returns_null_and_keeps_gpumem_s_explanation(c_alloc):
    assert c_alloc.malloc(1 << 62) == 0
    oom = c_alloc.state.last_out_of_memory()
    assert isinstance(oom, gpumem.OutOfMemoryError)
    assert oom.requested_bytes == 1 << 62 and oom.device == 0
    assert "out of memory" in str(oom)
    assert c_alloc.state.live_allocations() == 0
    with pytest.raises(gpumem.OutOfMemoryError) as raised:
        c_alloc.state.raise_failure()  # this thread's failure, once
    assert raised.value.requested_bytes == 1 << 62
    c_alloc.state.raise_failure()  # nothing left: no error


def test_a_limit_s_refusal_is_the_out_of_memory_kept(c_alloc):
    limit = gpumem.LimitingAdaptor(gpumem.PoolResource(gpumem.CudaResource(0)), 1 << 20)
    previous = gpumem.set_current_resource(limit, 0)
    try:
        p = c_alloc.malloc(768 << 10)
        assert p != 0
        assert c_alloc.malloc(512 << 10) == 0
        assert c_alloc.state.last_out_of_memory().requested_bytes == 512 << 10
        c_alloc.free(p)
        q = c_alloc.malloc(512 << 10)  # fits again
        assert q != 0
        c_alloc.free(q)
    finally:
        gpumem.set_current_resource(previous, 0)


def test_the_last_out_of_memory_is_per_thread_unless_asked():
    other = CAllocator()
    worker = threading.Thread(target=other.malloc, args=(3 << 60,))
    worker.start()
    worker.join()
    assert other.state.last_out_of_memory(any_thread=True).requested_bytes == 3 << 60
    mine = other.state.last_out_of_memory()
    assert mine is None or mine.requested_bytes != 3 << 60  # not this thread's


def test_a_bad_device_fails_the_allocation(c_alloc):
    assert c_alloc.malloc(256, device=gpumem.device_count()) == 0
    with pytest.raises(gpumem.LogicError, match="does not exist"):
        c_alloc.state.raise_failure()


def test_an_oom_callback_that_takes_the_gil_runs_inside_the_allocation(c_alloc):
    retry = gpumem.OomRetryAdaptor(gpumem.LimitingAdaptor(gpumem.PoolResource(gpumem.CudaResource(0)), 1 << 20))
    previous = gpumem.set_current_resource(retry, 0)
    try:
        cache = [c_alloc.malloc(768 << 10)]

        def drop_cache(event):
            if not cache:
                return False
            c_alloc.free(cache.pop())
            return True

        retry.add_callback(drop_cache)
        p = c_alloc.malloc(512 << 10)
        assert p != 0 and not cache
        c_alloc.free(p)
    finally:
        gpumem.set_current_resource(previous, 0)


def test_threads_allocate_and_free_at_once(stats):
    c_alloc = CAllocator(with_gil=True)  # as CuPy calls: the GIL is released around the pool
    errors = []

    def work(seed):
        try:
            held = []
            for i in range(300):
                held.append((c_alloc.malloc(64 + (seed * 7919 + i * 104729) % 100000), i))
                if len(held) > 8:
                    c_alloc.free(held.pop(seed % len(held))[0])
            for p, _ in held:
                c_alloc.free(p)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert c_alloc.state.live_allocations() == 0
    counters = stats.statistics()
    assert counters["current_bytes"] == 0 and counters["total_count"] == 4 * 300


def test_a_thread_without_a_context_gets_the_device_primary_context(c_alloc, stats):
    # Note [CuPy's C allocator], the context: as the CUDA runtime's first call would.
    seen = []

    def work():
        seen.append(gpumem.current_context_device())
        p = c_alloc.malloc(4096)
        seen.append(gpumem.current_context_device())
        c_alloc.free(p)

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    assert seen == [None, 0]


def test_a_thread_with_a_context_keeps_it(c_alloc, stats):
    if gpumem.device_count() < 2:
        pytest.skip("needs two devices")
    seen = []

    def work():
        gpumem.set_current_device(1)
        p = c_alloc.malloc(4096, device=0)
        seen.append(gpumem.current_context_device())
        c_alloc.free(p, device=0)

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    assert seen == [1]


def test_a_null_stream_function_is_refused():
    with pytest.raises(gpumem.LogicError):
        _core.CupyAllocator(0)


def test_capsule_function_checks_the_signature():
    keep = []
    fn = STREAM_FN(lambda device: 0)
    c = capsule(fn, b"intptr_t (int)", keep)
    assert _core.CupyAllocator.capsule_function(c, "intptr_t (int)") == ctypes.cast(fn, ctypes.c_void_p).value
    assert _core.CupyAllocator.capsule_function(c, "intptr_t (void)") is None
    assert _core.CupyAllocator.capsule_function(object(), "intptr_t (int)") is None


# ---- gpumem.cupy's choice of route, with stand-in CuPy modules ---------------------


class FakeCupyOutOfMemoryError(MemoryError):
    """cupy.cuda.memory.OutOfMemoryError as CuPy 14 defines it."""

    def __init__(self, size, total, limit=0):
        self._size, self._total, self._limit = size, total, limit
        super().__init__("Out of memory allocating {:,} bytes (allocated so far: {:,} bytes).".format(size, total))

    def __reduce__(self):
        return (type(self), (self._size, self._total, self._limit))


class FakeCFunctionAllocator:
    """CuPy's CFunctionAllocator. CuPy calls malloc_function, whose C++ exception its Cython
    turns into the Python error gpumem set; ctypes cannot catch a C++ exception, so this
    stand-in calls the null-returning twin and then raises the way malloc does."""

    made = []

    def __init__(self, param, malloc_func, free_func, owner):
        self.args = (param, malloc_func, free_func, owner)
        self._malloc = MALLOC_WITH_GIL(owner.try_malloc_function)
        self._free = FREE_WITH_GIL(free_func)
        FakeCFunctionAllocator.made.append(self)

    def malloc(self, size):
        param, _, _, _ = self.args
        ptr = self._malloc(param, size, 0) or 0
        if size and not ptr:
            sys.modules["gpumem.cupy"]._raise_allocation_error(size, 0)
        return types.SimpleNamespace(ptr=ptr, size=size, free=lambda: self._free(param, ptr, 0))


@pytest.fixture
def make_fake_cupy(monkeypatch):
    keep = []

    def make(version, with_capsule=True):
        streams = Streams()
        capi = {"get_stream_ptr": capsule(STREAM_FN(streams.lookup), b"intptr_t (int)", keep)}
        cupy = types.ModuleType("cupy")
        cupy.__version__ = version
        cupy.cuda = types.SimpleNamespace(
            memory=types.SimpleNamespace(
                CFunctionAllocator=FakeCFunctionAllocator,
                PythonFunctionAllocator=lambda malloc, free: types.SimpleNamespace(malloc=malloc, free=free),
                OutOfMemoryError=FakeCupyOutOfMemoryError,
            ),
            get_current_stream=streams.current_object,
            stream=types.SimpleNamespace(get_current_stream_ptr=None),
            set_allocator=lambda f: setattr(cupy, "installed", f),
        )
        stream_module = types.ModuleType("cupy_backends.cuda.stream")
        if with_capsule:
            stream_module.__pyx_capi__ = capi
        backends = types.ModuleType("cupy_backends")
        backends.cuda = types.ModuleType("cupy_backends.cuda")
        backends.cuda.stream = stream_module
        for name_, module in (("cupy", cupy), ("cupy_backends", backends), ("cupy_backends.cuda", backends.cuda),
                              ("cupy_backends.cuda.stream", stream_module)):
            monkeypatch.setitem(sys.modules, name_, module)
        monkeypatch.delitem(sys.modules, "gpumem.cupy", raising=False)
        return importlib.import_module("gpumem.cupy"), cupy, streams

    yield make
    sys.modules.pop("gpumem.cupy", None)


def test_cupy_14_2_takes_the_c_route(make_fake_cupy, fresh_pool):
    FakeCFunctionAllocator.made.clear()
    module, cupy, _ = make_fake_cupy("14.2.0")
    assert module.route == "c" and module.hook is None
    (made,) = FakeCFunctionAllocator.made
    param, malloc_func, free_func, owner = made.args
    assert owner is module.state and param == owner.param
    assert malloc_func == owner.malloc_function and free_func == owner.free_function
    module.use_gpumem_for_cupy()
    assert cupy.installed == made.malloc
    mem = cupy.installed(1000)
    assert mem.ptr != 0 and module.live_allocations() == 1
    assert fresh_pool.statistics()["allocations"] == 1
    mem.free()
    assert module.live_allocations() == 0


def test_out_of_memory_is_cupys_error_and_gpumems(make_fake_cupy):
    module, cupy, _ = make_fake_cupy("15.0.0a1")
    with pytest.raises(FakeCupyOutOfMemoryError) as raised:
        module.allocator(1 << 62)
    e = raised.value
    assert isinstance(e, gpumem.OutOfMemoryError) and isinstance(e, module.OutOfMemoryError)
    assert e.requested_bytes == 1 << 62 and e.reason
    assert str(e).startswith("gpumem: out of memory")
    assert module.last_out_of_memory().requested_bytes == 1 << 62
    again = pickle.loads(pickle.dumps(e))  # CuPy's __reduce__: (size, total, limit)
    assert isinstance(again, FakeCupyOutOfMemoryError) and isinstance(again, gpumem.OutOfMemoryError)


@pytest.mark.parametrize("version, with_capsule", [("14.0.1", True), ("13.6.0", True), ("14.2.0", False)])
def test_older_cupy_or_no_c_api_takes_the_python_route(make_fake_cupy, version, with_capsule, fresh_pool):
    module, _, _ = make_fake_cupy(version, with_capsule)
    assert module.route == "python" and module.state is None
    p = module.hook.malloc(4096, 0)
    assert p != 0 and module.live_allocations() == 1
    module.hook.free(p, 0)
    assert module.live_allocations() == 0
    with pytest.raises(gpumem.OutOfMemoryError):
        module.hook.malloc(1 << 62, 0)
    assert module.last_out_of_memory().requested_bytes == 1 << 62


# ---- the real CuPy, on a GPU ----------------------------------------------------------


def cupy_on_gpu():
    if BACKEND != "cuda":
        pytest.skip("needs a GPU (cuda backend)")
    pytest.importorskip("cupy")


def run_cupy(code):
    p = run_python("import cupy, gpumem, gpumem.cupy\ngpumem.cupy.use_gpumem_for_cupy()\n" + code)
    assert p.returncode == 0, p.stdout + p.stderr
    return p


def test_cupy_arrays_come_from_gpumem_through_the_c_route():
    cupy_on_gpu()
    run_cupy(
        "assert gpumem.cupy.route == 'c', gpumem.cupy.route\n"
        "pool = gpumem.get_current_resource(0)\n"
        "a = cupy.arange(1 << 20, dtype=cupy.float32)\n"
        "assert gpumem.cupy.live_allocations() >= 1\n"
        "(e,) = [e for e in gpumem.cupy.state.live() if e['ptr'] == a.data.ptr]\n"
        "assert e['bytes'] == 4 << 20 and e['stream'] == 0, e\n"
        "assert float(a.sum()) == float((1 << 20) * ((1 << 20) - 1) / 2)\n"
        "del a\n"
        "assert not [e for e in gpumem.cupy.state.live() if e['bytes'] == 4 << 20]\n"
    )


def test_cupy_out_of_memory_through_the_c_route():
    cupy_on_gpu()
    run_cupy(
        "limit = gpumem.LimitingAdaptor(gpumem.get_current_resource(0), 1 << 30)\n"
        "gpumem.set_current_resource(limit, 0)\n"
        "try:\n"
        "    cupy.empty(2 << 30, dtype=cupy.uint8)\n"
        "except cupy.cuda.memory.OutOfMemoryError as e:\n"
        "    assert isinstance(e, gpumem.OutOfMemoryError), type(e).__mro__\n"
        "    assert e.requested_bytes == 2 << 30 and 'gpumem: out of memory' in str(e), e\n"
        "else:\n"
        "    raise AssertionError('allocated 2 GiB within a limit of 1 GiB')\n"
        "assert gpumem.cupy.last_out_of_memory().requested_bytes == 2 << 30\n"
        "b = cupy.ones(1 << 20, dtype=cupy.uint8)\n"
        "assert int(b.sum()) == 1 << 20\n"
    )


def test_cupy_user_stream_through_the_c_route():
    cupy_on_gpu()
    run_cupy(
        "import gc, weakref\n"
        "s = cupy.cuda.Stream(non_blocking=True)\n"
        "with s:\n"
        "    a = cupy.full(1 << 16, 3, dtype=cupy.int32)\n"
        "(e,) = [e for e in gpumem.cupy.state.live() if e['ptr'] == a.data.ptr]\n"
        "assert e['stream'] == s.ptr and e['keeps_stream_object'], e\n"
        "ref = weakref.ref(s)\n"
        "s.synchronize()\n"
        "del s\n"
        "gc.collect()\n"
        "assert ref() is not None\n"
        "assert int(a.sum()) == 3 << 16\n"
        "del a\n"
        "gc.collect()\n"
        "assert ref() is None\n"
    )


def test_cupy_foreign_free_through_the_c_route_is_diagnosed():
    cupy_on_gpu()
    p = run_cupy(
        "import ctypes\n"
        "st = gpumem.cupy.state\n"
        "free = ctypes.PYFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)(st.free_function)\n"
        "free(st.param, 0x1000, 0)\n"
        "print('alive')\n"
    )
    assert "alive" in p.stdout and "which gpumem.cupy did not allocate" in p.stderr
