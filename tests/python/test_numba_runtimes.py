"""gpumem.numba under both Numba CUDA runtimes: numba-cuda (numba.cuda) and Numba CUDA MLIR
(numba_cuda_mlir.cuda, PyPI numba-cuda-mlir), on the simulator with a stand-in context.

Numba CUDA MLIR imports without a GPU, so where it is installed the plugin is tested against
its real classes; where it is not, those tests are skipped and the runtime selection is still
checked against a fake runtime package laid out as numba-cuda-mlir is.
"""

import gc
import importlib.util
import os
import textwrap

import pytest

try:
    import numpy as np
except ImportError:  # the environment without numba: only the selection tests run there
    np = None

import gpumem
from conftest import StandInContext, run_python

RUNTIMES = ["numba.cuda", "numba_cuda_mlir.cuda"]
MLIR_MISSING = "numba-cuda-mlir is not installed (pip install numba-cuda-mlir)"


def _has(module):
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


needs_mlir = pytest.mark.skipif(not _has("numba_cuda_mlir"), reason=MLIR_MISSING)
needs_numba_cuda = pytest.mark.skipif(not _has("numba_cuda"), reason="numba-cuda is not installed")


@pytest.fixture(params=RUNTIMES)
def runtime(request):
    reason = MLIR_MISSING if request.param.startswith("numba_cuda_mlir") else "numba-cuda is not installed"
    return pytest.importorskip(request.param, reason=reason)


@pytest.fixture
def gnumba():
    return pytest.importorskip("gpumem.numba")


@pytest.fixture
def manager(runtime, gnumba, fresh_pool):
    context = StandInContext()
    m = gnumba.manager_class(runtime)(context=context)
    m.context_keepalive = context  # the runtime's context outlives its manager
    m.initialize()
    yield m
    m.reset()


def host_resource(gnumba, kind, *options):
    return gnumba._host_resources[(0, kind) + options]


# ---- the class each runtime gets ------------------------------------------------


def test_each_runtime_gets_a_class_of_its_own(runtime, gnumba):
    cls = gnumba.manager_class(runtime)
    assert issubclass(cls, runtime.HostOnlyCUDAMemoryManager)
    assert cls is gnumba.manager_class(runtime)  # built once
    assert (cls.__module__, cls.__name__) == ("gpumem.numba", "GpumemNumbaManager")
    assert cls(context=None).interface_version == 1


def test_memalloc_returns_the_runtime_s_pointer_from_the_pool(manager, runtime, fresh_pool):
    mem = manager.memalloc(3000)
    assert type(mem) is runtime.MemoryPointer and mem.is_managed
    assert type(mem._finalizer).__name__ == "NumbaAllocation"  # Note [Numba allocations in C++]
    assert fresh_pool.statistics()["allocations"] == 1
    assert isinstance(manager.get_memory_info(), runtime.MemoryInfo)
    del mem
    gc.collect()
    assert fresh_pool.statistics()["allocations"] == 0


def test_a_module_that_is_no_runtime_is_refused(gnumba):
    with pytest.raises(TypeError, match="not a Numba CUDA runtime"):
        gnumba.manager_class(textwrap)


# ---- pinned, mapped and managed memory through gpumem ---------------------------


def test_pinned_memory_comes_from_a_pinned_host_resource(manager, runtime, gnumba):
    driver = runtime.cudadrv.driver
    mem = manager.memhostalloc(4096)
    assert type(mem) is driver.PinnedMemory
    resource = host_resource(gnumba, "pinned", False, False, False)
    assert isinstance(resource, gpumem.PinnedHostResource) and not resource.device_mapped
    assert resource.allocation_count == 1 and resource.allocated_bytes == 4096
    array = np.ndarray(512, dtype=np.float64, buffer=mem)  # what pinned_array builds
    array[:] = 2.5
    assert array.sum() == 1280.0
    del array, mem
    gc.collect()
    assert resource.allocation_count == 0


def test_pinned_flags_reach_the_resource(manager, gnumba):
    mem = manager.memhostalloc(100, mapped=False, portable=True, wc=True)
    resource = host_resource(gnumba, "pinned", False, True, True)
    assert resource.portable and resource.write_combined and not resource.device_mapped
    assert resource.allocation_count == 1
    del mem


def test_mapped_memory_has_gpumem_s_device_address(manager, runtime, gnumba):
    mem = manager.memhostalloc(8192, mapped=True)
    assert isinstance(mem, runtime.cudadrv.driver.MappedOwnedPointer)
    resource = host_resource(gnumba, "pinned", True, False, False)
    assert resource.device_mapped and resource.allocation_count == 1
    assert int(mem.device_pointer) == resource.device_pointer(mem.host_pointer)
    host = np.ndarray(1024, dtype=np.float64, buffer=mem)  # what mapped_array builds
    host[:] = 1.0
    assert host.sum() == 1024.0
    del host, mem
    gc.collect()
    assert resource.allocation_count == 0


def test_managed_memory_comes_from_a_managed_resource(manager, runtime, gnumba):
    mem = manager.memallocmanaged(800, attach_global=False)
    assert isinstance(mem, runtime.cudadrv.driver.ManagedOwnedPointer)
    resource = host_resource(gnumba, "managed", False)
    assert resource.attach == "host" and resource.allocation_count == 1
    values = np.ndarray(100, dtype=np.float64, buffer=mem)  # what managed_array builds
    values[:] = 3.0
    assert values.sum() == 300.0
    assert int(mem.device_pointer) == values.ctypes.data
    del values, mem
    gc.collect()
    assert resource.allocation_count == 0
    kept = manager.memallocmanaged(64, attach_global=True)
    assert host_resource(gnumba, "managed", True).attach == "global"
    del kept


def test_mempin_registers_exactly_the_range_until_dropped(manager, runtime):
    data = np.zeros(1000)
    part = data[100:300]
    pin = manager.mempin(part, part.ctypes.data, part.nbytes)
    assert type(pin) is runtime.cudadrv.driver.PinnedMemory and pin.owned is part
    with pytest.raises(gpumem.LogicError, match="already registered"):
        gpumem.HostRegistration(part)  # the range is page-locked now
    gpumem.HostRegistration(data[400:]).close()  # the rest of the array is not
    del pin
    gc.collect()
    gpumem.HostRegistration(part).close()  # unpinned at once, not deferred


def test_mapped_pin_gives_the_registration_s_device_address(manager, runtime):
    data = np.arange(64, dtype=np.float64)
    pin = manager.mempin(data, data.ctypes.data, data.nbytes, mapped=True)
    assert isinstance(pin, runtime.cudadrv.driver.MappedOwnedPointer)
    assert pin.host_pointer == data.ctypes.data
    # With unified addressing the device address of registered memory is its host address.
    assert int(pin.device_pointer) == data.ctypes.data
    with pytest.raises(gpumem.LogicError, match="already registered"):
        gpumem.HostRegistration(data)
    del pin
    gc.collect()
    gpumem.HostRegistration(data).close()


def test_zero_bytes_allocate_and_pin_nothing(manager, gnumba):
    empty = np.zeros(0)
    mapped = manager.memhostalloc(0, mapped=True)
    assert int(mapped.device_pointer) == 0
    assert manager.mempin(empty, empty.ctypes.data, 0).size == 0
    assert manager.memallocmanaged(0, True).size == 0
    assert host_resource(gnumba, "pinned", True, False, False).allocation_count == 0


def test_defer_cleanup_holds_pinned_and_managed_frees(manager, gnumba):
    with manager.defer_cleanup():
        pinned = manager.memhostalloc(100)
        managed = manager.memallocmanaged(100, True)
        del pinned, managed
        gc.collect()
        assert host_resource(gnumba, "pinned", False, False, False).allocation_count == 1
        assert host_resource(gnumba, "managed", True).allocation_count == 1
    assert host_resource(gnumba, "pinned", False, False, False).allocation_count == 0
    assert host_resource(gnumba, "managed", True).allocation_count == 0


def test_reset_frees_mapped_and_managed_memory_and_remakes_the_resources(manager, gnumba):
    pinned = manager.memhostalloc(100)
    mapped = manager.memhostalloc(100, mapped=True)
    managed = manager.memallocmanaged(100, True)
    keys = [("pinned", False, False, False), ("pinned", True, False, False), ("managed", True)]
    resources = [host_resource(gnumba, *key) for key in keys]
    manager.reset()
    # Unmapped pinned memory stays with the array that holds it, as with Numba's own manager.
    assert [r.allocation_count for r in resources] == [1, 0, 0]
    assert not any(k[0] == 0 for k in gnumba._host_resources)
    again = manager.memhostalloc(100, mapped=True)
    assert host_resource(gnumba, "pinned", True, False, False) is not resources[1]
    del pinned, mapped, managed, again
    gc.collect()
    assert resources[0].allocation_count == 0


# ---- selecting the runtime -----------------------------------------------------

MLIR_FIRST = """
import sys
import gpumem.numba
from numba_cuda_mlir.numba_cuda.cudadrv import driver
driver._ensure_memory_manager()
cls = driver._memory_manager
print(cls.__module__, cls.__name__, cls._runtime.name, issubclass(cls, driver.HostOnlyCUDAMemoryManager))
print("numba.cuda imported:", "numba.cuda" in sys.modules)
"""


@needs_mlir
def test_the_environment_variable_selects_the_plugin_for_numba_cuda_mlir():
    p = run_python(MLIR_FIRST, env={"NUMBA_CUDA_MEMORY_MANAGER": "gpumem.numba"})
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [
        "gpumem.numba GpumemNumbaManager numba-cuda-mlir True",
        "numba.cuda imported: False",
    ]


@needs_mlir
def test_use_gpumem_for_numba_with_the_mlir_module():
    p = run_python(
        textwrap.dedent(
            """
            from numba_cuda_mlir import cuda
            from numba_cuda_mlir.numba_cuda.cudadrv import driver
            import gpumem.numba
            gpumem.numba.use_gpumem_for_numba(cuda)
            print(driver._memory_manager is gpumem.numba.manager_class(cuda))
            gpumem.numba.use_gpumem_for_numba()  # the runtime imported
            print(driver._memory_manager is gpumem.numba.GpumemNumbaManager)
            """
        )
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["True", "True"]


@needs_mlir
@needs_numba_cuda
def test_with_both_runtimes_loaded_each_driver_gets_its_own_class():
    p = run_python(
        MLIR_FIRST
        + textwrap.dedent(
            """
            from numba.cuda.cudadrv import driver as numba_driver
            numba_driver._ensure_memory_manager()
            ncls = numba_driver._memory_manager
            print(ncls._runtime.name, issubclass(ncls, numba_driver.HostOnlyCUDAMemoryManager),
                  issubclass(cls, numba_driver.HostOnlyCUDAMemoryManager))
            print(gpumem.numba.GpumemNumbaManager is ncls)  # both imported: numba-cuda
            """
        ),
        env={"NUMBA_CUDA_MEMORY_MANAGER": "gpumem.numba"},
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[2:] == ["numba-cuda True False", "True"]


@needs_mlir
@pytest.mark.sim_only
def test_ipc_handle_on_the_simulator_is_the_mlir_runtime_s(gnumba, fresh_pool):
    import pickle

    from numba_cuda_mlir import cuda

    m = gnumba.manager_class(cuda)(context=StandInContext())
    mem = m.memalloc(4096)
    handle = m.get_ipc_handle(mem)
    assert isinstance(handle, cuda.IpcHandle) and handle.size == 4096
    again = pickle.loads(pickle.dumps(handle))
    assert type(again) is type(handle) and again.base is None
    assert again.handle.reserved == handle.handle.reserved


# A fake runtime package laid out as numba-cuda-mlir is: what the selection reads.
FAKE_DRIVER = '''
import contextlib, weakref
from collections import namedtuple

MemoryInfo = namedtuple("MemoryInfo", "free,total")
_memory_manager = None

class Context:
    pass

class HostOnlyCUDAMemoryManager:
    def __init__(self, *args, **kwargs):
        self.context = kwargs.pop("context")
        self.allocations = {}
    def reset(self):
        self.allocations.clear()
    @contextlib.contextmanager
    def defer_cleanup(self):
        yield

class MemoryPointer:
    def __init__(self, context, pointer, size, owner=None, finalizer=None):
        self.device_pointer, self.size = pointer, size
        if finalizer is not None:
            weakref.finalize(self, finalizer)

AutoFreePointer = MappedMemory = ManagedMemory = PinnedMemory = MemoryPointer

class IpcHandle:
    pass

def set_memory_manager(cls):
    global _memory_manager
    assert cls(context=None).interface_version == 1
    _memory_manager = cls

def ensure_memory_manager():  # as the driver reads NUMBA_CUDA_MEMORY_MANAGER's module
    import importlib
    set_memory_manager(importlib.import_module("gpumem.numba")._numba_memory_manager)
'''


@pytest.fixture
def fake_mlir(tmp_path):
    if not _has("cuda.bindings"):
        pytest.skip("needs cuda-bindings, which both runtimes depend on")
    files = {
        "numba_cuda_mlir/__init__.py": "",
        "numba_cuda_mlir/numba_cuda/__init__.py": "",
        "numba_cuda_mlir/numba_cuda/cudadrv/__init__.py": "",
        "numba_cuda_mlir/numba_cuda/cudadrv/driver.py": FAKE_DRIVER,
        "numba_cuda_mlir/cuda/__init__.py": "from numba_cuda_mlir.numba_cuda.cudadrv.driver import *\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}


def test_the_runtime_that_reads_the_plugin_gets_its_class_without_importing_numba(fake_mlir):
    p = run_python(
        textwrap.dedent(
            """
            import sys
            import gpumem.numba
            from numba_cuda_mlir.numba_cuda.cudadrv import driver
            driver.ensure_memory_manager()
            cls = driver._memory_manager
            print(cls._runtime.name, issubclass(cls, driver.HostOnlyCUDAMemoryManager))

            class Device:
                id = 0
            class Context:
                device = Device()
            context = Context()
            mem = cls(context=context).memalloc(1000)
            print(type(mem) is driver.MemoryPointer, int(mem.device_pointer) != 0)
            print(sorted(m for m in sys.modules if m == "numba" or m.startswith("numba.")))
            """
        ),
        env=fake_mlir,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["numba-cuda-mlir True", "True True", "[]"]


def test_an_imported_runtime_wins_over_an_installed_one(fake_mlir):
    p = run_python(
        "import sys, numba_cuda_mlir.cuda, gpumem.numba\n"
        "gpumem.numba.use_gpumem_for_numba()\n"
        "from numba_cuda_mlir.numba_cuda.cudadrv import driver\n"
        "print(driver._memory_manager._runtime.name, 'numba.cuda' in sys.modules)\n",
        env=fake_mlir,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["numba-cuda-mlir", "False"]


@needs_numba_cuda
def test_with_nothing_imported_installed_numba_cuda_comes_first(fake_mlir):
    p = run_python(
        "import sys, gpumem.numba\n"
        "print(gpumem.numba.GpumemNumbaManager._runtime.name, 'numba_cuda_mlir' in sys.modules)\n",
        env=fake_mlir,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["numba-cuda", "False"]


def test_without_any_runtime_the_import_says_what_is_missing():
    if _has("numba") or _has("numba_cuda") or _has("numba_cuda_mlir"):
        pytest.skip("a Numba CUDA runtime is installed here")
    p = run_python("import gpumem.numba")
    assert p.returncode != 0
    assert "ModuleNotFoundError: gpumem.numba needs a Numba CUDA runtime" in p.stderr
    assert "numba-cuda-mlir" in p.stderr
