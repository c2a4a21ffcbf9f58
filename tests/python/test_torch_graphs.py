"""CUDA graphs with gpumem as PyTorch's allocator (docs/pool.md, "CUDA graphs").

Under torch.cuda.graph the allocations PyTorch asks for are the graph's own memory
(the driver's allocation nodes), never blocks of gpumem's pool, so that replays and
the pool's reuse outside the graph never meet. Each check runs PyTorch in its own
interpreter (the allocator is chosen once per process): they need a GPU and PyTorch
with CUDA, and are skipped otherwise, with the reason.
"""

import textwrap

from conftest import need_cuda_torch, run_python, run_torch


def test_a_captured_graph_replays_correctly_beside_the_pools_own_allocations(tmp_path):
    out = run_torch(tmp_path, """
        n = 512
        w = torch.randn(n, n, device="cuda")
        static_in = torch.randn(n, n, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up, as PyTorch's documentation does it
            for _ in range(3):
                torch.relu(static_in @ w) + 1
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        used_before = gpumem.stack_report(0)["used_bytes"]
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            t = static_in @ w  # a temporary freed under the capture: a free node
            static_out = torch.relu(t) + 1
            del t
        # The output and the temporary (1 MiB each) are the graph's; what the pool
        # gained meanwhile is PyTorch's own bookkeeping made outside the capture
        # (its random generator's state: two 8-byte tensors).
        used = gpumem.stack_report(0)["used_bytes"]
        assert used - used_before < (1 << 20), ("the capture took no block of the pool", used_before, used)
        for i in range(5):
            static_in.copy_(torch.randn(n, n, device="cuda"))
            # Pool memory used between replays never overlaps the graph's.
            fill = torch.full((n, n), float(i), device="cuda")
            g.replay()
            torch.testing.assert_close(static_out, torch.relu(static_in @ w) + 1)
            assert float(fill.min()) == float(i) == float(fill.max())
            del fill
        del static_out, g  # the graph's allocation freed after the capture
        torch.cuda.synchronize()
        x = torch.ones(n, n, device="cuda")
        assert float(x.sum()) == n * n
        print("replays ok")
    """)
    assert "replays ok" in out


def test_outputs_of_a_graph_never_launched_are_freed_quietly(tmp_path):
    need_cuda_torch()
    script = tmp_path / "check.py"
    script.write_text("import torch, gpumem, gpumem.torch as gt\ngt.use_gpumem_for_torch()\n" + textwrap.dedent("""
        x = torch.ones(1 << 20, device="cuda")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x * 2
        del y, g  # captured, never launched: nothing of y was ever mapped
        torch.cuda.synchronize()
        print("dropped ok")
    """))
    done = run_python("import runpy; runpy.run_path(%r, run_name='__main__')" % str(script), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "dropped ok" in done.stdout
    assert "failed" not in done.stderr, done.stderr


def test_another_threads_allocations_leave_a_global_capture_valid(tmp_path):
    # torch.cuda.graph captures in global mode: while it does, the driver forbids
    # event queries, waits and cuMemAlloc in every thread, and such a call would
    # invalidate the capture. The pool's own (a trim looking at its fences, slots
    # made and given back) run relaxed (Note [Calls a capture elsewhere forbids]).
    out = run_torch(tmp_path, """
        import threading
        n = 256
        static_in = torch.randn(n, n, device="cuda")
        torch.cuda.synchronize()
        pool = gpumem.get_current_resource(0)

        side = torch.cuda.Stream()

        def other_work():  # no synchronisation of its own here: the driver forbids that
            with torch.cuda.stream(side):
                for step in range(3):
                    held = [torch.empty(m << 20, dtype=torch.uint8, device="cuda") for m in (1, 3, 8, 24)]
                    held.append(torch.ones(1000 + step, device="cuda"))
                    del held
                    pool.trim()

        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_out = static_in * 2
            t = threading.Thread(target=other_work)
            t.start()
            t.join()
        side.synchronize()
        g.replay()
        torch.testing.assert_close(static_out, static_in * 2)
        print("capture ok")
    """)
    assert "capture ok" in out
