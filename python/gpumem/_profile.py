"""gpumem.profile: what a function or a block allocated, through a StatisticsAdaptor's scopes.

Each profiled call runs inside one scope of a StatisticsAdaptor (push_scope / pop_scope);
the scope's counters are added to a ProfileRecords under the call's name. Scopes belong
to the adaptor, not to a thread: calls profiled at once from several threads count each
other's allocations.
"""

import functools
import sys
import threading

from gpumem import _core


class ProfileRecords:
    """Totals of profiled code, per name: ``calls``, ``total_bytes`` and ``total_count``
    (allocated over all calls), ``peak_bytes`` and ``peak_count`` (the most live at once
    during any one call, counting what was live when it started). ``records`` is that dict
    of dicts; ``report()`` is a table of it."""

    _FIELDS = ("calls", "total_bytes", "total_count", "peak_bytes", "peak_count")

    def __init__(self):
        """No records yet."""
        self._lock = threading.Lock()
        self.records = {}

    def add(self, name, counters):
        """Adds one call's scope counters (a StatisticsAdaptor.pop_scope() dict) to `name`."""
        with self._lock:
            r = self.records.setdefault(name, dict.fromkeys(self._FIELDS, 0))
            r["calls"] += 1
            r["total_bytes"] += counters["total_bytes"]
            r["total_count"] += counters["total_count"]
            r["peak_bytes"] = max(r["peak_bytes"], counters["peak_bytes"])
            r["peak_count"] = max(r["peak_count"], counters["peak_count"])

    def clear(self):
        """Forgets every record."""
        with self._lock:
            self.records.clear()

    def report(self, ordered_by="total_bytes"):
        """The records as a text table, largest `ordered_by` first."""
        with self._lock:
            rows = sorted(self.records.items(), key=lambda kv: kv[1][ordered_by], reverse=True)
        head = "%-48s %8s %16s %12s %16s %12s" % (("name",) + self._FIELDS)
        lines = [head, "-" * len(head)]
        for name, r in rows:
            lines.append("%-48s %8d %16d %12d %16d %12d" % ((name,) + tuple(r[f] for f in self._FIELDS)))
        return "\n".join(lines)

    def __repr__(self):
        return "<gpumem.ProfileRecords %d names>" % len(self.records)


profile_records = ProfileRecords()
"""Where gpumem.profile records go unless it is given ``records=``."""


def _statistics_of_current_resource():
    device = _core.current_device()
    stats = _core.get_current_resource(device).find_layer("stats")
    if stats is None:
        raise _core.LogicError(
            "gpumem.profile: the current resource of device %d has no statistics layer ('stats'): "
            "pass statistics=, or make a stack with one current (gpumem.reinitialize('pool,stats') "
            "or set_current_resource(StatisticsAdaptor(...)))" % device
        )
    return stats


class _Profiler:
    """A decorator and a context manager that profile under one name."""

    def __init__(self, name, statistics, records):
        self._name = name
        self._statistics = statistics
        self._records = profile_records if records is None else records
        self._open = []  # (adaptor, name) of the blocks entered and not left, innermost last

    def _push(self):
        stats = self._statistics if self._statistics is not None else _statistics_of_current_resource()
        stats.push_scope()
        return stats

    def __call__(self, func):
        if not callable(func):
            raise TypeError("gpumem.profile: expected a function to decorate, got %r" % (func,))
        name = self._name or "%s.%s" % (getattr(func, "__module__", "?"), getattr(func, "__qualname__", func))

        @functools.wraps(func)
        def profiled(*args, **kwargs):
            stats = self._push()
            try:
                return func(*args, **kwargs)
            finally:
                self._records.add(name, stats.pop_scope())

        return profiled

    def __enter__(self):
        name = self._name
        if name is None:
            caller = sys._getframe(1)
            name = "%s:%d" % (caller.f_code.co_filename, caller.f_lineno)
        self._open.append((self._push(), name))
        return self

    def __exit__(self, *exc):
        stats, name = self._open.pop()
        self._records.add(name, stats.pop_scope())
        return False


def profile(func=None, *, name=None, statistics=None, records=None):
    """Records what a function (``@gpumem.profile``, ``@gpumem.profile(name=...)``) or a
    block (``with gpumem.profile(name=...):``) allocates, per call, in `records` (default
    ``gpumem.profile_records``) under `name` (default: the function's qualified name, or the
    block's file:line). Counts through `statistics`, a StatisticsAdaptor, or else the
    statistics layer of the current device's current resource at each call (LogicError when
    it has none). ``gpumem.profile_records.report()`` prints the table."""
    profiler = _Profiler(name, statistics, records)
    return profiler if func is None else profiler(func)
