"""TrackingAdaptor's Python call sites (python_stacks=True) and its history.

The sites are the program's frames, innermost first, as "file:line function": these
tests find their own file, functions and lines in them, from threads that hold the
GIL, released it, or never ran Python."""

import ctypes
import inspect
import os
import threading

import pytest

import gpumem
from conftest import run_python

HERE = os.path.abspath(__file__)


def line_here():
    """The caller's current line."""
    return inspect.currentframe().f_back.f_lineno


@pytest.fixture
def track():
    t = gpumem.TrackingAdaptor(gpumem.PoolResource(device=0), python_stacks=True, report_at_exit=False)
    yield t
    assert t.live_count == 0, "a test left memory live"


def allocate_in_a_helper(resource, n):
    where = line_here() + 1
    return gpumem.DeviceBuffer(n, resource=resource), where


def test_live_allocations_show_the_python_call_site(track):
    buf, helper_line = allocate_in_a_helper(track, 4096)
    caller_line = line_here() - 1
    (live,) = track.live()
    stack = live["python_stack"]
    assert stack[0] == "%s:%d allocate_in_a_helper" % (HERE, helper_line)
    assert stack[1] == "%s:%d test_live_allocations_show_the_python_call_site" % (HERE, caller_line)
    assert len(stack) <= 16 and live["site"] >= 2
    assert live["stack"] == [], "native stacks stay off"
    assert gpumem._core._python_site_frames(live["site"])[:2] == [
        (HERE, helper_line, "allocate_in_a_helper"),
        (HERE, caller_line, "test_live_allocations_show_the_python_call_site"),
    ]
    again, _ = allocate_in_a_helper(track, 100)
    assert track.live()[1]["site"] != live["site"], "another caller line is another site"
    buf.close()
    again.close()


def test_the_same_stack_is_one_site_and_depth_limits_it():
    t = gpumem.TrackingAdaptor(gpumem.PoolResource(device=0), python_stacks=True, stack_depth=1,
                               report_at_exit=False)
    bufs = [allocate_in_a_helper(t, 256)[0] for _ in range(3)]
    live = t.live()
    assert len({a["site"] for a in live}) == 1
    assert [len(a["python_stack"]) for a in live] == [1, 1, 1]
    assert live[0]["python_stack"][0].endswith(" allocate_in_a_helper")
    del bufs


def test_the_leak_report_and_the_snapshot_log_name_the_python_site(track, tmp_path):
    buf, helper_line = allocate_in_a_helper(track, 1000)
    report = track.leak_report()
    assert "      #0 %s:%d allocate_in_a_helper\n" % (HERE, helper_line) in report
    assert "test_the_leak_report_and_the_snapshot_log_name_the_python_site" in report
    path = tmp_path / "live.csv"
    track.write_snapshot(path)
    assert "%s:%d allocate_in_a_helper" % (HERE, helper_line) in path.read_text()
    buf.close()


def test_gpumem_s_own_frames_at_the_innermost_end_are_left_out(track):
    # Code that runs as if it were a module of the gpumem package (its file name is
    # under gpumem's folder): the site starts at its caller, this test.
    inside = os.path.join(os.path.dirname(gpumem.__file__), "_allocating_module.py")
    namespace = {"gpumem": gpumem}
    exec(compile("def allocate(n, r):\n    return gpumem.DeviceBuffer(n, resource=r)\n", inside, "exec"), namespace)
    buf = namespace["allocate"](512, track)
    line = line_here() - 1
    (live,) = track.live()
    assert live["python_stack"][0] == "%s:%d test_gpumem_s_own_frames_at_the_innermost_end_are_left_out" % (HERE, line)
    assert not any(f.startswith(inside) for f in live["python_stack"])
    buf.close()


def test_a_python_thread_s_site_is_its_own_stack(track):
    kept = []

    def worker():
        kept.append(gpumem.DeviceBuffer(300, resource=track))

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    (live,) = track.live()
    assert live["python_stack"][0].startswith("%s:" % HERE) and live["python_stack"][0].endswith(" worker")
    assert any(f.endswith(" run") and "threading" in f for f in live["python_stack"])
    kept.clear()


def test_a_thread_python_never_ran_on_has_no_python_frame(track):
    ptr = gpumem._core._allocate_on_a_native_thread(track, 2048)
    (live,) = track.live()
    assert live["python_stack"] == ["(no Python frame)"]
    assert gpumem._core._python_site_frames(live["site"]) == [("(no Python frame)", 0, "")]
    track.deallocate(ptr, 2048)


def test_calls_that_hold_the_gil_and_calls_that_released_it():
    # PyTorch's entry point, called through ctypes: PyDLL keeps the GIL held during
    # the call (as PyTorch's allocations from Python code), CDLL releases it.
    path = os.path.join(os.path.dirname(gpumem.__file__), "libgpumem_torch.so")
    t = gpumem.TrackingAdaptor(gpumem.PoolResource(device=0), python_stacks=True, report_at_exit=False)
    previous = gpumem.set_current_resource(t, 0)
    try:
        for lib in (ctypes.PyDLL(path), ctypes.CDLL(path)):
            lib.gpumem_torch_alloc.restype = ctypes.c_void_p
            lib.gpumem_torch_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
            lib.gpumem_torch_free.restype = None
            lib.gpumem_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
            p = lib.gpumem_torch_alloc(4096, 0, None)
            line = line_here() - 1
            (live,) = t.live()
            assert live["python_stack"][0] == "%s:%d test_calls_that_hold_the_gil_and_calls_that_released_it" % (
                HERE, line), type(lib)
            lib.gpumem_torch_free(p, 4096, 0, None)
    finally:
        gpumem.set_current_resource(previous, 0)


def test_history_in_order_with_sites_and_out_of_memory():
    limit = gpumem.LimitingAdaptor(gpumem.PoolResource(device=0), 64 << 10)
    t = gpumem.TrackingAdaptor(limit, python_stacks=True, report_at_exit=False, history_entries=4)
    assert (t.history_entries, t.python_stacks) == (4, True)
    a, a_line = allocate_in_a_helper(t, 1000)
    b = gpumem.DeviceBuffer(2000, resource=t)
    a.close()
    free_line = line_here() - 1
    with pytest.raises(gpumem.OutOfMemoryError):
        gpumem.DeviceBuffer(1 << 20, resource=t)
    h = t.history()
    assert [(e["op"], e["bytes"]) for e in h] == [
        ("allocate", 1000), ("allocate", 2000), ("deallocate", 1000), ("out_of_memory", 1 << 20)]
    assert h[0]["ptr"] == h[2]["ptr"] and h[2]["seq"] == h[0]["seq"] == 1 and h[3]["ptr"] == 0
    assert [e["time_ns"] for e in h] == sorted(e["time_ns"] for e in h)
    assert gpumem._core._python_site_frames(h[0]["site"])[0] == (HERE, a_line, "allocate_in_a_helper")
    assert gpumem._core._python_site_frames(h[2]["site"])[0][1] == free_line, "a free's site is where it was freed"
    b.close()  # a fifth event: the oldest goes
    assert [e["op"] for e in t.history()] == ["allocate", "deallocate", "out_of_memory", "deallocate"]
    assert t.history_dropped == 1
    t.clear_history()
    assert t.history() == [] and t.history_dropped == 0
    plain = gpumem.TrackingAdaptor(limit, report_at_exit=False)
    assert plain.history() == [] and not plain.python_stacks


def test_the_exit_report_names_python_sites_after_python_is_gone():
    code = (
        "import gpumem\n"
        "t = gpumem.TrackingAdaptor(gpumem.PoolResource(device=0), python_stacks=True)\n"
        "def leaky():\n"
        "    return t.allocate(4096)\n"  # a raw pointer, never freed
        "kept = leaky()\n"
    )
    p = run_python(code)
    assert p.returncode == 0, p.stderr
    assert "1 allocation(s), 4096 bytes" in p.stderr
    assert "#0 <string>:4 leaky" in p.stderr and "#1 <string>:5 <module>" in p.stderr, p.stderr
