"""gpumem.snapshot: memory-history snapshots in the format of PyTorch's
torch.cuda.memory._snapshot(), which pytorch.org/memory_viz opens.

The viewer is PyTorch's torch/utils/viz/MemoryViz.js (the page) and
torch/cuda/_memory_viz.py (the same views from Python). What they read is written down
below, and the snapshot is checked against it without PyTorch: the keys and their types,
the pickle opcodes the page's own unpickler understands, and the invariant its segment
view relies on (walking the trace backwards from the segments, every live block lies in
a live segment). Where PyTorch is importable (the GPU machine), its _memory_viz
processes a dumped file.
"""

import inspect
import os
import pickle
import pickletools
import re
import threading

import pytest

import gpumem
import gpumem.snapshot as gsnap
from conftest import run_python

HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))

# What MemoryViz.js and _memory_viz.py read (PyTorch 2.x).
SNAPSHOT_KEYS = {"segments", "device_traces"}
# MemoryViz.js: device, address, total_size, stream, blocks; _memory_viz.py's trace and
# segsum: allocated_size, total_size; torch's own snapshots also carry the rest.
SEGMENT_KEYS = {"device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
                "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"}
# MemoryViz.js lays blocks out from the segment's address by their sizes; state,
# requested_size and frames say what each is.
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
BLOCK_STATES = {"active_allocated", "active_pending_free", "inactive"}
# A trace entry: action, addr (not for oom), size, stream, frames; device_free for oom.
TRACE_KEYS = {"action", "addr", "size", "stream", "frames", "time_us"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom"}
FRAME_KEYS = {"filename", "line", "name"}
# The opcodes MemoryViz.js's unpickler handles (any other is "UNKNOWN OPCODE"), protocols 2 to 4.
VIEWER_OPCODES = {"PROTO", "FRAME", "STOP", "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET",
                  "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_LIST", "LIST", "APPEND", "APPENDS",
                  "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "BININT", "BININT1", "BININT2", "LONG1",
                  "BINFLOAT", "NEWTRUE", "NEWFALSE", "NONE", "SHORT_BINUNICODE", "BINUNICODE"}


def line_here():
    return inspect.currentframe().f_back.f_lineno


@pytest.fixture
def recording():
    """A fresh pool current on device 0, recorded; afterwards the previous resource back."""
    pool = gpumem.PoolResource(device=0)
    previous = gpumem.set_current_resource(pool, 0)
    gsnap.record_memory_history(devices=0)
    yield pool
    gsnap.record_memory_history(enabled=False, devices=0)
    assert gpumem.get_current_resource(0) is pool, "stopping puts the wrapped resource back"
    gpumem.set_current_resource(previous, 0)


def allocate_here(n):
    where = line_here() + 1
    return gpumem.DeviceBuffer(n), where


def check_format(snap):
    assert SNAPSHOT_KEYS <= set(snap) and len(snap["device_traces"]) == gpumem.device_count()
    for seg in snap["segments"]:
        assert set(seg) == SEGMENT_KEYS
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        assert seg["allocated_size"] == sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")
        for b in seg["blocks"]:
            assert set(b) == BLOCK_KEYS and b["state"] in BLOCK_STATES and b["requested_size"] <= b["size"]
            check_frames(b["frames"])
    for trace in snap["device_traces"]:
        for e in trace:
            assert e["action"] in ACTIONS
            if e["action"] == "oom":
                assert set(e) == TRACE_KEYS - {"addr"} | {"device_free"}
            else:
                assert set(e) == TRACE_KEYS and isinstance(e["addr"], int)
            assert isinstance(e["size"], int) and isinstance(e["stream"], int)
            check_frames(e["frames"])


def check_frames(frames):
    for f in frames:
        assert set(f) == FRAME_KEYS
        assert isinstance(f["filename"], str) and isinstance(f["line"], int) and isinstance(f["name"], str)


def check_viewer_invariants(snap, device):
    """What MemoryViz.js's segment view does to draw the state before each entry: it
    walks the trace backwards from the snapshot's segments and blocks, and every block it
    holds must lie inside a segment it holds."""
    segments = {s["address"]: s["total_size"] for s in snap["segments"] if s["device"] == device}
    blocks = {}
    for s in snap["segments"]:
        if s["device"] == device:
            addr = s["address"]
            for b in s["blocks"]:
                if b["state"] == "active_allocated":
                    blocks[addr] = b["size"]
                addr += b["size"]

    def inside(addr):
        return any(a <= addr < a + n for a, n in segments.items())

    for e in reversed(snap["device_traces"][device]):
        action = e["action"]
        if action == "alloc":
            assert blocks.pop(e["addr"]) == e["size"]
        elif action == "free_completed":
            assert e["addr"] not in blocks
            blocks[e["addr"]] = e["size"]
        elif action == "segment_alloc":
            assert segments.pop(e["addr"]) == e["size"]
        elif action == "segment_free":
            assert e["addr"] not in segments
            segments[e["addr"]] = e["size"]
        assert all(inside(a) for a in blocks), "a block outside every segment before %r" % (e,)


def test_python_call_sites_appear_in_the_snapshot(recording):
    buf, line = allocate_here(4096)
    snap = gsnap.snapshot()
    check_format(snap)
    (seg,) = snap["segments"]
    assert (seg["device"], seg["address"], seg["total_size"]) == (0, buf.ptr, 4096)
    (block,) = seg["blocks"]
    assert block["state"] == "active_allocated" and block["requested_size"] == 4096
    assert block["frames"][0] == {"filename": HERE, "line": line, "name": "allocate_here"}
    assert block["frames"][1]["name"] == "test_python_call_sites_appear_in_the_snapshot"
    alloc = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
    assert alloc[0]["frames"] == block["frames"]
    (summary,) = snap["gpumem"]["devices"]
    assert summary["stack"] == "pool(cuda)" and summary["history_dropped"] == 0
    buf.close()


def test_alloc_and_free_entries_in_order_with_sizes(recording):
    a, _ = allocate_here(1000)
    b, _ = allocate_here(3000)
    a_ptr, b_ptr = a.ptr, b.ptr
    a.close()
    c, _ = allocate_here(500)
    snap = gsnap.snapshot()
    trace = snap["device_traces"][0]
    assert [(e["action"], e["addr"], e["size"]) for e in trace] == [
        ("segment_alloc", a_ptr, 1000), ("alloc", a_ptr, 1000),
        ("segment_alloc", b_ptr, 3000), ("alloc", b_ptr, 3000),
        ("free_requested", a_ptr, 1000), ("free_completed", a_ptr, 1000), ("segment_free", a_ptr, 1000),
        ("segment_alloc", c.ptr, 500), ("alloc", c.ptr, 500),
    ]
    assert all(e["stream"] == 0 for e in trace)
    times = [e["time_us"] for e in trace]
    assert times == sorted(times)
    assert sorted((s["address"], s["total_size"]) for s in snap["segments"]) == sorted([(b_ptr, 3000), (c.ptr, 500)])
    check_format(snap)
    check_viewer_invariants(snap, 0)
    b.close()
    c.close()
    after = gsnap.snapshot()
    assert after["segments"] == [] and len(after["device_traces"][0]) == 15
    check_viewer_invariants(after, 0)


def test_the_pickle_round_trips_and_the_viewer_can_read_it(recording, tmp_path):
    kept = [allocate_here(n)[0] for n in (256, 70000, 3 << 20)]
    kept.pop(1).close()
    path = gsnap.dump_snapshot(tmp_path / "memory.pickle")
    raw = (tmp_path / "memory.pickle").read_bytes()
    loaded = pickle.loads(raw)
    assert loaded == gsnap.snapshot(), "nothing happened in between: the same snapshot"
    assert str(path).endswith("memory.pickle")
    check_format(loaded)
    check_viewer_invariants(loaded, 0)
    assert {s["segment_type"] for s in loaded["segments"]} == {"small", "large"}
    ops = {op.name for op, _, _ in pickletools.genops(raw)}
    assert ops <= VIEWER_OPCODES, ops - VIEWER_OPCODES
    assert raw[0] == 0x80 and 2 <= raw[1] <= 4, "the viewer reads protocols 2 to 4"
    kept.clear()


def test_out_of_memory_is_an_oom_entry(tmp_path):
    limit = gpumem.LimitingAdaptor(gpumem.PoolResource(device=0), 1 << 20)
    previous = gpumem.set_current_resource(limit, 0)
    gsnap.record_memory_history(devices=0)
    try:
        with pytest.raises(gpumem.OutOfMemoryError):
            gpumem.DeviceBuffer(2 << 20)
        line = line_here() - 1
        (oom,) = gsnap.snapshot()["device_traces"][0]
        assert oom["action"] == "oom" and oom["size"] == 2 << 20 and isinstance(oom["device_free"], int)
        assert oom["frames"][0]["line"] == line
    finally:
        gsnap.record_memory_history(enabled=False, devices=0)
        gpumem.set_current_resource(previous, 0)


def test_disabled_history_records_nothing(fresh_pool):
    assert not gsnap.is_recording()
    gsnap.record_memory_history(enabled=False)
    assert gpumem.get_current_resource(0) is fresh_pool, "nothing was put over the resource"
    buf = gpumem.DeviceBuffer(4096)
    snap = gsnap.snapshot()
    assert snap["segments"] == [] and all(t == [] for t in snap["device_traces"])
    buf.close()
    # Recorded, then stopped: what happens afterwards is not recorded either.
    gsnap.record_memory_history(devices=0)
    kept = gpumem.DeviceBuffer(100)
    gsnap.record_memory_history(enabled=None, devices=0)
    assert gpumem.get_current_resource(0) is fresh_pool and not gsnap.is_recording(0)
    later = gpumem.DeviceBuffer(200)
    snap = gsnap.snapshot()
    assert snap["segments"] == [] and all(t == [] for t in snap["device_traces"])
    kept.close()
    later.close()


def test_state_only_keeps_call_sites_without_a_history(fresh_pool):
    gsnap.record_memory_history("state", devices=0)
    try:
        buf, line = allocate_here(512)
        snap = gsnap.snapshot()
        assert snap["device_traces"][0] == []
        assert snap["segments"][0]["blocks"][0]["frames"][0]["line"] == line
    finally:
        gsnap.record_memory_history(False, devices=0)
    buf.close()


def test_max_entries_keeps_the_latest_and_says_what_it_dropped(recording):
    gsnap.record_memory_history(max_entries=3, devices=0)  # starts over, over the same pool
    bufs = [allocate_here(256 * (i + 1))[0] for i in range(5)]
    snap = gsnap.snapshot()
    assert [e["size"] for e in snap["device_traces"][0] if e["action"] == "alloc"] == [768, 1024, 1280]
    assert snap["gpumem"]["devices"][0]["history_dropped"] == 2
    assert len(snap["segments"]) == 5, "the live allocations are all there"
    check_viewer_invariants(snap, 0)
    bufs.clear()
    with pytest.raises(ValueError):
        gsnap.record_memory_history(max_entries=0)
    with pytest.raises(ValueError):
        gsnap.record_memory_history(enabled="sometimes")


def test_threads_and_the_pytorch_entry_points_are_recorded(recording):
    import ctypes

    kept = []
    t = threading.Thread(target=lambda: kept.append(gpumem.DeviceBuffer(300)))
    t.start()
    t.join()
    lib = ctypes.CDLL(os.path.join(os.path.dirname(gpumem.__file__), "libgpumem_torch.so"))
    lib.gpumem_torch_alloc.restype = ctypes.c_void_p
    lib.gpumem_torch_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.gpumem_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    p = lib.gpumem_torch_alloc(8192, 0, None)
    line = line_here() - 1
    lib.gpumem_torch_free(p, 8192, 0, None)
    allocs = [e for e in gsnap.snapshot()["device_traces"][0] if e["action"] == "alloc"]
    assert [e["size"] for e in allocs] == [300, 8192]
    assert allocs[0]["frames"][0]["name"] == "<lambda>"
    assert allocs[1]["frames"][0] == {"filename": HERE, "line": line,
                                      "name": "test_threads_and_the_pytorch_entry_points_are_recorded"}
    kept.clear()


def test_torch_s_memory_viz_processes_the_dump(recording, tmp_path):
    try:
        import torch.cuda._memory_viz as viz
    except ImportError as e:
        pytest.skip("PyTorch is not importable here (%s): its _memory_viz is checked on the GPU machine" % e)
    kept = [allocate_here(n)[0] for n in (1 << 10, 5 << 20, 300)]
    kept.pop(0).close()
    path = gsnap.dump_snapshot(tmp_path / "memory.pickle")
    with open(path, "rb") as f:
        data = pickle.load(f)
    for plot in (viz.trace_plot, viz.segment_plot):
        html = plot(data)
        assert isinstance(html, str) and "<html" in html.lower()
    assert "segments: 2" in viz.segsum(data)  # its sums check that blocks fill their segments
    text = viz.trace(data)
    assert "Device 0" in text and "cudaMalloc" in text and "del " in text
    kept.clear()


def test_the_documented_example_runs(tmp_path):
    text = open(os.path.join(ROOT, "docs", "observability.md"), encoding="utf-8").read()
    start = text.index("\n### Python call sites and memory snapshots\n")
    (block,) = re.findall(r"```python\n(.*?)```", text[start:text.index("\n## ", start)], flags=re.S)
    done = run_python("import os\nos.chdir(%r)\n" % str(tmp_path) + block)
    assert done.returncode == 0, done.stdout + done.stderr
    with open(tmp_path / "memory.pickle", "rb") as f:
        snap = pickle.load(f)
    check_format(snap)
    assert len(snap["segments"]) == 4 and len(snap["device_traces"][0]) == 8
