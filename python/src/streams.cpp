// Streams from Python: gpumem.Stream (owns a driver stream) and the one
// conversion every stream-taking call uses (to_stream).
//
// Accepted wherever a stream is taken (docs/python.md, "Streams"):
//   None                  the legacy default stream
//   gpumem.Stream         its handle; the buffer or call keeps the Stream alive
//   int                   a raw CUstream handle: 0 (the NULL stream, i.e. the legacy
//                         default), 1 (CU_STREAM_LEGACY), 2 (CU_STREAM_PER_THREAD) or a
//                         stream the caller keeps alive
//   obj.__cuda_stream__   the CUDA Python stream protocol: (version 0, handle); a method
//                         (cuda.core, PyTorch, ...) or a plain attribute
#include <cstdio>
#include <optional>
#include <string>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "bindings.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/error.hpp"
#include "gpumem/stream.hpp"

namespace gpumem::python {
namespace {

CUstream from_int(nb::handle obj) {
  const long long v = PyLong_AsLongLong(obj.ptr());
  if (v == -1 && PyErr_Occurred()) throw nb::python_error();
  if (v < 0) throw logic_error("gpumem: a stream handle cannot be negative (" + std::to_string(v) + ")");
  return reinterpret_cast<CUstream>(static_cast<std::uintptr_t>(v));
}

}  // namespace

std::size_t to_size(nb::handle obj, const char* where) {
  if (PyBool_Check(obj.ptr()) || PyUnicode_Check(obj.ptr()) || PyBytes_Check(obj.ptr()) || PyFloat_Check(obj.ptr())) {
    throw nb::type_error((std::string(where) + ": the size must be an int, not " + Py_TYPE(obj.ptr())->tp_name).c_str());
  }
  nb::object index = nb::steal(PyNumber_Index(obj.ptr()));
  if (!index.is_valid()) {
    PyErr_Clear();
    throw nb::type_error((std::string(where) + ": the size must be an int, not " + Py_TYPE(obj.ptr())->tp_name).c_str());
  }
  int overflow = 0;
  const long long small = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow < 0 || (overflow == 0 && small < 0)) {
    throw logic_error(std::string(where) + ": the size must be >= 0, not " + nb::str(index).c_str());
  }
  if (overflow == 0) return static_cast<std::size_t>(small);
  const unsigned long long big = PyLong_AsUnsignedLongLong(index.ptr());
  if (big == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    throw logic_error(std::string(where) + ": the size " + nb::str(index).c_str() + " is past 2^64 - 1");
  }
  return static_cast<std::size_t>(big);
}

stream_arg to_stream(nb::handle obj) {
  if (obj.is_none()) return {};
  if (nb::isinstance<gpumem::stream>(obj)) {
    return {nb::cast<gpumem::stream&>(obj).handle(), nb::borrow(obj)};
  }
  if (PyLong_Check(obj.ptr()) && !PyBool_Check(obj.ptr())) return {from_int(obj), nb::object()};
  if (nb::hasattr(obj, "__cuda_stream__")) {
    nb::object proto = obj.attr("__cuda_stream__");
    if (PyCallable_Check(proto.ptr())) proto = proto();
    if (!nb::isinstance<nb::tuple>(proto) || nb::len(proto) != 2 ||
        !PyLong_Check(nb::handle(proto[0]).ptr()) || !PyLong_Check(nb::handle(proto[1]).ptr())) {
      throw nb::type_error("gpumem: __cuda_stream__ must return a (version, handle) tuple of ints");
    }
    if (nb::cast<long long>(proto[0]) != 0) {
      throw nb::type_error(("gpumem: __cuda_stream__ protocol version " +
                            std::to_string(nb::cast<long long>(proto[0])) +
                            " is not supported (only 0)").c_str());
    }
    return {from_int(proto[1]), nb::borrow(obj)};
  }
  std::string type_name = nb::cast<std::string>(nb::str(obj.type().attr("__name__")));
  throw nb::type_error(("gpumem: expected a stream (None, a gpumem.Stream, an int handle, or an "
                        "object with __cuda_stream__), got " + type_name).c_str());
}

std::uintptr_t protocol_stream_value(CUstream handle) noexcept {
  if (handle == nullptr || handle == CU_STREAM_LEGACY) return 1;
  if (handle == CU_STREAM_PER_THREAD) return 2;
  return reinterpret_cast<std::uintptr_t>(handle);
}

void bind_streams(nb::module_& m) {
  m.attr("LEGACY_DEFAULT_STREAM") = reinterpret_cast<std::uintptr_t>(CU_STREAM_LEGACY);
  m.attr("PER_THREAD_DEFAULT_STREAM") = reinterpret_cast<std::uintptr_t>(CU_STREAM_PER_THREAD);

  nb::class_<gpumem::stream>(m, "Stream", nb::is_weak_referenceable(),
                             "A CUDA stream owned by gpumem (destroyed with the object; work already "
                             "queued still runs). Implements __cuda_stream__.")
      .def(
          "__init__",
          [](gpumem::stream* self, std::optional<int> device, bool non_blocking, int priority) {
            new (self) gpumem::stream(device.value_or(-1),
                                      non_blocking ? gpumem::stream::flags::non_blocking
                                                   : gpumem::stream::flags::blocking,
                                      priority);
          },
          nb::arg("device") = nb::none(), nb::arg("non_blocking") = true, nb::arg("priority") = 0,
          "A new stream on `device` (None: the current device). Non-blocking streams do not "
          "synchronize with the legacy default stream.")
      .def_prop_ro("handle", [](const gpumem::stream& s) { return reinterpret_cast<std::uintptr_t>(s.handle()); },
                   "The CUstream handle as an int.")
      .def_prop_ro("device", &gpumem::stream::device, "The device the stream belongs to.")
      .def("synchronize", [](const gpumem::stream& s) {
             nb::gil_scoped_release release;
             s.synchronize();
           }, "Waits until all work queued on the stream has completed.")
      .def("ready", &gpumem::stream::ready, "True when all work queued on the stream has completed.")
      .def("__cuda_stream__", [](const gpumem::stream& s) {
             return nb::make_tuple(0, reinterpret_cast<std::uintptr_t>(s.handle()));
           }, "The CUDA Python stream protocol: (0, handle).")
      .def("__int__", [](const gpumem::stream& s) { return reinterpret_cast<std::uintptr_t>(s.handle()); })
      .def("__repr__", [](const gpumem::stream& s) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "<gpumem.Stream handle=0x%zx device=%d>",
                      reinterpret_cast<std::size_t>(s.handle()), s.device());
        return std::string(buf);
      });

  m.def(
      "_stream_handle",
      [](nb::handle obj) { return reinterpret_cast<std::uintptr_t>(to_stream(obj).handle); },
      nb::arg("stream").none(),
      "The raw handle gpumem uses for a stream argument (for tests and tools).");
}

}  // namespace gpumem::python
