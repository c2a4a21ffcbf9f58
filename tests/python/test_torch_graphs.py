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


def test_a_tensor_made_before_a_capture_and_freed_under_it_is_held_for_the_graph(tmp_path):
    # A tensor made on the capture stream before the capture dies inside it:
    # PyTorch frees it then, on that stream. The graph may read it on every replay,
    # so the pool holds its block until the graph is gone (Note [A pool block freed
    # under a capture]), where before it refused the free and the block was lost.
    need_cuda_torch()
    script = tmp_path / "check.py"
    script.write_text("import torch, gpumem, gpumem.torch as gt, time\ngt.use_gpumem_for_torch()\n" + textwrap.dedent("""
        n = 1 << 20
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            x = torch.ones(n, device="cuda")
        torch.cuda.synchronize()
        used = lambda: gpumem.stack_report(0)["used_bytes"]
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            y = x * 2
            del x  # freed under the capture: held for g
        held = used()
        for i in range(3):
            with torch.cuda.stream(s):  # the pool hands out anything but x's block
                fills = [torch.full((n,), 7.0, device="cuda") for _ in range(8)]
                g.replay()
                del fills
            torch.cuda.synchronize()
            assert float(y.min()) == float(y.max()) == 2.0, "a replay read memory the pool handed out again"
        assert used() >= held, (held, used())
        del y, g
        torch.cuda.synchronize()
        deadline = time.time() + 10
        while used() > held - 4 * n and time.time() < deadline:  # the driver says so from its own thread
            time.sleep(0.01)
        assert used() <= held - 4 * n, ("the graph is gone, x's block not back", held, used())
        print("held ok")
    """))
    done = run_python("import runpy; runpy.run_path(%r, run_name='__main__')" % str(script), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "held ok" in done.stdout
    assert "failed" not in done.stderr, done.stderr
