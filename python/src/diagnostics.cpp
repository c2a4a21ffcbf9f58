// gpumem's diagnostics (gpumem/diagnostics.hpp) routed to Python's `logging`:
// gpumem/__init__.py installs the route at import (logger "gpumem") and takes it
// down at interpreter exit, so that reports made by C++ destructors after that
// (a leak report at process exit) go to stderr as before.
//
// Note [Diagnostics into logging]
// A message may come from any thread, with or without the GIL, and from
// destructors that run while Python is still alive. The sink takes the GIL
// (PyGILState_Ensure), calls logger.log(level, "%s", message), and releases it.
// Once the route is down (atexit) or the interpreter is gone, it does not touch
// Python: the message goes to stderr. A logging call that raises (a broken
// handler) prints that error and the message to stderr; nothing propagates.
#include <atomic>
#include <cstdio>
#include <string>

#include <nanobind/stl/string.h>

#include "bindings.hpp"
#include "gpumem/diagnostics.hpp"

namespace gpumem::python {
namespace {

std::atomic<bool> routing{false};
PyObject* logger = nullptr;  // one strong reference while routing

int python_level(diagnostic_level level) {
  switch (level) {
    case diagnostic_level::debug:
      return 10;
    case diagnostic_level::info:
      return 20;
    case diagnostic_level::warning:
      return 30;
    case diagnostic_level::error:
      return 40;
  }
  return 40;
}

void to_stderr(std::string_view message) {
  std::fprintf(stderr, "%.*s\n", static_cast<int>(message.size()), message.data());
}

void to_logging(diagnostic_level level, std::string_view message) {
  if (!routing.load(std::memory_order_acquire) || !Py_IsInitialized()) {
    to_stderr(message);
    return;
  }
  const PyGILState_STATE gil = PyGILState_Ensure();
  bool logged = false;
  if (routing.load(std::memory_order_acquire) && logger != nullptr) {
    PyObject* text = PyUnicode_DecodeUTF8(message.data(), static_cast<Py_ssize_t>(message.size()), "replace");
    PyObject* result =
        text == nullptr ? nullptr : PyObject_CallMethod(logger, "log", "isO", python_level(level), "%s", text);
    Py_XDECREF(text);
    if (result != nullptr) {
      Py_DECREF(result);
      logged = true;
    } else {
      PyErr_Print();
    }
  }
  PyGILState_Release(gil);
  if (!logged) to_stderr(message);
}

}  // namespace

void bind_diagnostics(nb::module_& m) {
  m.def(
      "_route_diagnostics",
      [](nb::object target) {
        Py_XDECREF(logger);
        logger = target.release().ptr();
        routing.store(true, std::memory_order_release);
        set_diagnostic_sink(to_logging);
      },
      nb::arg("logger"),
      "Sends gpumem's diagnostics (leak reports, statistics at exit, failures in destructors) "
      "to `logger` (a logging.Logger) with their levels; gpumem's import does this for "
      "logging.getLogger('gpumem').");
  m.def(
      "_stop_routing_diagnostics",
      [] {
        routing.store(false, std::memory_order_release);
        set_diagnostic_sink({});
        Py_XDECREF(logger);
        logger = nullptr;
      },
      "Sends gpumem's diagnostics to stderr again (at interpreter exit).");
  m.def(
      "_diagnose",
      [](const std::string& level, const std::string& message) {
        diagnostic_level l = diagnostic_level::info;
        if (level == "debug") l = diagnostic_level::debug;
        else if (level == "info") l = diagnostic_level::info;
        else if (level == "warning") l = diagnostic_level::warning;
        else if (level == "error") l = diagnostic_level::error;
        else throw logic_error("gpumem._diagnose: level must be debug, info, warning or error, not " + level);
        nb::gil_scoped_release release;
        diagnose(l, message);
      },
      nb::arg("level"), nb::arg("message"), "Sends one message through gpumem's diagnostic sink (for tests).");
}

}  // namespace gpumem::python
