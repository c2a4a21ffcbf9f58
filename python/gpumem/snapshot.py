"""gpumem.snapshot: memory-history snapshots that PyTorch's memory viewer opens.

``record_memory_history()`` puts a TrackingAdaptor that records Python call stacks and a
history of allocations and frees over the current resource of each device, so every
allocation through gpumem (PyTorch's, Numba's, CuPy's, DeviceBuffer's) is seen;
``snapshot()`` returns what it recorded as the dict ``torch.cuda.memory._snapshot()``
returns, and ``dump_snapshot(path)`` pickles it so that https://pytorch.org/memory_viz
(or ``torch.cuda._memory_viz``) opens it. Nothing here imports PyTorch.

::

    import gpumem.snapshot
    gpumem.snapshot.record_memory_history(max_entries=100_000)
    run_the_program()
    gpumem.snapshot.dump_snapshot("memory.pickle")   # drag it onto pytorch.org/memory_viz
    gpumem.snapshot.record_memory_history(enabled=False)

Note [Segments of a snapshot]
PyTorch's snapshot lists the caching allocator's segments (its cudaMalloc calls) and the
blocks inside each, and the viewer places every block by adding up the sizes of the
blocks before it in its segment. gpumem's pools have no public query of where their
blocks lie (their statistics are totals), so a snapshot has one segment per live
allocation, holding one active block of the requested size, and the history has a
``segment_alloc`` before each ``alloc`` and a ``segment_free`` after each
``free_completed``, for the same memory. That keeps the viewer's segment history
consistent (every block inside a segment, at every step), and its timelines exact; what
it calls reserved memory is then the live memory. What the pools hold is in the
snapshot's extra key ``"gpumem"`` (per device: the stack, its used and reserved bytes).
"""

import os
import pickle
import threading
import time

import gpumem
from gpumem import _core

__all__ = ["record_memory_history", "snapshot", "dump_snapshot", "is_recording", "PICKLE_PROTOCOL"]

# memory_viz reads pickles with its own unpickler, which takes protocols 2 to 4 only
# (Python 3.14 writes protocol 5 by default).
PICKLE_PROTOCOL = 4

_LARGE_SEGMENT_BYTES = 1 << 20  # PyTorch's "large" segments: above 1 MiB

_lock = threading.Lock()
_recording = {}  # device -> _Recording


class _Recording:
    def __init__(self, tracker, previous, start_us):
        self.tracker = tracker  # the TrackingAdaptor made current
        self.previous = previous  # the resource it wraps (current again when recording stops)
        self.start_us = start_us  # wall-clock microseconds when the tracker was made


def _devices(devices):
    if devices is None:
        return list(range(gpumem.device_count()))
    if isinstance(devices, int):
        return [devices]
    return list(devices)


def _stop(device):
    rec = _recording.pop(device)
    # The program may have made another resource current since: that one stays.
    if gpumem.get_current_resource(device) is rec.tracker:
        _core.set_current_resource(rec.previous, device)
    rec.tracker.clear_history()


def record_memory_history(enabled=True, max_entries=100_000, stack_depth=16, devices=None):
    """Starts or stops recording on `devices` (an ordinal, a list, or None: every device).

    ``enabled``: True or ``"all"`` records the Python call stack of every allocation and
    the last `max_entries` allocations, frees and out-of-memory failures (each becomes two
    or three entries of the snapshot's trace); ``"state"`` records the call stacks only
    (what is live, no history); False or None stops, and the devices' previous current
    resources are current again (memory allocated meanwhile goes back through the
    recording layer when freed, unrecorded). Calling it while recording starts over.
    `stack_depth` is the most Python frames kept per call (1 to 256).

    The layer is a ``TrackingAdaptor(python_stacks=True)`` over each device's current
    resource, made current in its place (``gpumem.numba``'s reset treats it as the
    resource it wraps: chosen by the program or the default). Memory allocated before
    recording started is not seen. Cost while recording: the Python stack walk (about a
    microsecond, under the GIL: a thread that released it takes it back) and one lock per
    allocation and per free."""
    if enabled not in (True, False, None, "all", "state"):
        raise ValueError("gpumem.snapshot.record_memory_history: enabled must be True, 'all', 'state', "
                         "False or None, not %r" % (enabled,))
    history = enabled in (True, "all")
    if not isinstance(max_entries, int) or isinstance(max_entries, bool) or max_entries < 1:
        raise ValueError("gpumem.snapshot.record_memory_history: max_entries must be a positive int, not %r"
                         % (max_entries,))
    with _lock:
        for d in _devices(devices):
            if d in _recording:
                _stop(d)
            if not enabled:
                continue
            current = gpumem.get_current_resource(d)
            tracker = gpumem.TrackingAdaptor(current, python_stacks=True, stack_depth=stack_depth,
                                             report_at_exit=False,
                                             history_entries=max_entries if history else 0)
            # Not gpumem.set_current_resource: whether the program chose the resource is unchanged.
            _core.set_current_resource(tracker, d)
            _recording[d] = _Recording(tracker, current, time.time_ns() // 1000)


def is_recording(device=None):
    """Whether record_memory_history is recording on `device` (None: on any device)."""
    with _lock:
        return bool(_recording) if device is None else device in _recording


def _frames_of(site, cache):
    frames = cache.get(site)
    if frames is None:
        frames = [{"filename": f, "line": line, "name": name} for f, line, name in _core._python_site_frames(site)]
        cache[site] = frames
    return frames


def _trace_entries(event, frames, start_us):
    """PyTorch's trace entries for one history event (Note [Segments of a snapshot])."""
    common = {"size": event["bytes"], "stream": event["stream"], "frames": frames,
              "time_us": start_us + event["time_ns"] // 1000}
    op = event["op"]
    if op == "out_of_memory":
        return [dict(common, action="oom", device_free=event["device_free_bytes"])]
    addr = event["ptr"]
    if op == "allocate":
        actions = ("segment_alloc", "alloc")
    else:
        actions = ("free_requested", "free_completed", "segment_free")
    return [dict(common, action=a, addr=addr) for a in actions]


def _segment(device, allocation, frames):
    n = allocation["bytes"]
    block = {"address": allocation["ptr"], "size": n, "requested_size": n, "state": "active_allocated",
             "frames": frames}
    return {"device": device, "address": allocation["ptr"], "total_size": n, "allocated_size": n,
            "active_size": n, "requested_size": n, "stream": allocation["stream"],
            "segment_type": "large" if n > _LARGE_SEGMENT_BYTES else "small", "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": [], "blocks": [block]}


def _device_summary(device, rec):
    report = gpumem.stack_report(resource=rec.previous)
    return {"device": device, "stack": report["stack"], "used_bytes": report["used_bytes"],
            "reserved_bytes": report["reserved_bytes"], "history_entries": rec.tracker.history_entries,
            "history_dropped": rec.tracker.history_dropped, "recording_since_us": rec.start_us}


def snapshot():
    """What record_memory_history recorded, as ``torch.cuda.memory._snapshot()`` gives it:
    ``segments`` (one per live allocation recorded, Note [Segments of a snapshot]: device,
    address, total_size, allocated_size, active_size, requested_size, stream,
    segment_type, segment_pool_id, is_expandable, frames, blocks: address, size,
    requested_size, state ``"active_allocated"``, frames) and ``device_traces`` (one list
    per device, oldest first: action ``alloc``, ``free_requested``, ``free_completed``,
    ``segment_alloc``, ``segment_free`` or ``oom``; addr, size, stream, frames
    (``{"filename", "line", "name"}``, innermost first), time_us (wall clock), and
    device_free for ``oom``), plus ``gpumem`` (per recorded device: the stack, its used and
    reserved bytes, the history's size and what it dropped). Without recording there are
    no segments and every trace is empty."""
    with _lock:
        recordings = dict(_recording)
    traces = [[] for _ in range(gpumem.device_count())]
    segments = []
    summaries = []
    cache = {}
    for d, rec in sorted(recordings.items()):
        for a in rec.tracker.live():
            segments.append(_segment(d, a, _frames_of(a["site"], cache)))
        for e in rec.tracker.history():
            traces[d].extend(_trace_entries(e, _frames_of(e["site"], cache), rec.start_us))
        summaries.append(_device_summary(d, rec))
    segments.sort(key=lambda s: (s["device"], s["address"]))
    return {"segments": segments, "device_traces": traces,
            "gpumem": {"version": gpumem.__version__, "segments": "one per live allocation", "devices": summaries}}


def dump_snapshot(path="dump_snapshot.pickle"):
    """Writes snapshot() to `path` as a pickle (protocol 4, which pytorch.org/memory_viz
    and ``torch.cuda._memory_viz`` read) and returns the path."""
    data = snapshot()
    with open(os.fspath(path), "wb") as f:
        pickle.dump(data, f, protocol=PICKLE_PROTOCOL)
    return path
