"""gpumem.torch's memory figures, torch.cuda.empty_cache() and out-of-memory.

Most checks need no PyTorch: the entry points are called through ctypes as
CUDAPluggableAllocator calls them (gpumem_torch_try_alloc is gpumem_torch_alloc with
its C++ error caught, which ctypes cannot do), and the figures, the key mapping and the
translation to torch.OutOfMemoryError are read or exercised against a stand-in `torch`
module. The checks at the end run PyTorch itself, each in its own interpreter (the
allocator is chosen once per process): they need a GPU and PyTorch with CUDA, and are
skipped otherwise, with the reason.
"""

import ctypes
import os
import re
import sys
import threading
import types

import pytest

import gpumem
import gpumem.torch as gtorch
from conftest import BACKEND, need_cuda_torch, run_python, run_torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MiB = 1 << 20


@pytest.fixture(scope="module")
def lib():
    lib = ctypes.CDLL(gtorch.library_path())
    lib.gpumem_torch_try_alloc.restype = ctypes.c_int
    lib.gpumem_torch_try_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
                                           ctypes.POINTER(ctypes.c_void_p)]
    lib.gpumem_torch_free.restype = None
    lib.gpumem_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.gpumem_torch_empty_cache.restype = None
    lib.gpumem_torch_empty_cache.argtypes = []
    lib.gpumem_torch_live_allocations.restype = ctypes.c_size_t
    return lib


def alloc(lib, size, device=0, stream=None):
    """gpumem_torch_alloc: the pointer, or the status (1 out of memory, 2 another error)."""
    p = ctypes.c_void_p()
    rc = lib.gpumem_torch_try_alloc(size, device, stream, ctypes.byref(p))
    return p.value if rc == 0 else rc


@pytest.fixture
def current():
    """Makes a resource current for device 0 for the test, then the previous one back."""
    previous = []

    def make_current(resource):
        previous.append(gpumem.set_current_resource(resource, 0))
        return resource

    yield make_current
    if previous:
        gpumem.set_current_resource(previous[0], 0)


@pytest.fixture
def fake_torch(monkeypatch):
    """A stand-in `torch` with what gpumem.torch reads: OutOfMemoryError and torch.cuda."""
    torch = types.ModuleType("torch")
    torch.OutOfMemoryError = type("OutOfMemoryError", (RuntimeError,), {})
    torch.cuda = types.SimpleNamespace(OutOfMemoryError=torch.OutOfMemoryError,
                                       is_initialized=lambda: False, current_device=lambda: 0)
    monkeypatch.setitem(sys.modules, "torch", torch)
    return torch


# ---- the figures ------------------------------------------------------------------


def test_the_key_mapping():
    counters = dict(current_bytes=300, peak_bytes=900, allocated_bytes=1200, freed_bytes=900,
                    current_count=1, peak_count=3, allocated_count=4, freed_count=3, ooms=2,
                    released_bytes=4096)
    stack = dict(stack="stats(limit(pool(cuda)))", device=0, reserved_bytes=2 * MiB, peak_reserved_bytes=3 * MiB,
                 used_bytes=512,
                 maximum_bytes=None, limit_bytes=MiB, limit_used_bytes=512, logs=[], log_events=None,
                 statistics=dict(current_bytes=512, peak_bytes=1024, total_bytes=2048, current_count=2,
                                 peak_count=3, total_count=7))
    s = gtorch._memory_stats_from(counters, stack, available_bytes=MiB - 512)
    assert list(s) == sorted(s)
    assert all(isinstance(v, int) for v in s.values())
    for what in ("allocated_bytes", "requested_bytes"):
        assert (s[what + ".all.current"], s[what + ".all.peak"], s[what + ".all.allocated"],
                s[what + ".all.freed"]) == (300, 900, 1200, 900)
    assert (s["allocation.all.current"], s["allocation.all.peak"], s["allocation.all.allocated"],
            s["allocation.all.freed"]) == (1, 3, 4, 3)
    assert s["num_ooms"] == 2 and s["reserved_bytes.all.current"] == 2 * MiB
    assert s["reserved_bytes.all.peak"] == 3 * MiB
    assert s["gpumem.released_bytes"] == 4096 and s["gpumem.used_bytes"] == 512
    assert s["gpumem.limit_bytes"] == MiB and s["gpumem.limit_used_bytes"] == 512
    assert s["gpumem.available_bytes"] == MiB - 512
    assert s["gpumem.stats.total_count"] == 7 and s["gpumem.stats.peak_bytes"] == 1024
    assert "gpumem.maximum_bytes" not in s  # None: no budget
    # Figures gpumem does not have are absent, not zero.
    for key in ("num_alloc_retries", "allocated_bytes.large_pool.current"):
        assert key not in s
    bare = gtorch._memory_stats_from(counters, dict(reserved_bytes=None, peak_reserved_bytes=None, statistics=None))
    assert "reserved_bytes.all.current" not in bare and "reserved_bytes.all.peak" not in bare
    assert not any(k.startswith("gpumem.stats") for k in bare)


def test_figures_follow_allocations_and_frees(lib):
    gtorch.reset_accumulated_memory_stats(0)
    base = gtorch.memory_stats(0)
    cur, count = base["allocated_bytes.all.current"], base["allocation.all.current"]
    assert base["allocated_bytes.all.allocated"] == 0 and base["allocation.all.freed"] == 0
    ptrs = {size: alloc(lib, size) for size in (1000, 3000, 5000)}
    assert all(p and p % 256 == 0 for p in ptrs.values())
    lib.gpumem_torch_free(ptrs.pop(3000), 3000, 0, None)
    s = gtorch.memory_stats(0)
    assert s["allocated_bytes.all.current"] == cur + 6000
    assert s["allocated_bytes.all.peak"] >= cur + 9000
    assert s["allocated_bytes.all.allocated"] == 9000 and s["allocated_bytes.all.freed"] == 3000
    assert s["requested_bytes.all.current"] == s["allocated_bytes.all.current"]
    assert s["allocation.all.current"] == count + 2 and s["allocation.all.allocated"] == 3
    assert gtorch.memory_allocated(0) == cur + 6000
    assert gtorch.memory_allocated("cuda:0") == gtorch.memory_allocated() == cur + 6000  # device 0 is current
    assert gtorch.max_memory_allocated(0) == s["allocated_bytes.all.peak"]
    gtorch.reset_peak_memory_stats(0)
    assert gtorch.max_memory_allocated(0) == cur + 6000
    assert gtorch.memory_stats(0)["allocation.all.peak"] == count + 2
    for size, p in ptrs.items():
        lib.gpumem_torch_free(p, size, 0, None)
    s = gtorch.memory_stats(0)
    assert s["allocated_bytes.all.current"] == cur and s["allocated_bytes.all.peak"] == cur + 6000
    assert s["allocated_bytes.all.freed"] == 9000
    gtorch.reset_accumulated_memory_stats(0)
    s = gtorch.memory_stats(0)
    assert s["allocated_bytes.all.allocated"] == s["allocated_bytes.all.freed"] == 0
    assert s["allocation.all.allocated"] == 0 and s["num_ooms"] == 0


def test_a_device_torch_never_used_has_zero_figures():
    if gpumem.device_count() < 2:
        pytest.skip("needs two devices")
    s = gtorch.memory_stats(gpumem.device_count() - 1)
    assert s["allocated_bytes.all.current"] == s["allocated_bytes.all.peak"] == 0


def test_reserved_is_what_the_stack_holds(lib, current):
    pool = current(gpumem.PoolResource(gpumem.CudaResource(0)))
    p = alloc(lib, 5000)
    held = pool.statistics()["reserved_bytes"]
    assert held >= 5000
    s = gtorch.memory_stats(0)
    assert s["reserved_bytes.all.current"] == gtorch.memory_reserved(0) == held
    assert s["gpumem.used_bytes"] == pool.statistics()["used_bytes"] >= 5000
    assert s["gpumem.available_bytes"] > 0  # the device's free memory and the pool's
    lib.gpumem_torch_free(p, 5000, 0, None)


def test_a_statistics_adaptor_and_a_limit_in_the_stack_are_reported(lib, current):
    stats = gpumem.StatisticsAdaptor(gpumem.PoolResource(device=0))
    current(gpumem.LimitingAdaptor(stats, 64 * MiB))
    base = gtorch.memory_allocated(0)
    p = alloc(lib, 4096)
    other = gpumem.DeviceBuffer(1000)  # not PyTorch's: counted by the stack, not as allocated
    s = gtorch.memory_stats(0)
    assert s["allocated_bytes.all.current"] == base + 4096
    assert s["gpumem.stats.current_bytes"] == 5096 and s["gpumem.stats.total_count"] == 2
    assert s["gpumem.limit_bytes"] == 64 * MiB
    assert s["gpumem.limit_used_bytes"] == 4096 + 1024  # the limit counts 256-byte granules
    assert s["gpumem.available_bytes"] <= 64 * MiB - 5096
    del other
    lib.gpumem_torch_free(p, 4096, 0, None)


@pytest.mark.parametrize("make", [
    lambda: gpumem.PoolResource(gpumem.CudaResource(0), min_chunk_bytes=MiB),
    lambda: gpumem.VmmPoolResource(0),
], ids=["pool", "vmm_pool"])
def test_max_memory_reserved_is_the_pool_s_peak_until_reset(current, make):
    pool = current(make())
    assert gtorch.max_memory_reserved(0) == gtorch.memory_reserved(0) == 0
    big = gpumem.DeviceBuffer(8 * MiB, device=0)
    peak = gtorch.max_memory_reserved(0)
    assert peak == gtorch.memory_reserved(0) >= 8 * MiB
    big.close()
    pool.release()  # gives the memory back: the peak stays
    assert gtorch.memory_reserved(0) < peak and gtorch.max_memory_reserved(0) == peak
    assert gtorch.memory_stats(0)["reserved_bytes.all.peak"] == peak
    gtorch.reset_peak_memory_stats(0)
    assert gtorch.max_memory_reserved(0) == gtorch.memory_reserved(0)


def test_max_memory_reserved_is_unsupported_where_the_base_keeps_no_peak(current):
    current(gpumem.CudaResource(0))
    with pytest.raises(gpumem.UnsupportedError, match="max_memory_allocated") as e:
        gtorch.max_memory_reserved(0)
    assert isinstance(e.value, NotImplementedError)
    gtorch.reset_peak_memory_stats(0)  # nothing to reset there, and no error


def test_devices_as_torch_names_them(fake_torch):
    assert gtorch._device_index(None) == gpumem.current_device()  # PyTorch has not initialised CUDA
    assert gtorch._device_index(3) == 3 and gtorch._device_index("cuda:2") == 2
    assert gtorch._device_index("cuda") == gpumem.current_device()
    assert gtorch._device_index(types.SimpleNamespace(type="cuda", index=1)) == 1
    fake_torch.cuda.is_initialized = lambda: True
    fake_torch.cuda.current_device = lambda: 5
    assert gtorch._device_index(None) == 5 and gtorch._device_index("cuda") == 5
    for bad in ("cpu", types.SimpleNamespace(type="cpu", index=None)):
        with pytest.raises(ValueError, match="not a CUDA device"):
            gtorch._device_index(bad)


# ---- torch.cuda.empty_cache() -----------------------------------------------------


def test_empty_cache_gives_the_pools_free_memory_back(lib, current):
    pool = current(gpumem.PoolResource(gpumem.CudaResource(0)))
    released_before = gtorch.memory_stats(0)["gpumem.released_bytes"]
    p = alloc(lib, 8 * MiB)
    lib.gpumem_torch_free(p, 8 * MiB, 0, None)
    held = pool.statistics()["reserved_bytes"]
    assert held >= 8 * MiB
    lib.gpumem_torch_empty_cache()  # what torch.cuda.empty_cache() calls
    assert pool.statistics()["reserved_bytes"] == 0
    s = gtorch.memory_stats(0)
    assert s["reserved_bytes.all.current"] == 0
    assert s["gpumem.released_bytes"] >= released_before + held


def test_empty_cache_reaches_an_earlier_resource_that_holds_torch_memory(lib, current):
    earlier = current(gpumem.PoolResource(gpumem.CudaResource(0)))
    kept = alloc(lib, 4096)  # in the first chunk, held across the switch
    gpumem.DeviceBuffer(8 * MiB, resource=earlier).close()  # a second chunk, now all free
    before = earlier.statistics()["reserved_bytes"]
    current(gpumem.PoolResource(gpumem.CudaResource(0)))
    lib.gpumem_torch_empty_cache()
    after = earlier.statistics()
    assert after["reserved_bytes"] < before and after["reserved_bytes"] >= 4096
    assert after["allocations"] == 1
    lib.gpumem_torch_free(kept, 4096, 0, None)  # goes back to `earlier`
    assert earlier.statistics()["allocations"] == 0


def test_use_gpumem_for_torch_connects_empty_cache(monkeypatch, lib):
    calls = {}

    class Inner:
        def set_reset_fn(self, address):
            calls["reset_fn"] = address

    class PluggableAllocator:
        def __init__(self, path, alloc_name, free_name):
            calls["args"] = (path, alloc_name, free_name)

        def allocator(self):
            return Inner()

    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(memory=types.SimpleNamespace(
        CUDAPluggableAllocator=PluggableAllocator,
        change_current_allocator=lambda a: calls.setdefault("installed", a)))
    monkeypatch.setitem(sys.modules, "torch", torch)
    allocator = gtorch.use_gpumem_for_torch()
    assert calls["installed"] is allocator
    assert calls["args"] == (gtorch.library_path(), gtorch.ALLOC_SYMBOL, gtorch.FREE_SYMBOL)
    assert calls["reset_fn"] == ctypes.cast(lib.gpumem_torch_empty_cache, ctypes.c_void_p).value


# ---- out of memory ----------------------------------------------------------------


def test_an_out_of_memory_is_recorded_with_its_figures(lib, current):
    current(gpumem.LimitingAdaptor(gpumem.PoolResource(device=0), MiB))
    ooms = gtorch.memory_stats(0)["num_ooms"]
    live = lib.gpumem_torch_live_allocations()
    assert alloc(lib, 2 * MiB) == 1
    assert lib.gpumem_torch_live_allocations() == live
    assert gtorch.memory_stats(0)["num_ooms"] == ooms + 1
    e = gtorch.last_out_of_memory()
    assert isinstance(e, gpumem.OutOfMemoryError) and isinstance(e, MemoryError)
    assert str(e).startswith("gpumem: out of memory:") and "2097152 bytes" in str(e)
    assert e.requested_bytes == 2 * MiB and e.device == 0
    assert e.resource and e.reason and e.resource in str(e) and e.reason in str(e)
    assert str(gtorch.last_out_of_memory(any_thread=True)) == str(e)
    assert alloc(lib, 3 * MiB) == 1
    assert gtorch.last_out_of_memory().requested_bytes == 3 * MiB  # the latest replaces it


def test_out_of_memory_records_are_per_thread_and_for_the_process(lib, current):
    current(gpumem.LimitingAdaptor(gpumem.PoolResource(device=0), MiB))
    assert alloc(lib, 2 * MiB) == 1
    seen = {}

    def worker():
        seen["before"] = gtorch.last_out_of_memory()
        seen["process"] = gtorch.last_out_of_memory(any_thread=True)
        seen["rc"] = alloc(lib, 5 * MiB)
        seen["after"] = gtorch.last_out_of_memory()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen["before"] is None  # a new thread has had no out-of-memory
    assert seen["process"].requested_bytes == 2 * MiB
    assert seen["rc"] == 1 and seen["after"].requested_bytes == 5 * MiB
    assert gtorch.last_out_of_memory().requested_bytes == 2 * MiB  # this thread's own
    assert gtorch.last_out_of_memory(any_thread=True).requested_bytes == 5 * MiB


def test_translate_out_of_memory_raises_torchs_type(lib, current, fake_torch):
    current(gpumem.LimitingAdaptor(gpumem.PoolResource(device=0), MiB))
    assert alloc(lib, 2 * MiB) == 1
    text = str(gtorch.last_out_of_memory())
    with pytest.raises(fake_torch.OutOfMemoryError) as caught:
        with gtorch.translate_out_of_memory():
            raise RuntimeError(text)  # what PyTorch raises for the hook's error
    e = caught.value
    assert str(e) == text and isinstance(e, RuntimeError)
    assert isinstance(e.__cause__, RuntimeError) and not isinstance(e.__cause__, fake_torch.OutOfMemoryError)
    assert e.gpumem_error.requested_bytes == 2 * MiB and e.gpumem_error.device == 0

    @gtorch.translate_out_of_memory()
    def step():
        raise RuntimeError("CUDA call failed lately\n" + text)  # PyTorch may add context

    with pytest.raises(fake_torch.OutOfMemoryError) as caught:
        step()
    assert caught.value.gpumem_error.requested_bytes == 2 * MiB


def test_translate_out_of_memory_leaves_other_errors_alone(fake_torch):
    own = fake_torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    for exc in (RuntimeError("shape mismatch"), ValueError("gpumem: out of memory: not a RuntimeError"), own):
        with pytest.raises(type(exc)) as caught:
            with gtorch.translate_out_of_memory():
                raise exc
        assert caught.value is exc
    with gtorch.translate_out_of_memory():
        pass


def test_translate_finds_an_out_of_memory_of_another_thread(lib, current, fake_torch):
    # The autograd engine allocates the backward pass on its own threads and rethrows
    # the error on the caller's.
    current(gpumem.LimitingAdaptor(gpumem.PoolResource(device=0), MiB))
    t = threading.Thread(target=lambda: alloc(lib, 7 * MiB))
    t.start()
    t.join()
    text = str(gtorch.last_out_of_memory(any_thread=True))
    with pytest.raises(fake_torch.OutOfMemoryError) as caught:
        with gtorch.translate_out_of_memory():
            raise RuntimeError(text)
    assert caught.value.gpumem_error.requested_bytes == 7 * MiB
    # gpumem's text without a record (an error of another process, say): translated, no figures.
    with pytest.raises(fake_torch.OutOfMemoryError) as caught:
        with gtorch.translate_out_of_memory():
            raise RuntimeError("gpumem: out of memory: pool_resource could not allocate 1 bytes")
    assert caught.value.gpumem_error is None


# ---- docs/python-frameworks.md, "PyTorch" -------------------------------------------


def pytorch_blocks():
    text = open(os.path.join(ROOT, "docs", "python-frameworks.md"), encoding="utf-8").read()
    start = text.index("\n## PyTorch\n")
    end = text.find("\n## ", start + 1)
    return re.findall(r"```python\n(.*?)```", text[start:end], flags=re.S)


BLOCKS = pytorch_blocks()


def test_the_pytorch_section_has_examples():
    assert len(BLOCKS) >= 2
    assert any(not needs_torch(b) for b in BLOCKS)  # one runs everywhere


def needs_torch(block):
    return "import torch" in block or "use_gpumem_for_torch" in block


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_pytorch_example_runs(index, tmp_path):
    if needs_torch(BLOCKS[index]):
        need_cuda_torch()
    code = "import os\nos.chdir(%r)\n" % str(tmp_path) + BLOCKS[index]
    done = run_python(code, timeout=300)
    assert done.returncode == 0, "example %d:\n%s\n%s%s" % (index + 1, BLOCKS[index], done.stdout, done.stderr)


# ---- with PyTorch, on a GPU ---------------------------------------------------------

def test_torch_tensors_are_counted(tmp_path):
    run_torch(tmp_path, """
        base = gt.memory_allocated()
        x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        assert gt.memory_allocated() == base + (1 << 20), gt.memory_stats()
        assert gt.memory_allocated(torch.device("cuda", 0)) == gt.memory_allocated("cuda:0")
        y = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
        del y
        s = gt.memory_stats()
        assert s["allocated_bytes.all.current"] == base + (1 << 20)
        assert s["allocated_bytes.all.peak"] >= base + (4 << 20)
        assert s["reserved_bytes.all.current"] == gpumem.stack_report(0)["reserved_bytes"] >= 1 << 20
        gt.reset_peak_memory_stats()
        assert gt.max_memory_allocated() == gt.memory_allocated()
        del x
        assert gt.memory_allocated() == base
        try:
            torch.cuda.memory_stats()
        except Exception as e:
            print("torch.cuda.memory_stats still refuses a pluggable allocator:", e)
    """)


def test_torch_empty_cache_releases_gpumem_pool_memory(tmp_path):
    run_torch(tmp_path, """
        x = torch.ones(1 << 20, device="cuda")
        big = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        del big
        torch.cuda.synchronize()
        before = gt.memory_stats()
        torch.cuda.empty_cache()
        after = gt.memory_stats()
        # whole free pages go back: all of the 256 MiB but a page it may share with `x`
        assert after["gpumem.released_bytes"] >= before["gpumem.released_bytes"] + (240 << 20), (before, after)
        assert after["reserved_bytes.all.current"] <= before["reserved_bytes.all.current"] - (240 << 20)
        assert float(x.sum()) == float(1 << 20)  # what PyTorch still holds is untouched
    """)


def test_torch_out_of_memory_carries_gpumems_explanation(tmp_path):
    out = run_torch(tmp_path, """
        limit = gpumem.LimitingAdaptor(gpumem.get_current_resource(0), 64 << 20)
        gpumem.set_current_resource(limit, 0)
        try:
            torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
        except RuntimeError as e:
            assert "gpumem: out of memory" in str(e), repr(e)
            print("PyTorch raised", type(e).__module__ + "." + type(e).__qualname__)
        else:
            raise AssertionError("no error")
        assert gt.last_out_of_memory().requested_bytes == 128 << 20
        try:
            with gt.translate_out_of_memory():
                torch.zeros(96 << 20, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError as e:
            assert e.gpumem_error.requested_bytes == 96 << 20 and e.gpumem_error.device == 0
            assert "gpumem: out of memory" in str(e)
        else:
            raise AssertionError("no error")
        assert gt.memory_stats()["num_ooms"] == 2
        small = torch.ones(1 << 20, device="cuda")  # the allocator still works
        assert float(small.sum()) == float(1 << 20)
    """)
    assert "PyTorch raised" in out
