"""gpumem.numba, the NBEP 7 plugin, against numba-cuda with a stand-in context (no GPU).

Numba builds a plugin per context and calls it with that context; here a small
stand-in context plays Numba's part so the plugin's own behaviour is checked on
the simulator. tests/python/test_gpu_interop.py runs it under Numba on a GPU.
"""

import gc
import textwrap

import pytest

import gpumem
from conftest import StandInContext, run_python

cuda = pytest.importorskip("numba.cuda")
gnumba = pytest.importorskip("gpumem.numba")


@pytest.fixture
def manager(fresh_pool):
    context = StandInContext()
    m = gnumba.GpumemNumbaManager(context=context)
    m.context_keepalive = context  # Numba's context outlives its manager
    m.initialize()
    return m


def live(pool):
    return pool.statistics()["allocations"]


def test_a_context_attached_from_a_third_party_carries_a_driver_device(fresh_pool):
    # Numba attaches to a context someone else made current (Test3rdPartyContext);
    # its .device is then the driver's CUdevice, which has no .id.
    from cuda.bindings import driver

    context = StandInContext()
    context.device = driver.CUdevice(0)
    m = gnumba.GpumemNumbaManager(context=context)
    m.initialize()
    mem = m.memalloc(512)
    assert mem.size == 512 and live(fresh_pool) == 1
    del mem
    gc.collect()
    assert live(fresh_pool) == 0


def test_is_a_host_only_manager_of_interface_version_1():
    assert issubclass(gnumba.GpumemNumbaManager, cuda.HostOnlyCUDAMemoryManager)
    assert gnumba._numba_memory_manager is gnumba.GpumemNumbaManager
    # Numba builds one with context=None just to read the version: that must not fail.
    assert gnumba.GpumemNumbaManager(context=None).interface_version == 1


def test_memalloc_returns_a_memory_pointer_from_the_pool(manager, fresh_pool):
    mem = manager.memalloc(3000)
    assert isinstance(mem, cuda.MemoryPointer)
    assert mem.size == 3000
    from cuda.bindings import driver

    assert isinstance(mem.device_pointer, driver.CUdeviceptr)
    address = int(mem.device_pointer)
    assert address != 0 and address % 256 == 0
    assert mem.device_pointer_value == address
    assert live(fresh_pool) == 1
    assert fresh_pool.statistics()["used_bytes"] == 3072


def test_finalizer_frees_through_gpumem(manager, fresh_pool):
    mem = manager.memalloc(1 << 20)
    assert live(fresh_pool) == 1
    del mem
    gc.collect()
    assert live(fresh_pool) == 0


def test_the_last_reference_frees_at_once_without_a_collection(manager, fresh_pool):
    mem = manager.memalloc(1 << 20)
    del mem  # no gc.collect(): the pointer's __del__ runs as CPython drops it
    assert live(fresh_pool) == 0


def test_free_frees_once_and_then_refuses(manager, fresh_pool):
    mem = manager.memalloc(4096)
    view = mem.view(1024)  # a view keeps its owner, not the memory
    mem.free()
    assert live(fresh_pool) == 0
    with pytest.raises(RuntimeError, match="Freeing dead memory"):
        mem.free()
    del view, mem
    gc.collect()
    assert live(fresh_pool) == 0


def test_a_pointer_after_reset_frees_nothing_and_can_still_be_freed_once(manager, fresh_pool):
    mem = manager.memalloc(4096)
    manager.reset()
    assert live(fresh_pool) == 0
    allocation = mem._finalizer
    assert allocation.alive  # as a finalizer of Numba's own manager after its reset
    mem.free()  # frees nothing: reset() did
    assert not allocation.alive
    with pytest.raises(RuntimeError, match="Freeing dead memory"):
        mem.free()


def test_free_goes_to_the_allocating_resource(manager, fresh_pool):
    mem = manager.memalloc(4096)
    previous = gpumem.set_current_resource(gpumem.CudaResource(0), 0)
    try:
        del mem
        assert live(fresh_pool) == 0
    finally:
        gpumem.set_current_resource(previous, 0)


def test_views_keep_the_allocation(manager, fresh_pool):
    mem = manager.memalloc(8192)
    view = mem.view(4096)
    assert int(view.device_pointer) == int(mem.device_pointer) + 4096
    del mem
    gc.collect()
    assert live(fresh_pool) == 1
    del view
    gc.collect()
    assert live(fresh_pool) == 0


def test_zero_size_is_a_null_pointer_without_allocation(manager, fresh_pool):
    mem = manager.memalloc(0)
    assert mem.size == 0
    assert int(mem.device_pointer) == 0 and mem.device_pointer_value is None
    assert live(fresh_pool) == 0
    del mem


def test_out_of_memory_is_gpumem_s(manager):
    total = gpumem.device_memory_info(0)[1]
    with pytest.raises(gpumem.OutOfMemoryError):
        manager.memalloc(2 * total)


def test_initialize_is_idempotent_and_makes_the_resource(fresh_pool):
    m = gnumba.GpumemNumbaManager(context=StandInContext())
    m.initialize()
    m.initialize()
    mem = m.memalloc(100)
    assert live(fresh_pool) == 1
    del mem


def test_reset_frees_everything_even_before_initialize(fresh_pool):
    m = gnumba.GpumemNumbaManager(context=StandInContext())
    held = [m.memalloc(1000 * (k + 1)) for k in range(5)]
    assert live(fresh_pool) == 5
    m.reset()
    assert live(fresh_pool) == 0
    del held  # the finalizers of reset memory do nothing
    gc.collect()
    assert live(fresh_pool) == 0
    again = m.memalloc(1000)  # the manager stays usable
    assert live(fresh_pool) == 1
    del again


def test_reset_drops_the_default_resource_numba_s_device_reset_destroys():
    gpumem.set_current_resource(None, 0)  # device 0 back on gpumem's default
    default = gpumem.get_current_resource(0)
    m = gnumba.GpumemNumbaManager(context=StandInContext())
    held = m.memalloc(4096)
    m.reset()
    assert default.statistics()["allocations"] == 0
    fresh = gpumem.get_current_resource(0)
    assert fresh is not default and isinstance(fresh, gpumem.VmmPoolResource)
    del held
    again = m.memalloc(4096)  # from the new default
    assert fresh.statistics()["allocations"] == 1
    del again


def test_reset_keeps_a_resource_the_program_chose(fresh_pool):
    m = gnumba.GpumemNumbaManager(context=StandInContext())
    m.memalloc(4096)
    m.reset()
    assert gpumem.get_current_resource(0) is fresh_pool


def test_defer_cleanup_holds_frees_until_the_outermost_exit(manager, fresh_pool):
    with manager.defer_cleanup():
        a = manager.memalloc(1000)
        with manager.defer_cleanup():
            b = manager.memalloc(1000)
            del b
            gc.collect()
            assert live(fresh_pool) == 2
        del a
        gc.collect()
        assert live(fresh_pool) == 2, "frees are held while any defer_cleanup is active"
    assert live(fresh_pool) == 0


def test_defer_cleanup_defers_host_deallocations_too(manager):
    with manager.defer_cleanup():
        assert manager.deallocations.is_disabled
    assert not manager.deallocations.is_disabled


def test_reset_during_defer_cleanup_frees_the_held_memory(manager, fresh_pool):
    with manager.defer_cleanup():
        a = manager.memalloc(1000)
        del a
        gc.collect()
        assert live(fresh_pool) == 1
        manager.reset()
        assert live(fresh_pool) == 0
    assert live(fresh_pool) == 0


def test_get_memory_info(manager, fresh_pool):
    held = manager.memalloc(1 << 20)
    info = manager.get_memory_info()
    assert isinstance(info, cuda.MemoryInfo)
    assert (info.free, info.total) == gpumem.memory_info(0)
    del held


def test_get_memory_info_raises_not_implemented_where_the_resource_cannot_say(manager, monkeypatch):
    def cannot_say(device=None):
        raise gpumem.UnsupportedError("the current resource cannot say")

    monkeypatch.setattr(gpumem, "memory_info", cannot_say)
    with pytest.raises(NotImplementedError, match="cannot say"):
        manager.get_memory_info()


@pytest.mark.sim_only
def test_ipc_handle_on_the_simulator_is_gpumems(manager):
    import pickle

    from numba import cuda as ncuda

    mem = manager.memalloc(4096)
    handle = manager.get_ipc_handle(mem)
    assert isinstance(handle, ncuda.cudadrv.driver.IpcHandle)
    assert handle.size == 4096
    with pytest.raises(ValueError, match="original process"):
        handle.open(manager.context)
    again = pickle.loads(pickle.dumps(handle))
    assert type(again) is type(handle) and again.size == 4096 and again.base is None
    # Numba's own tests compare the handle bytes across pickling.
    assert isinstance(handle.handle.reserved, bytes) and again.handle.reserved == handle.handle.reserved


def test_second_device_context():
    if gpumem.device_count() < 2:
        pytest.skip("needs two devices")
    m = gnumba.GpumemNumbaManager(context=StandInContext(1))
    mem = m.memalloc(4096)
    assert gpumem.get_current_resource(1).statistics()["allocations"] >= 1
    del mem


def test_use_gpumem_for_numba_sets_numba_s_manager():
    p = run_python(
        textwrap.dedent(
            """
            from numba import cuda
            from numba.cuda.cudadrv import driver
            import gpumem.numba
            gpumem.numba.use_gpumem_for_numba()
            print(driver._memory_manager is gpumem.numba.GpumemNumbaManager)
            """
        )
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "True"


@pytest.mark.parametrize("gpumem_first", [True, False])
def test_environment_variable_selects_the_plugin(gpumem_first):
    imports = ["import gpumem.numba", "from numba.cuda.cudadrv import driver"]
    if not gpumem_first:
        imports.reverse()
    p = run_python(
        "\n".join(imports)
        + "\ndriver._ensure_memory_manager()\n"
        "print(driver._memory_manager.__module__, driver._memory_manager.__name__)\n",
        env={"NUMBA_CUDA_MEMORY_MANAGER": "gpumem.numba"},
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["gpumem.numba", "GpumemNumbaManager"]


def test_environment_variable_check_is_real():
    # The same machinery refuses a module without _numba_memory_manager.
    p = run_python(
        "from numba.cuda.cudadrv import driver\n"
        "try:\n"
        "    driver._ensure_memory_manager()\n"
        "except RuntimeError as e:\n"
        "    print('refused')\n",
        env={"NUMBA_CUDA_MEMORY_MANAGER": "gpumem"},
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "refused"


def test_finalizers_at_interpreter_exit_are_harmless():
    p = run_python(
        textwrap.dedent(
            """
            import gpumem, gpumem.numba

            class Device:
                id = 0
            class Context:
                device = Device()

            context = Context()
            manager = gpumem.numba.GpumemNumbaManager(context=context)
            kept = [manager.memalloc(1 << k) for k in range(4, 20)]  # alive at exit
            deferred = manager.defer_cleanup()
            deferred.__enter__()  # never left: the held frees meet the exit too
            gone = manager.memalloc(4096)
            del gone
            print("exiting")
            """
        )
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "exiting"
    assert p.stderr == ""
