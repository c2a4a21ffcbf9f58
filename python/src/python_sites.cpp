// Python call sites for the tracking adaptor: the hooks of tracking_options::sites
// that TrackingAdaptor(python_stacks=True) installs (and gpumem.snapshot with it).
//
// Note [Python call sites]
// capture() runs inside the adaptor's allocate (and free, with a history), on the
// allocating thread, which may be:
//  - a thread that holds the GIL (PyTorch's allocations from Python code, CuPy's):
//    the frames are read at once;
//  - a Python thread that released it (every gpumem entry point releases the GIL
//    around allocate; PyTorch's autograd threads hold a thread state and no GIL):
//    the GIL is taken for the walk (PyGILState_Ensure, as tracemalloc does for raw
//    allocations) and given back;
//  - a thread Python has never run on (a C++ library's worker): the interpreter is
//    not touched (no thread state is made, no GIL is waited for) and the site is
//    "(no Python frame)". So is a thread with no Python frame on its stack, and
//    every call after the interpreter's exit began (atexit).
// The walk is the public frame API (PyThreadState_GetFrame, PyFrame_GetBack,
// PyFrame_GetCode, PyFrame_GetLineNumber: Python 3.9 and later), innermost first.
// Frames of gpumem's own Python modules (gpumem.numba's memalloc, ...) at the
// innermost end are left out: a site is the program's code. At most stack_depth
// frames are kept.
//
// Interning keeps the hook cheap and the adaptor's records small: a frame is
// (code object, line) and a site is the list of its frames; each distinct one is
// stored once, as text, and a site is an id (2, 3, ...; 1 is "(no Python frame)").
// The table holds a reference to every code object it has seen, so that an address
// is never reused by another code object while the table knows it; code objects
// are few (one per function) and the table lives as long as the process, because
// leak reports at exit describe sites after Python has gone. describe() reads only
// the table (its own mutex, no GIL), so it is safe from any thread at any time.
//
// The frames are collected before the table's mutex is taken, and nothing under
// that mutex can run Python code: making a frame object can start the garbage
// collector, whose finalizers may free a buffer and so call this hook again on the
// same thread.
#include <atomic>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"  // Python.h first
#include "gpumem/adaptors/tracking.hpp"
#include "python_sites.hpp"

#include <frameobject.h>

namespace gpumem::python {
namespace {

constexpr std::uint64_t no_python_frame = 1;
constexpr const char* no_python_frame_text = "(no Python frame)";
constexpr int most_skipped = 16;  // gpumem's own frames at the innermost end: never more

struct code_info {
  std::string filename;
  std::string name;
  bool gpumem = false;  // one of gpumem's own Python modules
};

struct frame_key_hash {
  std::size_t operator()(const std::pair<PyObject*, int>& k) const noexcept {
    return std::hash<const void*>()(k.first) ^ (static_cast<std::size_t>(k.second) * 0x9E3779B97F4A7C15ULL);
  }
};

struct site_table {
  std::mutex mutex;
  std::string gpumem_folder;  // ".../gpumem/": frames under it are gpumem's
  std::unordered_map<PyObject*, code_info> codes;  // each code object referenced for good
  std::unordered_map<std::pair<PyObject*, int>, std::uint32_t, frame_key_hash> frame_ids;
  std::vector<python_frame> frames;
  std::map<std::vector<std::uint32_t>, std::uint64_t> site_ids;
  std::vector<std::vector<std::uint32_t>> sites;  // site id - 2
};

site_table& table() {
  static auto* t = new site_table;  // never destroyed: leak reports at exit describe sites
  return *t;
}

std::atomic<bool> python_running{false};  // hooks made, and the interpreter's exit not begun

std::string utf8(PyObject* text) {
  if (text == nullptr || !PyUnicode_Check(text)) return "?";
  Py_ssize_t n = 0;
  const char* s = PyUnicode_AsUTF8AndSize(text, &n);
  if (s == nullptr) {
    PyErr_Clear();
    return "?";
  }
  return std::string(s, static_cast<std::size_t>(n));
}

// The code objects of walked frames, each a new reference, dropped at the end of the scope.
struct walked_frames {
  std::vector<std::pair<PyObject*, int>> frames;  // (code object, line), innermost first
  walked_frames() = default;
  walked_frames(const walked_frames&) = delete;
  walked_frames& operator=(const walked_frames&) = delete;
  ~walked_frames() {
    for (const auto& f : frames) Py_DECREF(f.first);
  }
};

// With the GIL: the innermost `limit` frames of the calling thread.
void walk_frames(std::size_t limit, walked_frames& out) {
  out.frames.reserve(limit);
  PyFrameObject* f = PyThreadState_GetFrame(PyThreadState_Get());  // new reference or null
  while (f != nullptr && out.frames.size() < limit) {
    out.frames.emplace_back(reinterpret_cast<PyObject*>(PyFrame_GetCode(f)), PyFrame_GetLineNumber(f));
    PyFrameObject* back = PyFrame_GetBack(f);
    Py_DECREF(f);
    f = back;
  }
  Py_XDECREF(f);
}

// With the GIL held, no table lock held: Note [Python call sites].
std::uint64_t capture_holding_gil(std::size_t depth) {
  walked_frames walked;  // its references are dropped after the table's lock
  walk_frames(depth + most_skipped, walked);
  site_table& t = table();
  std::lock_guard lock(t.mutex);
  std::vector<std::uint32_t> site;
  bool leading = true;  // still among gpumem's own innermost frames
  for (const auto& [code, line] : walked.frames) {
    auto c = t.codes.find(code);
    if (c == t.codes.end()) {
      auto* co = reinterpret_cast<PyCodeObject*>(code);
      code_info info{utf8(co->co_filename), utf8(co->co_name), false};
      info.gpumem = !t.gpumem_folder.empty() && info.filename.compare(0, t.gpumem_folder.size(), t.gpumem_folder) == 0;
      c = t.codes.emplace(code, std::move(info)).first;
      Py_INCREF(code);  // the table's reference: Note [Python call sites]
    }
    if (leading && c->second.gpumem) continue;
    leading = false;
    if (site.size() == depth) break;
    auto [f, added] = t.frame_ids.try_emplace({code, line}, static_cast<std::uint32_t>(t.frames.size()));
    if (added) t.frames.push_back({c->second.filename, line, c->second.name});
    site.push_back(f->second);
  }
  if (site.empty()) return no_python_frame;
  auto [s, added] = t.site_ids.try_emplace(site, t.sites.size() + 2);
  if (added) t.sites.push_back(site);
  return s->second;
}

// With the GIL held: the site, leaving any exception being raised as it was (a buffer
// may be freed while one propagates), and never failing.
std::uint64_t capture_keeping_errors(std::size_t depth) noexcept {
#if PY_VERSION_HEX >= 0x030C0000
  PyObject* raised = PyErr_GetRaisedException();
#else
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
#endif
  std::uint64_t id = no_python_frame;
  try {
    id = capture_holding_gil(depth);
  } catch (...) {  // no memory for the table: no site
  }
#if PY_VERSION_HEX >= 0x030C0000
  PyErr_SetRaisedException(raised);
#else
  PyErr_Restore(type, value, traceback);
#endif
  return id;
}

std::uint64_t capture(std::size_t depth) noexcept {
  if (!python_running.load(std::memory_order_acquire)) return no_python_frame;
  if (PyGILState_Check()) return capture_keeping_errors(depth);
  if (PyGILState_GetThisThreadState() == nullptr) return no_python_frame;  // not a Python thread
  const PyGILState_STATE gil = PyGILState_Ensure();
  const std::uint64_t id =
      python_running.load(std::memory_order_acquire) ? capture_keeping_errors(depth) : no_python_frame;
  PyGILState_Release(gil);
  return id;
}

std::vector<std::string> describe(std::uint64_t id) {
  if (id == 0) return {};
  if (id == no_python_frame) return {no_python_frame_text};
  std::vector<std::string> out;
  for (const python_frame& f : python_site_frames(id)) {
    out.push_back(f.filename + ":" + std::to_string(f.line) + " " + f.name);
  }
  return out;
}

}  // namespace

std::vector<python_frame> python_site_frames(std::uint64_t id) {
  if (id == no_python_frame) return {{no_python_frame_text, 0, ""}};
  site_table& t = table();
  std::lock_guard lock(t.mutex);
  if (id < 2 || id - 2 >= t.sites.size()) return {};
  std::vector<python_frame> out;
  for (std::uint32_t f : t.sites[id - 2]) out.push_back(t.frames[f]);
  return out;
}

tracking_site_hooks python_site_hooks(int stack_depth) {
  static bool started = false;  // under the GIL (a second start while an import lets it go is harmless)
  if (!started) {
    // gpumem's package folder (this extension's), and the end of capture at exit.
    nb::object file = nb::module_::import_("gpumem._core").attr("__file__");
    nb::object folder = nb::module_::import_("os.path").attr("dirname")(file);
    {
      site_table& t = table();
      std::lock_guard lock(t.mutex);
      t.gpumem_folder = nb::cast<std::string>(folder) + "/";
    }
    nb::module_::import_("atexit").attr("register")(
        nb::cpp_function([] { python_running.store(false, std::memory_order_release); }));
    python_running.store(true, std::memory_order_release);
    started = true;
  }
  const auto depth = static_cast<std::size_t>(stack_depth < 1 ? 1 : stack_depth);
  tracking_site_hooks h;
  h.capture = [depth] { return capture(depth); };
  h.describe = describe;
  return h;
}

void bind_python_sites(nb::module_& m) {
  m.def(
      "_python_site_frames",
      [](std::uint64_t site) {
        std::vector<std::tuple<std::string, int, std::string>> out;
        for (const python_frame& f : python_site_frames(site)) out.emplace_back(f.filename, f.line, f.name);
        return out;
      },
      nb::arg("site"),
      "The frames of a Python call site id (TrackingAdaptor.live()'s and history()'s 'site'), "
      "innermost first, as (filename, line, function); [] for 0 or an unknown id.");
  m.def(
      "_allocate_on_a_native_thread",
      [](std::shared_ptr<memory_resource> resource, std::size_t bytes) {
        nb::gil_scoped_release release;
        void* p = nullptr;
        std::exception_ptr failed;
        std::thread([&] {  // a thread Python has never run on, as a C++ library's worker
          try {
            p = resource->allocate(bytes, stream_view{});
          } catch (...) {
            failed = std::current_exception();
          }
        }).join();
        if (failed) std::rethrow_exception(failed);
        return reinterpret_cast<std::uintptr_t>(p);
      },
      nb::arg("resource"), nb::arg("bytes"),
      "Allocates `bytes` from `resource` on a new C++ thread that Python never ran on, on the "
      "legacy default stream, and returns the pointer (free it with resource.deallocate). For "
      "tests of Python call sites.");
}

}  // namespace gpumem::python
