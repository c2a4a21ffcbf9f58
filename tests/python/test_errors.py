"""Every C++ failure reaches Python as one of gpumem's typed exceptions."""

import pytest

import gpumem
from conftest import BACKEND, run_python


def test_hierarchy():
    assert issubclass(gpumem.OutOfMemoryError, MemoryError)
    assert issubclass(gpumem.CudaError, RuntimeError)
    assert issubclass(gpumem.DriverUnavailableError, gpumem.CudaError)
    assert issubclass(gpumem.LogicError, ValueError)
    assert issubclass(gpumem.UnsupportedError, NotImplementedError)
    for t in (gpumem.OutOfMemoryError, gpumem.CudaError, gpumem.LogicError, gpumem.UnsupportedError):
        assert issubclass(t, gpumem.GpumemError)
        assert t.__module__ == "gpumem"


def test_out_of_memory_carries_the_details(pool):
    total = gpumem.device_memory_info(0)[1]
    with pytest.raises(gpumem.OutOfMemoryError) as info:
        gpumem.DeviceBuffer(total * 4)
    e = info.value
    assert e.requested_bytes == total * 4
    assert e.device == 0
    # The default: a vmm_pool_resource where the device has virtual memory management.
    assert e.resource == ("vmm_pool_resource" if isinstance(pool, gpumem.VmmPoolResource) else "pool_resource")
    assert e.device_total_bytes == total
    assert "out of memory" in str(e)
    # The pool is still usable.
    assert gpumem.DeviceBuffer(1024).ptr != 0


def test_impossible_size_is_out_of_memory_before_any_resource():
    r = gpumem.CudaResource(0)
    with pytest.raises(gpumem.OutOfMemoryError) as info:
        r.allocate(2**63)
    assert "larger than any device" in str(info.value)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda r: r.allocate(0), "0 bytes requested"),
        (lambda r: r.allocate(256, None, 3), "not a power of two"),
        (lambda r: r.deallocate(0, 256), "null pointer"),
        (lambda r: r.deallocate(0x1000, 256), "was not allocated by this"),
    ],
)
def test_misuse_is_logic_error(pool, call, message):
    with pytest.raises(gpumem.LogicError, match=message):
        call(pool)


def test_double_free_and_wrong_size_are_logic_errors(pool):
    p = pool.allocate(1000)
    with pytest.raises(gpumem.LogicError, match="has 1000 bytes, not 999"):
        pool.deallocate(p, 999)
    pool.deallocate(p, 1000)
    with pytest.raises(gpumem.LogicError):
        pool.deallocate(p, 1000)


def test_bad_device_is_logic_error():
    with pytest.raises(gpumem.LogicError, match="does not exist"):
        gpumem.DeviceBuffer(16, device=gpumem.device_count())
    with pytest.raises(gpumem.LogicError, match="does not exist"):
        gpumem.CudaResource(-5)


def test_bad_backend_name_is_logic_error():
    with pytest.raises(gpumem.LogicError, match="not a backend choice"):
        gpumem.select_backend("opencl")


def test_switching_backend_in_use_is_logic_error():
    other = "cuda" if BACKEND == "sim" else "sim"
    with pytest.raises(gpumem.LogicError, match="already in use"):
        gpumem.select_backend(other)
    assert gpumem.current_backend() == BACKEND


def test_missing_driver_is_driver_unavailable():
    if gpumem.cuda_driver_usable():
        pytest.skip("a CUDA driver is usable here")
    p = run_python(
        "import gpumem\n"
        "try:\n"
        "    gpumem.DeviceBuffer(16)\n"
        "except gpumem.DriverUnavailableError as e:\n"
        "    print(type(e).__name__, isinstance(e, gpumem.CudaError), e.api)\n",
        env={"GPUMEM_BACKEND": "cuda"},
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["DriverUnavailableError", "True", "gpumem", "backend", "cuda"]


@pytest.mark.sim_only
def test_driver_failure_is_cuda_error_with_result():
    b = gpumem.DeviceBuffer(64)
    # The simulator reports a destroyed stream as the driver would (on a GPU that is undefined).
    s = gpumem.Stream()
    destroyed = s.handle
    del s
    with pytest.raises(gpumem.CudaError) as info:
        gpumem.DeviceBuffer(64, destroyed)
    e = info.value
    assert e.result != 0
    assert e.error_name.startswith("CUDA_ERROR_")
    assert e.api
    assert b.ptr != 0
