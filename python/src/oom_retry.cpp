// gpumem.OomRetryAdaptor: Python callbacks that run when the upstream is out of
// memory (drop a cache, trim a pool, spill to the host) and say whether to retry.
//
// Note [Python callbacks run from C++]
// The adaptor calls its callbacks on the allocating thread, from inside
// do_allocate, and most callers reach it with the GIL released (every gpumem
// entry point releases it around allocate; PyTorch's and CuPy's hooks call in from
// C++; a C++ thread may hold no Python thread state at all). So the C++ callback
// takes the GIL itself (PyGILState_Ensure: re-entrant, and it makes a thread
// state for a thread that has none) before it touches a Python object, and drops
// it before it returns. No lock of the adaptor is held meanwhile, so the Python
// callback may free or allocate through any resource, this one included.
//
// The callable is held by the C++ adaptor (as a strong reference that is dropped
// under the GIL, from whichever thread drops it) until remove_callback() or the
// adaptor goes. An exception raised by the callback propagates out of the
// allocation that ran out of memory, in place of the OutOfMemoryError (which is
// its __context__). Once the interpreter is gone, callbacks are not called.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>

#include "bindings.hpp"
#include "gpumem/adaptors/oom_retry.hpp"

namespace gpumem::python {
namespace {

using resource_ptr = std::shared_ptr<memory_resource>;

// A strong reference that may be released from any thread, with or without the GIL.
struct python_ref {
  PyObject* object;
  explicit python_ref(nb::handle h) : object(h.inc_ref().ptr()) {}
  python_ref(const python_ref&) = delete;
  python_ref& operator=(const python_ref&) = delete;
  ~python_ref() {
    if (!Py_IsInitialized()) return;  // the interpreter is gone: nothing left to tell
    PyGILState_STATE g = PyGILState_Ensure();
    Py_DECREF(object);
    PyGILState_Release(g);
  }
};

// What a callback receives (OomEvent).
struct py_oom_event {
  std::size_t bytes;
  std::size_t alignment;
  std::uintptr_t stream;
  int attempt;
  nb::object error;  // the upstream's OutOfMemoryError
};

// Makes `context` the __context__ of the exception being raised (unless it has one).
void chain_to_raised(nb::object context) {
#if PY_VERSION_HEX >= 0x030C0000
  PyObject* value = PyErr_GetRaisedException();
#else
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  if (value != nullptr && traceback != nullptr) PyException_SetTraceback(value, traceback);
#endif
  if (value != nullptr) {
    PyObject* previous = PyException_GetContext(value);
    if (previous == nullptr) PyException_SetContext(value, context.release().ptr());  // steals
    else Py_DECREF(previous);
  }
#if PY_VERSION_HEX >= 0x030C0000
  PyErr_SetRaisedException(value);
#else
  PyErr_Restore(type, value, traceback);
#endif
}

bool call(const python_ref& fn, const oom_event& e) {
  if (!Py_IsInitialized()) return false;
  nb::gil_scoped_acquire gil;  // Note [Python callbacks run from C++]
  nb::object error = out_of_memory_object(e.error);
  nb::object event = nb::cast(py_oom_event{e.bytes, e.alignment, reinterpret_cast<std::uintptr_t>(e.stream.handle()),
                                           e.attempt, error});
  nb::object result = nb::steal(PyObject_CallOneArg(fn.object, event.ptr()));
  if (!result.is_valid()) {
    chain_to_raised(std::move(error));
    throw nb::python_error();  // carried to the allocating caller, raised there
  }
  const int truth = PyObject_IsTrue(result.ptr());
  if (truth < 0) throw nb::python_error();
  return truth == 1;
}

}  // namespace

void bind_oom_retry(nb::module_& m) {
  nb::class_<py_oom_event>(m, "OomEvent", "What an OomRetryAdaptor callback is told about a failed request.")
      .def_ro("bytes", &py_oom_event::bytes, "Bytes requested.")
      .def_ro("alignment", &py_oom_event::alignment, "Alignment requested.")
      .def_ro("stream", &py_oom_event::stream, "The raw handle of the stream the request was made on.")
      .def_ro("attempt", &py_oom_event::attempt, "1 on the first failure, 2 after one retry failed, ...")
      .def_ro("error", &py_oom_event::error, "The upstream's OutOfMemoryError (not raised).")
      .def("__repr__", [](const py_oom_event& e) {
        return "<gpumem.OomEvent bytes=" + std::to_string(e.bytes) + " attempt=" + std::to_string(e.attempt) + ">";
      });

  nb::class_<oom_retry_adaptor, resource_adaptor>(
      m, "OomRetryAdaptor",
      "When the upstream runs out of memory, calls the registered callbacks in the order they "
      "were added, each with an OomEvent, until one returns True; the allocation is then "
      "retried, and on another OutOfMemoryError the round starts again (attempt + 1). No "
      "callback asking, or max_retries retries, and the OutOfMemoryError reaches the caller. "
      "Callbacks run on the allocating thread with the GIL taken for them and no lock held: "
      "they may free or allocate through any resource, this one included.")
      .def(
          "__init__",
          [](oom_retry_adaptor* self, resource_ptr upstream, int max_retries) {
            new (self) oom_retry_adaptor(std::move(upstream), max_retries);
          },
          nb::arg("upstream"), nb::kw_only(), nb::arg("max_retries") = 16,
          "Retries the allocations made through it to `upstream` as its callbacks ask, at most "
          "max_retries times per request (LogicError when negative).")
      .def(
          "add_callback",
          [](oom_retry_adaptor& a, nb::handle callback) {
            if (!PyCallable_Check(callback.ptr())) {
              throw logic_error(std::string("gpumem.OomRetryAdaptor.add_callback: expected a callable, got ") +
                                Py_TYPE(callback.ptr())->tp_name);
            }
            auto fn = std::make_shared<python_ref>(callback);
            return a.add_callback([fn](const oom_event& e) { return call(*fn, e); });
          },
          nb::arg("callback"),
          nb::sig("def add_callback(self, callback: collections.abc.Callable[[OomEvent], bool]) -> int"),
          "Registers `callback(event: OomEvent) -> bool` (True: retry the allocation) and returns "
          "its id for remove_callback. The adaptor holds the callable until it is removed. An "
          "exception it raises reaches the allocating caller instead of the OutOfMemoryError.")
      .def("remove_callback", &oom_retry_adaptor::remove_callback, nb::arg("id"),
           "Removes a callback; False when no callback has that id.")
      .def_prop_ro("max_retries", &oom_retry_adaptor::max_retries, "Retries allowed per request.")
      .def("__repr__", [](const oom_retry_adaptor& a) {
        return "<gpumem.OomRetryAdaptor over " + std::string(a.upstream().layer_name()) +
               " max_retries=" + std::to_string(a.max_retries()) + ">";
      });
}

}  // namespace gpumem::python
