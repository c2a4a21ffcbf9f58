// The adaptors from Python (docs/observability.md): each wraps any MemoryResource,
// adds one thing and is a MemoryResource itself, so stacks compose from Python as
// from C++:
//
//   stats = gpumem.StatisticsAdaptor(gpumem.PoolResource(gpumem.CudaResource(0)))
//   gpumem.DeviceBuffer(1 << 20, resource=gpumem.LimitingAdaptor(stats, 8 << 30))
//
// Every adaptor is made with the C++ constructor that takes the upstream as a
// shared_ptr, so the Python upstream object stays alive as long as the adaptor
// (and whatever holds the adaptor: buffers, the current resource). Option structs
// are keywords with the C++ defaults; sizes are ints checked as DeviceBuffer's are
// (a negative one is a LogicError). The OOM retry adaptor, whose callbacks call
// into Python, is in oom_retry.cpp; the tracking adaptor's Python call sites in
// python_sites.cpp.
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"
#include "gpumem/adaptors/deferred_free.hpp"
#include "gpumem/adaptors/limiting.hpp"
#include "gpumem/adaptors/logging.hpp"
#include "gpumem/adaptors/statistics.hpp"
#include "gpumem/adaptors/thread_safe.hpp"
#include "gpumem/adaptors/tracking.hpp"
#include "python_sites.hpp"

namespace gpumem::python {

nb::dict counters_dict(const allocation_counters& c) {
  nb::dict d;
  d["current_bytes"] = c.current_bytes;
  d["peak_bytes"] = c.peak_bytes;
  d["total_bytes"] = c.total_bytes;
  d["current_count"] = c.current_count;
  d["peak_count"] = c.peak_count;
  d["total_count"] = c.total_count;
  return d;
}

namespace {

using resource_ptr = std::shared_ptr<memory_resource>;

// statistics_options::name is a C string the adaptor keeps (its exit report may
// run after the adaptor's Python object is gone): names live for the process.
const char* interned(const std::string& name) {
  static std::mutex mutex;
  static auto* names = new std::set<std::string>;  // never destroyed: exit reports read them
  std::lock_guard lock(mutex);
  return names->insert(name).first->c_str();
}

// A `with` block around push_scope / pop_scope: the scope's counters once it ends.
struct statistics_scope {
  nb::object adaptor;           // the StatisticsAdaptor
  nb::object counters;          // None until the block ends
  bool entered = false;
};

// A `with` block holding a defer_cleanup of a DeferredFreeAdaptor.
struct cleanup_scope {
  nb::object adaptor;  // the DeferredFreeAdaptor, kept alive while the hold exists
  std::unique_ptr<defer_cleanup> hold;
};

nb::dict statistics_dict(const deferred_free_statistics& s) {
  nb::dict d;
  d["pending_count"] = s.pending_count;
  d["pending_bytes"] = s.pending_bytes;
  d["flushes"] = s.flushes;
  d["flushes_by_count"] = s.flushes_by_count;
  d["flushes_by_bytes"] = s.flushes_by_bytes;
  d["flushes_by_oom"] = s.flushes_by_oom;
  d["flushes_requested"] = s.flushes_requested;
  d["frees"] = s.frees;
  d["cancelled_frees"] = s.cancelled_frees;
  d["cancelled_bytes"] = s.cancelled_bytes;
  return d;
}

nb::dict allocation_dict(const tracked_allocation& a) {
  nb::dict d;
  d["ptr"] = reinterpret_cast<std::uintptr_t>(a.ptr);
  d["bytes"] = a.bytes;
  d["alignment"] = a.alignment;
  d["stream"] = reinterpret_cast<std::uintptr_t>(a.stream.handle());
  d["thread"] = a.thread;
  d["seq"] = a.seq;
  d["time_ns"] = a.time_ns;
  nb::list stack;
  for (const auto& frame : a.stack) stack.append(frame);
  d["stack"] = stack;
  d["site"] = a.site;
  nb::list python_stack;
  for (const auto& frame : a.site_frames) python_stack.append(frame);
  d["python_stack"] = python_stack;
  return d;
}

const char* event_kind_name(tracking_event_kind k) {
  switch (k) {
    case tracking_event_kind::allocate:
      return "allocate";
    case tracking_event_kind::deallocate:
      return "deallocate";
    case tracking_event_kind::out_of_memory:
      return "out_of_memory";
  }
  return "unknown";
}

nb::dict event_dict(const tracking_event& e) {
  nb::dict d;
  d["op"] = event_kind_name(e.kind);
  d["ptr"] = reinterpret_cast<std::uintptr_t>(e.ptr);
  d["bytes"] = e.bytes;
  d["stream"] = reinterpret_cast<std::uintptr_t>(e.stream.handle());
  d["thread"] = e.thread;
  d["seq"] = e.seq;
  d["time_ns"] = e.time_ns;
  d["site"] = e.site;
  d["device_free_bytes"] = e.device_free_bytes;
  return d;
}

template <class Adaptor>
std::string adaptor_repr(const char* name, const Adaptor& a, const std::string& extra = "") {
  return std::string("<gpumem.") + name + " over " + std::string(a.upstream().layer_name()) + extra + ">";
}

void bind_statistics(nb::module_& m) {
  const statistics_options defaults;
  nb::class_<statistics_adaptor, resource_adaptor>(
      m, "StatisticsAdaptor",
      "Counts what passes through it: bytes and allocations now, at their peak, and in total; "
      "scopes measure one region of a program (`with stats.scope() as s: ...; s.counters`). "
      "Cheap enough to leave on (about 1.5 ns per call over the pool). Peaks are exact while one "
      "thread at a time allocates (docs/observability.md).")
      .def(
          "__init__",
          [](statistics_adaptor* self, resource_ptr upstream, bool report_at_exit, const std::string& name) {
            statistics_options o;
            o.report_at_exit = report_at_exit;
            o.name = interned(name);
            new (self) statistics_adaptor(std::move(upstream), o);
          },
          nb::arg("upstream"), nb::kw_only(), nb::arg("report_at_exit") = defaults.report_at_exit,
          nb::arg("name") = std::string(defaults.name),
          "Counts the allocations made through it to `upstream`. report_at_exit: print the "
          "counters on stderr when the adaptor goes or the process exits, under `name`.")
      .def("statistics", [](const statistics_adaptor& a) { return counters_dict(a.statistics()); },
           "Since the adaptor was made: current_bytes, peak_bytes, total_bytes, current_count, "
           "peak_count, total_count (bytes as requested).")
      .def("push_scope", &statistics_adaptor::push_scope,
           "Starts a scope: its peak starts from what is live now, its totals from zero. Scopes "
           "nest and belong to the adaptor, not to the calling thread.")
      .def("pop_scope", [](statistics_adaptor& a) { return counters_dict(a.pop_scope()); },
           "Ends the innermost scope and returns its counters (current: live now); the enclosing "
           "scope's peak takes in this one's. LogicError without a scope.")
      .def_prop_ro("scope_depth", &statistics_adaptor::scope_depth, "Scopes open now.")
      .def(
          "scope", [](nb::handle self) { return statistics_scope{nb::borrow(self), nb::none(), false}; },
          "A context manager around push_scope() and pop_scope(): after the `with` block its "
          "`counters` are the scope's (what rmm.statistics calls push and pop).")
      .def("__repr__", [](const statistics_adaptor& a) {
        const allocation_counters c = a.statistics();
        return adaptor_repr("StatisticsAdaptor", a,
                            " current_bytes=" + std::to_string(c.current_bytes) +
                                " peak_bytes=" + std::to_string(c.peak_bytes));
      });

  nb::class_<statistics_scope>(m, "StatisticsScope",
                               "One scope of a StatisticsAdaptor, as a context manager (StatisticsAdaptor.scope()).")
      .def(
          "__enter__",
          [](nb::handle self) {
            auto& s = nb::cast<statistics_scope&>(self);
            if (s.entered) throw logic_error("gpumem.StatisticsScope: a scope is entered once");
            nb::cast<statistics_adaptor&>(s.adaptor).push_scope();
            s.entered = true;
            return nb::borrow(self);
          },
          nb::sig("def __enter__(self) -> StatisticsScope"),
          "Pushes the scope; returns it.")
      .def(
          "__exit__",
          [](statistics_scope& s, nb::handle, nb::handle, nb::handle) {
            if (s.entered && s.counters.is_none()) {
              s.counters = counters_dict(nb::cast<statistics_adaptor&>(s.adaptor).pop_scope());
            }
            return false;
          },
          nb::arg("exc_type").none(), nb::arg("exc_value").none(), nb::arg("traceback").none(),
          "Pops the scope and keeps its counters.")
      .def_prop_ro("counters", [](const statistics_scope& s) { return s.counters; },
                   nb::for_getter(nb::sig("def counters(self) -> dict[str, int] | None")),
                   "The scope's counters (the keys of StatisticsAdaptor.statistics()) once the block "
                   "has ended; None before.")
      .def_prop_ro("adaptor", [](const statistics_scope& s) { return s.adaptor; },
                   nb::for_getter(nb::sig("def adaptor(self) -> StatisticsAdaptor")), "The StatisticsAdaptor.");
}

void bind_tracking(nb::module_& m) {
  const tracking_options defaults;
  nb::class_<tracking_adaptor, resource_adaptor>(
      m, "TrackingAdaptor",
      "Remembers every live allocation (size, alignment, stream, thread, order, time and "
      "optionally the allocating native stack and Python call stack) and reports what is still "
      "live: live(), leak_report(), write_snapshot() for gpumem-report; at exit when "
      "report_at_exit. With history_entries, also the last allocations, frees and "
      "out-of-memory failures in order (history(); gpumem.snapshot draws on it). Checks frees "
      "itself: a foreign or double free or a wrong size is a LogicError before the upstream is "
      "called.")
      .def(
          "__init__",
          [](tracking_adaptor* self, resource_ptr upstream, bool capture_stacks, int stack_depth,
             bool report_at_exit, nb::int_ report_limit, bool python_stacks, nb::int_ history_entries) {
            tracking_options o;  // the adaptor checks stack_depth (1 to 256)
            o.capture_stacks = capture_stacks;
            o.stack_depth = stack_depth;
            o.report_at_exit = report_at_exit;
            o.report_limit = to_size(report_limit, "gpumem.TrackingAdaptor");
            o.history_entries = to_size(history_entries, "gpumem.TrackingAdaptor");
            if (python_stacks) o.sites = python_site_hooks(stack_depth);
            new (self) tracking_adaptor(std::move(upstream), o);
          },
          nb::arg("upstream"), nb::kw_only(), nb::arg("capture_stacks") = defaults.capture_stacks,
          nb::arg("stack_depth") = defaults.stack_depth, nb::arg("report_at_exit") = defaults.report_at_exit,
          nb::arg("report_limit") = defaults.report_limit, nb::arg("python_stacks") = false,
          nb::arg("history_entries") = defaults.history_entries,
          "Tracks the allocations made through it to `upstream`. capture_stacks: record the "
          "allocating native stack, up to stack_depth frames (1 to 256); python_stacks: record "
          "the allocating Python call stack, up to stack_depth frames of the program's code, "
          "innermost first (gpumem's own modules left out; '(no Python frame)' from a thread "
          "Python does not run on); report_at_exit: a leak report on stderr when the adaptor "
          "goes or the process exits with allocations live, listing report_limit of them; "
          "history_entries: keep the last that many allocations, frees and out-of-memory "
          "failures (0: no history).")
      .def(
          "live",
          [](const tracking_adaptor& a) {
            std::vector<tracked_allocation> all;
            {
              nb::gil_scoped_release release;
              all = a.live();
            }
            nb::list out;
            for (const auto& x : all) out.append(allocation_dict(x));
            return out;
          },
          "The live allocations, oldest first, as dicts: ptr, bytes, alignment, stream, thread "
          "(gpumem's thread number, as in logs), seq, time_ns (since the adaptor was made), "
          "stack (symbolized native frames, innermost first; empty unless capture_stacks), "
          "python_stack ('file:line function', innermost first; empty unless python_stacks) and "
          "site (the Python call site's id, the same for the same stack; 0 without one).")
      .def_prop_ro("live_count", &tracking_adaptor::live_count, "Allocations live now.")
      .def_prop_ro("live_bytes", &tracking_adaptor::live_bytes, "Bytes live now (as requested).")
      .def(
          "leak_report",
          [](const tracking_adaptor& a) {
            nb::gil_scoped_release release;
            return a.leak_report();
          },
          "The leak report as text: what is live, oldest first, with its Python and native "
          "frames; empty when nothing is.")
      .def(
          "write_snapshot",
          [](const tracking_adaptor& a, const std::filesystem::path& path) {
            const std::string p = path.string();
            nb::gil_scoped_release release;
            a.write_snapshot(p);
          },
          nb::arg("path"),
          "Writes the live allocations as an event log (source 'snapshot'; docs/observability.md) "
          "that gpumem-report draws; the site column is the innermost Python frame with "
          "python_stacks. LogicError when the file cannot be written.")
      .def(
          "history",
          [](const tracking_adaptor& a) {
            std::vector<tracking_event> all;
            {
              nb::gil_scoped_release release;
              all = a.history();
            }
            nb::list out;
            for (const auto& e : all) out.append(event_dict(e));
            return out;
          },
          "The history, oldest first (empty without history_entries), as dicts: op ('allocate', "
          "'deallocate' or 'out_of_memory'), ptr (0 for out_of_memory), bytes, stream, thread, "
          "seq (the allocation's number; a free names the allocation it ends), time_ns (since the "
          "adaptor was made), site (the call's Python site id, see gpumem._core._python_site_frames), "
          "device_free_bytes (out_of_memory: what the device reported free). An allocation is "
          "recorded after it succeeded, a free before it is handed on.")
      .def_prop_ro("history_dropped", &tracking_adaptor::history_dropped,
                   "Events the history let go of (the oldest, once history_entries were kept).")
      .def("clear_history", &tracking_adaptor::clear_history, "Empties the history.")
      .def_prop_ro("history_entries", [](const tracking_adaptor& a) { return a.options().history_entries; },
                   "How many events the history keeps (0: none).")
      .def_prop_ro(
          "python_stacks", [](const tracking_adaptor& a) { return static_cast<bool>(a.options().sites.capture); },
          "Whether Python call stacks are recorded.")
      .def("__repr__", [](const tracking_adaptor& a) {
        return adaptor_repr("TrackingAdaptor", a,
                            " live_count=" + std::to_string(a.live_count()) +
                                " live_bytes=" + std::to_string(a.live_bytes()));
      });
}

void bind_logging(nb::module_& m) {
  const logging_options defaults;
  nb::class_<logging_adaptor, resource_adaptor>(
      m, "LoggingAdaptor",
      "Writes every allocate and deallocate through it, with its outcome, to a CSV event log "
      "(columns seq,time_ns,thread,device,stream,source,op,ptr,bytes,alignment,outcome,site; "
      "docs/observability.md), which gpumem-replay and gpumem-report read. Rows are written in "
      "batches (flush() writes them now) and grouped by thread: sort by seq.")
      .def(
          "__init__",
          [](logging_adaptor* self, resource_ptr upstream, std::optional<std::filesystem::path> path,
             const logging_adaptor* log, const std::string& source, bool capture_sites) {
            if (path.has_value() == (log != nullptr)) {
              throw logic_error("gpumem.LoggingAdaptor: give either a path or log= (another "
                                "LoggingAdaptor whose log to share), not " +
                                std::string(path ? "both" : "neither"));
            }
            logging_options o;
            o.source = source;
            o.capture_sites = capture_sites;
            if (path) {
              const std::string p = path->string();
              new (self) logging_adaptor(std::move(upstream), p, o);
            } else {
              new (self) logging_adaptor(std::move(upstream), log->log(), o);
            }
          },
          nb::arg("upstream"), nb::arg("path").none() = nb::none(), nb::kw_only(),
          nb::arg("log").none() = nb::none(), nb::arg("source") = defaults.source,
          nb::arg("capture_sites") = defaults.capture_sites,
          "Logs the calls made through it to `upstream` into a new log at `path` (created or "
          "truncated; '%p' becomes the process id), or into the log of another LoggingAdaptor "
          "(log=; e.g. one under a pool with source='upstream', as GPUMEM_CONF's log= does). "
          "source: the source column (1 to 64 characters); capture_sites: fill the site column "
          "with the first native caller outside gpumem.")
      .def(
          "flush",
          [](logging_adaptor& a) {
            nb::gil_scoped_release release;
            a.flush();
          },
          "Writes every event recorded so far, from every thread, to the file.")
      .def_prop_ro("path", [](const logging_adaptor& a) { return a.log()->path(); }, "The log's file.")
      .def_prop_ro("events", [](const logging_adaptor& a) { return a.log()->events(); },
                   "Events recorded in the log so far (written or not), by every adaptor sharing it.")
      .def("__repr__", [](const logging_adaptor& a) {
        return adaptor_repr("LoggingAdaptor", a, " path=" + a.log()->path());
      });
}

void bind_limiting(nb::module_& m) {
  nb::class_<limiting_adaptor, resource_adaptor>(
      m, "LimitingAdaptor",
      "A hard cap on the bytes live through it: a request that would pass limit_bytes is an "
      "OutOfMemoryError at once, naming the limit, without calling the upstream. Bytes count as "
      "requested rounded up to 256. available_bytes() is capped by what the limit has left.")
      .def(
          "__init__",
          [](limiting_adaptor* self, resource_ptr upstream, nb::int_ limit_bytes) {
            new (self) limiting_adaptor(std::move(upstream), to_size(limit_bytes, "gpumem.LimitingAdaptor"));
          },
          nb::arg("upstream"), nb::arg("limit_bytes"),
          "At most `limit_bytes` (above 0) live through it to `upstream`.")
      .def_prop_ro("limit_bytes", &limiting_adaptor::limit_bytes, "The cap.")
      .def_prop_ro("used_bytes", &limiting_adaptor::used_bytes, "Bytes live now, as counted against the cap.")
      .def("__repr__", [](const limiting_adaptor& a) {
        return adaptor_repr("LimitingAdaptor", a,
                            " limit_bytes=" + std::to_string(a.limit_bytes()) +
                                " used_bytes=" + std::to_string(a.used_bytes()));
      });
}

void bind_deferred_free(nb::module_& m) {
  nb::class_<deferred_free_adaptor, resource_adaptor>(
      m, "DeferredFreeAdaptor",
      "Numba's deallocation strategy over any resource: frees are queued and handed to the "
      "upstream together once more than max_pending_count frees or max_pending_bytes are queued; "
      "an allocation that runs out of memory flushes and retries once; defer_cleanup() holds "
      "every free. Frees stay stream-ordered (docs/observability.md, deferred_free_adaptor).")
      .def(
          "__init__",
          [](deferred_free_adaptor* self, resource_ptr upstream, std::optional<nb::int_> max_pending_count,
             std::optional<double> max_pending_ratio) {
            deferred_free_options o = deferred_free_options::from_environment();
            if (max_pending_count) o.max_pending_count = to_size(*max_pending_count, "gpumem.DeferredFreeAdaptor");
            if (max_pending_ratio) o.max_pending_ratio = *max_pending_ratio;
            new (self) deferred_free_adaptor(std::move(upstream), o);
          },
          nb::arg("upstream"), nb::kw_only(), nb::arg("max_pending_count").none() = nb::none(),
          nb::arg("max_pending_ratio").none() = nb::none(),
          "Defers the frees made through it to `upstream`. max_pending_count (None: "
          "GPUMEM_MAX_PENDING_DEALLOCS_COUNT, default 10) and max_pending_ratio of the device's "
          "memory, in (0, 1] (None: GPUMEM_MAX_PENDING_DEALLOCS_RATIO, default 0.2): a free that "
          "makes the queue pass either flushes it. LogicError for a ratio outside (0, 1].")
      .def(
          "flush",
          [](deferred_free_adaptor& a) {
            nb::gil_scoped_release release;
            a.flush();
          },
          "Hands every queued free to the upstream now, inside defer_cleanup() too. The first "
          "upstream error is raised (the rest of the queue is cancelled and counted).")
      .def_prop_ro("max_pending_count", &deferred_free_adaptor::max_pending_count,
                   "A free that makes the queue hold more frees than this flushes it.")
      .def_prop_ro("max_pending_bytes", &deferred_free_adaptor::max_pending_bytes,
                   "max_pending_ratio x the device's total memory: more queued bytes flush.")
      .def_prop_ro("cleanup_deferrals", &deferred_free_adaptor::cleanup_deferrals,
                   "defer_cleanup() blocks open now.")
      .def("statistics", [](const deferred_free_adaptor& a) { return statistics_dict(a.statistics()); },
           "pending_count, pending_bytes, flushes (and flushes_by_count, flushes_by_bytes, "
           "flushes_by_oom, flushes_requested), frees handed over, cancelled_frees, cancelled_bytes.")
      .def(
          "defer_cleanup", [](nb::handle self) { return cleanup_scope{nb::borrow(self), nullptr}; },
          "A context manager (nestable) during which no free is handed to the upstream (as "
          "numba.cuda.defer_cleanup); when the outermost ends, the queue is flushed if it is past "
          "a limit.")
      .def("__repr__", [](const deferred_free_adaptor& a) {
        return adaptor_repr("DeferredFreeAdaptor", a,
                            " pending_count=" + std::to_string(a.statistics().pending_count));
      });

  nb::class_<cleanup_scope>(m, "DeferCleanup", "A defer_cleanup block of a DeferredFreeAdaptor.")
      .def(
          "__enter__",
          [](nb::handle self) {
            auto& s = nb::cast<cleanup_scope&>(self);
            if (s.hold) throw logic_error("gpumem.DeferCleanup: the block is already entered");
            s.hold = std::make_unique<defer_cleanup>(nb::cast<deferred_free_adaptor&>(s.adaptor));
            return nb::borrow(self);
          },
          nb::sig("def __enter__(self) -> DeferCleanup"),
          "Holds every free of the adaptor until the block ends.")
      .def(
          "__exit__",
          [](cleanup_scope& s, nb::handle, nb::handle, nb::handle) {
            std::unique_ptr<defer_cleanup> hold = std::move(s.hold);
            nb::gil_scoped_release release;
            hold.reset();  // may flush; errors are reported on stderr, never raised
            return false;
          },
          nb::arg("exc_type").none(), nb::arg("exc_value").none(), nb::arg("traceback").none(),
          "Ends the hold; the outermost flushes a queue that is past a limit.");
}

void bind_thread_safe(nb::module_& m) {
  nb::class_<thread_safe_adaptor, resource_adaptor>(
      m, "ThreadSafeAdaptor",
      "One lock around every allocate and deallocate of a resource that is not thread-safe "
      "(properties.thread_safe becomes True). gpumem's own resources do not need it.")
      .def(
          "__init__",
          [](thread_safe_adaptor* self, resource_ptr upstream) {
            new (self) thread_safe_adaptor(std::move(upstream));
          },
          nb::arg("upstream"), "Serialises the calls made through it to `upstream`.")
      .def("__repr__", [](const thread_safe_adaptor& a) { return adaptor_repr("ThreadSafeAdaptor", a); });
}

}  // namespace

void bind_adaptors(nb::module_& m) {
  nb::class_<resource_adaptor, memory_resource>(
      m, "ResourceAdaptor",
      "What every adaptor shares: a MemoryResource that adds one thing to its upstream and "
      "forwards the rest (properties and the capabilities: available_bytes, "
      "release_free_memory). An adaptor is equal only to itself: memory goes back through the "
      "adaptor that gave it.")
      .def_prop_ro(
          "upstream",
          [](nb::handle self) -> nb::object {
            const auto& a = nb::cast<const resource_adaptor&>(self);
            if (a.shared_upstream()) return nb::cast(a.shared_upstream());
            return nb::cast(&a.upstream(), nb::rv_policy::reference_internal, self);
          },
          nb::for_getter(nb::sig("def upstream(self) -> MemoryResource")),
          "The resource under the adaptor (kept alive by it).");
  bind_statistics(m);
  bind_tracking(m);
  bind_python_sites(m);
  bind_logging(m);
  bind_limiting(m);
  bind_deferred_free(m);
  bind_thread_safe(m);
}

}  // namespace gpumem::python
