// gpumem.HostRegistration: host memory the program already has (any C-contiguous
// buffer-protocol object: a bytearray, a numpy array, a memoryview) page-locked
// with cuMemHostRegister for as long as the object is registered, usually the
// body of a `with` block (docs/resources.md, host_registration).
//
// Note [Registrations hold the exporter's buffer]
// The registration holds a Py_buffer of the object from registration to
// unregistration. That keeps the object alive and stops it from moving its memory
// meanwhile (a bytearray refuses to resize while a buffer is exported), so the
// driver never keeps pages locked that the object no longer owns. The buffer is
// released only after the driver has unregistered the range.
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "bindings.hpp"
#include "gpumem/host_registration.hpp"

namespace gpumem::python {
namespace {

struct py_host_registration {
  Py_buffer view{};
  bool has_view = false;
  nb::object owner;  // the registered object, for `obj`
  host_registration reg;

  py_host_registration() = default;
  py_host_registration(const py_host_registration&) = delete;
  py_host_registration& operator=(const py_host_registration&) = delete;

  // Unregisters, then lets the buffer go (Note [Registrations hold the exporter's buffer]).
  void close() {
    if (reg.registered()) {
      try {
        nb::gil_scoped_release release;
        reg.release();
      } catch (...) {
        if (!reg.registered()) drop_view();  // the driver no longer knew the range: nothing is locked
        throw;
      }
    }
    drop_view();
  }

  void drop_view() noexcept {
    if (has_view) {
      PyBuffer_Release(&view);
      has_view = false;
    }
    owner = nb::object();
  }

  ~py_host_registration() {
    // The host_registration's destructor unregisters (and reports a failure on
    // stderr: destructors never throw); only then may the buffer go.
    if (reg.registered()) {
      nb::gil_scoped_release release;
      reg = host_registration();
    }
    drop_view();
  }
};

void construct(py_host_registration* self, nb::handle obj, bool mapped, bool portable, bool read_only,
               std::optional<int> device) {
  Py_buffer view{};
  const int flags = PyBUF_ANY_CONTIGUOUS | (read_only ? 0 : PyBUF_WRITABLE);
  if (PyObject_GetBuffer(obj.ptr(), &view, flags) != 0) throw nb::python_error();
  registration_options o;
  o.mapped = mapped;
  o.portable = portable;
  o.read_only = read_only;
  host_registration reg;
  try {
    nb::gil_scoped_release release;
    reg = host_registration(view.buf, static_cast<std::size_t>(view.len), o, device.value_or(-1));
  } catch (...) {
    PyBuffer_Release(&view);
    throw;
  }
  auto* r = new (self) py_host_registration();
  r->view = view;
  r->has_view = true;
  r->owner = nb::borrow(obj);
  r->reg = std::move(reg);
}

std::string repr(const py_host_registration& r) {
  if (!r.reg.registered()) return "<gpumem.HostRegistration closed>";
  char buf[128];
  std::snprintf(buf, sizeof buf, "<gpumem.HostRegistration ptr=0x%zx size=%zu device=%d%s>",
                reinterpret_cast<std::size_t>(r.reg.data()), r.reg.size(), r.reg.device(),
                r.reg.options().mapped ? " mapped" : "");
  return std::string(buf);
}

}  // namespace

void bind_host_registration(nb::module_& m) {
  const registration_options defaults;
  nb::class_<py_host_registration>(
      m, "HostRegistration",
      "Existing host memory page-locked (cuMemHostRegister) until close() or the end of a `with` "
      "block: copies to and from it run at full speed and, when mapped, device work reads and "
      "writes it in place. The object (any C-contiguous buffer: bytearray, numpy array, "
      "memoryview; writable unless read_only) is held and cannot resize while registered.\n\n"
      "    with gpumem.HostRegistration(array, mapped=True) as reg:\n"
      "        launch(reg.device_pointer, reg.size)")
      .def("__init__", &construct, nb::arg("obj"), nb::kw_only(), nb::arg("mapped") = defaults.mapped,
           nb::arg("portable") = defaults.portable, nb::arg("read_only") = defaults.read_only,
           nb::arg("device") = nb::none(),
           "Registers the memory of `obj` in `device`'s context (None: the current device). "
           "mapped: device_pointer is available; portable: page-locked for every context; "
           "read_only: the device only reads it (obj may then be read-only, e.g. bytes). "
           "LogicError for an empty buffer or memory already registered or pinned.")
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); },
           nb::sig("def __enter__(self) -> HostRegistration"), "Returns the registration.")
      .def(
          "__exit__",
          [](py_host_registration& r, nb::handle, nb::handle, nb::handle) {
            r.close();
            return false;
          },
          nb::arg("exc_type").none(), nb::arg("exc_value").none(), nb::arg("traceback").none(),
          "Unregisters (close()).")
      .def("close", &py_host_registration::close,
           "Unregisters now and lets the object go; idempotent. LogicError when the driver no "
           "longer knows the range.")
      .def_prop_ro("registered", [](const py_host_registration& r) { return r.reg.registered(); },
                   "True until close().")
      .def_prop_ro("obj", [](const py_host_registration& r) { return r.owner.is_valid() ? r.owner : nb::none(); },
                   "The registered object (None after close()).")
      .def_prop_ro("ptr", [](const py_host_registration& r) { return reinterpret_cast<std::uintptr_t>(r.reg.data()); },
                   "The host address of the registered range (0 after close()).")
      .def_prop_ro("size", [](const py_host_registration& r) { return r.reg.size(); }, "Bytes registered.")
      .def_prop_ro("device", [](const py_host_registration& r) { return r.reg.device(); },
                   "The device in whose context the memory is registered.")
      .def_prop_ro("mapped", [](const py_host_registration& r) { return r.reg.options().mapped; },
                   "CU_MEMHOSTREGISTER_DEVICEMAP.")
      .def_prop_ro("portable", [](const py_host_registration& r) { return r.reg.options().portable; },
                   "CU_MEMHOSTREGISTER_PORTABLE.")
      .def_prop_ro("read_only", [](const py_host_registration& r) { return r.reg.options().read_only; },
                   "CU_MEMHOSTREGISTER_READ_ONLY.")
      .def_prop_ro(
          "device_pointer",
          [](const py_host_registration& r) { return reinterpret_cast<std::uintptr_t>(r.reg.device_pointer()); },
          "The address device work uses for the start of the range (mapped registrations only; "
          "LogicError otherwise).")
      .def("__repr__", &repr);
}

}  // namespace gpumem::python
