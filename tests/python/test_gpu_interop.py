"""On a GPU: Numba, CuPy and PyTorch allocating through gpumem, and IPC of a sub-allocation.

Each check runs in its own interpreter, because Numba's memory manager and PyTorch's
allocator are chosen once per process. Skipped without a GPU or without the framework.
"""

import importlib.util
import textwrap

import pytest

from conftest import run_python

pytestmark = pytest.mark.gpu_only


def need(*modules):
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip("needs " + ", ".join(missing))


# numba-cuda 0.30.4 still refers to numpy.row_stack, which numpy 2.5 removed: its
# kernel compiler fails to import there. That is between Numba and NumPy, not what
# these checks are about, so each script restores the alias before importing Numba.
NUMPY_COMPAT = """
import numpy
if not hasattr(numpy, "row_stack"):
    numpy.row_stack = numpy.vstack
"""


def run_script(tmp_path, source, timeout=300):
    script = tmp_path / "check.py"
    script.write_text(NUMPY_COMPAT + textwrap.dedent(source))
    p = run_python("import runpy; runpy.run_path(%r, run_name='__main__')" % str(script), timeout=timeout)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_numba_arrays_come_from_the_gpumem_pool(tmp_path):
    need("numba.cuda", "numpy")
    out = run_script(
        tmp_path,
        """
        import gc
        import numpy as np
        from numba import cuda
        import gpumem, gpumem.numba

        gpumem.numba.use_gpumem_for_numba()
        pool = gpumem.get_current_resource(0)

        @cuda.jit
        def fill(a, v):
            i = cuda.grid(1)
            if i < a.size:
                a[i] = v + i

        before = pool.statistics()["allocations"]
        d = cuda.device_array(100000, dtype=np.int32)
        assert isinstance(cuda.current_context().memory_manager, gpumem.numba.GpumemNumbaManager)
        assert pool.statistics()["allocations"] == before + 1
        fill[400, 256](d, 7)
        assert (d.copy_to_host() == 7 + np.arange(100000)).all()
        info = cuda.current_context().get_memory_info()
        assert info.total == gpumem.device_memory_info(0)[1]
        held = pool.statistics()["allocations"]  # Numba may have allocated more to launch
        with cuda.defer_cleanup():
            del d
            gc.collect()
            assert pool.statistics()["allocations"] == held  # the free is held back
        assert pool.statistics()["allocations"] == held - 1
        empty = cuda.device_array(0, dtype=np.float32)
        assert empty.size == 0
        print("ok")
        """,
    )
    assert out.strip().endswith("ok")


def test_ipc_of_a_pool_sub_allocation(tmp_path):
    need("numba.cuda", "numpy")
    out = run_script(
        tmp_path,
        """
        import multiprocessing as mp
        import numpy as np

        def child(handle, queue):
            from numba import cuda
            with handle as arr:
                seen = arr.copy_to_host()
                arr.copy_to_device(seen * 2)
                cuda.synchronize()
            queue.put(int(seen.sum()))

        if __name__ == "__main__":
            from numba import cuda
            import gpumem, gpumem.numba
            gpumem.numba.use_gpumem_for_numba()
            padding = cuda.device_array(4096, dtype=np.uint8)   # the target is not at offset 0
            data = cuda.to_device(np.arange(1000, dtype=np.int64))
            handle = data.get_ipc_handle()
            # Legacy IPC of the base allocation plus the offset (a pool over cuMemAlloc), or
            # gpumem's own handle (the default's pages), which carries the offset itself.
            inner = getattr(handle._ipc_handle, "_gpumem", None)
            offset = inner.offset if inner is not None else handle._ipc_handle.offset
            assert offset > 0, offset
            ctx = mp.get_context("spawn")
            queue = ctx.Queue()
            p = ctx.Process(target=child, args=(handle, queue))
            p.start()
            total = queue.get(timeout=240)
            p.join(timeout=60)
            assert p.exitcode == 0
            assert total == sum(range(1000))
            assert (data.copy_to_host() == 2 * np.arange(1000)).all()
            print("ok offset", handle._ipc_handle.offset)
        """,
    )
    assert "ok offset" in out


def test_numba_cupy_and_torch_share_one_pool(tmp_path):
    need("numba.cuda", "numpy", "cupy", "torch")
    out = run_script(
        tmp_path,
        """
        import numpy as np
        from numba import cuda
        import cupy, torch
        import gpumem, gpumem.numba, gpumem.cupy, gpumem.torch

        gpumem.torch.use_gpumem_for_torch()
        gpumem.numba.use_gpumem_for_numba()
        gpumem.cupy.use_gpumem_for_cupy()
        pool = gpumem.get_current_resource(0)
        base = pool.statistics()
        n = cuda.device_array(1 << 20, dtype=np.uint8)
        c = cupy.ones(1 << 18, dtype=cupy.float32)
        t = torch.ones(1 << 18, dtype=torch.float32, device="cuda")
        s = pool.statistics()
        assert s["allocations"] == base["allocations"] + 3, s
        assert s["used_bytes"] >= base["used_bytes"] + 3 * (1 << 20), s
        assert float(c.sum()) == float(t.sum().item()) == float(1 << 18)
        # Each framework's memory is addressable by the others.
        t2 = torch.as_tensor(c, device="cuda")
        assert t2.data_ptr() == c.data.ptr
        del n, c, t, t2
        import gc; gc.collect()
        torch.cuda.synchronize()
        assert pool.statistics()["allocations"] == base["allocations"], pool.statistics()
        print("ok")
        """,
    )
    assert out.strip().endswith("ok")


def test_buffer_is_usable_by_cupy_and_torch(tmp_path):
    need("cupy", "torch")
    out = run_script(
        tmp_path,
        """
        import cupy, torch
        import gpumem
        b = gpumem.DeviceBuffer.from_host(bytes(range(256)) * 4)
        c = cupy.asarray(b)                       # __cuda_array_interface__
        assert c.data.ptr == b.ptr and int(c[255]) == 255
        t = torch.from_dlpack(b)                  # DLPack
        assert t.data_ptr() == b.ptr and t.shape == (1024,) and int(t[257]) == 1
        print("ok")
        """,
    )
    assert out.strip().endswith("ok")


def test_copies_between_devices_work_on_gpumem_memory(tmp_path):
    # The frameworks copy between devices without asking the allocator: the
    # default pool maps its memory for every device that can reach it.
    need("torch", "cupy")
    import gpumem

    if gpumem.device_count() < 2 or not gpumem.peers_of(0):
        pytest.skip("needs two devices with peer access")
    out = run_script(
        tmp_path,
        """
        import cupy, torch
        import gpumem, gpumem.cupy, gpumem.torch

        gpumem.torch.use_gpumem_for_torch()
        gpumem.cupy.use_gpumem_for_cupy()
        x = torch.arange(1 << 22, device="cuda:0", dtype=torch.float32)
        y = x.to("cuda:1")
        back = y.view(1024, 4096).t().to("cuda:0")
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        assert torch.equal(y.cpu(), x.cpu())
        assert torch.equal(back.cpu(), x.view(1024, 4096).t().cpu())
        a = cupy.arange(1 << 20, dtype=cupy.float32)
        with cupy.cuda.Device(1):
            b = cupy.asarray(a)
            peek = cupy.ElementwiseKernel("raw float32 x", "float32 y", "y = x[i]", "peek")(a, size=1 << 20)
            cupy.cuda.Device(1).synchronize()
        assert (b.get() == a.get()).all() and (peek.get() == a.get()).all()
        print("ok")
        """,
    )
    assert "ok" in out


def test_a_cupy_capture_gets_the_graphs_memory(tmp_path):
    # docs/pool.md, "CUDA graphs": CuPy allocates on its current stream, so a capture
    # on that stream is served from the graph's own memory, never the pool's blocks.
    # The output is made before the capture: CuPy instantiates its graphs without
    # auto-free-on-launch, and the driver relaunches such a graph only once what it
    # allocated is freed.
    need("cupy")
    out = run_script(tmp_path, """
        import cupy
        import gpumem, gpumem.cupy
        gpumem.cupy.use_gpumem_for_cupy()
        n = 1 << 20
        s = cupy.cuda.Stream(non_blocking=True)
        with s:
            warm = cupy.ones(n, dtype=cupy.float32)
            out = cupy.empty(n, dtype=cupy.float32)
            s.synchronize()
            used_before = gpumem.stack_report(0)["used_bytes"]
            s.begin_capture()
            a = cupy.arange(n, dtype=cupy.float32)  # the graph's memory
            cupy.multiply(a, 2, out=out)
            out += warm
            del a  # a free node of the graph
            g = s.end_capture()
            assert gpumem.stack_report(0)["used_bytes"] == used_before, "the capture took no pool block"
            for _ in range(3):
                out.fill(0)
                g.launch(s)
                s.synchronize()
                assert float(out[-1]) == 2.0 * (n - 1) + 1.0 and float(out[0]) == 1.0
            del g
            s.synchronize()
        print("cupy graph ok")
    """)
    assert "cupy graph ok" in out
