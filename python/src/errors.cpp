// gpumem's C++ errors as Python exceptions.
//
//   GpumemError(Exception)                          every error gpumem raises
//   ├── CudaError(GpumemError, RuntimeError)        a driver call failed: .result, .error_name, .api
//   │   └── DriverUnavailableError(CudaError)       no driver or GPU here (GPUMEM_BACKEND=sim helps)
//   ├── OutOfMemoryError(MemoryError, GpumemError)  .requested_bytes, .device, .resource, ...
//   ├── LogicError(GpumemError, ValueError)         the caller misused the API
//   └── UnsupportedError(GpumemError, NotImplementedError)
//                                                   the backend or resource cannot do this
//
// MemoryError comes first among OutOfMemoryError's bases because it has a __new__ of its
// own: `OutOfMemoryError.__new__` must then be MemoryError's, or code that rebuilds an
// exception with `cls.__new__(cls, *args)` (tblib, which Dask uses to send a task's error
// to the client) is refused ("MemoryError.__new__(OutOfMemoryError) is not safe").
#include <string>

#include "bindings.hpp"
#include "driver/driver.hpp"
#include "gpumem/error.hpp"

namespace gpumem::python {
namespace {

struct exception_types {
  PyObject* base = nullptr;
  PyObject* cuda = nullptr;
  PyObject* driver_unavailable = nullptr;
  PyObject* out_of_memory = nullptr;
  PyObject* logic = nullptr;
  PyObject* unsupported = nullptr;
};
exception_types types;  // strong references, held for the life of the process

PyObject* make_type(nb::module_& m, const char* name, const char* doc, nb::handle bases) {
  const std::string qualified = std::string("gpumem.") + name;
  PyObject* t = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), nullptr);
  if (t == nullptr) throw nb::python_error();
  m.attr(name) = nb::handle(t);
  return t;
}

// Raises `type(message)` with the given attributes set on the instance.
template <typename Fill>
void raise(PyObject* type, const char* message, Fill&& fill) {
  nb::object exc = nb::steal(PyObject_CallFunction(type, "s", message));
  if (!exc.is_valid()) return;  // the constructor raised: leave that error set
  fill(exc);
  PyErr_SetObject(type, exc.ptr());
}

void fill_out_of_memory(nb::object& exc, const out_of_memory& e) {
  const out_of_memory_info& i = e.info();
  exc.attr("requested_bytes") = i.requested_bytes;
  exc.attr("device") = i.device;
  exc.attr("resource") = nb::str(i.resource.c_str());
  exc.attr("resource_held_bytes") = i.resource_held_bytes;
  exc.attr("device_free_bytes") = i.device_free_bytes;
  exc.attr("device_total_bytes") = i.device_total_bytes;
  exc.attr("reason") = nb::str(i.reason.c_str());
}

void raise_cuda(PyObject* type, const cuda_error& e) {
  raise(type, e.what(), [&](nb::object& exc) {
    exc.attr("result") = static_cast<int>(e.result());
    exc.attr("error_name") = nb::str(detail::error_name(e.result()).data());
    exc.attr("api") = nb::str(e.api().c_str());
  });
}

void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const out_of_memory& e) {
    raise(types.out_of_memory, e.what(), [&](nb::object& exc) { fill_out_of_memory(exc, e); });
  } catch (const driver_unavailable& e) {
    raise_cuda(types.driver_unavailable, e);
  } catch (const cuda_error& e) {
    raise_cuda(types.cuda, e);
  } catch (const logic_error& e) {
    PyErr_SetString(types.logic, e.what());
  } catch (const unsupported_error& e) {
    PyErr_SetString(types.unsupported, e.what());
  } catch (const gpumem::ipc_error& e) {
    // Bad handle bytes or a handle used in its own process are misuse; memory or a
    // system that cannot share is unsupported (docs/ipc.md).
    const bool misuse = e.code() == gpumem::ipc_errc::malformed_handle || e.code() == gpumem::ipc_errc::same_process;
    PyErr_SetString(misuse ? types.logic : types.unsupported, e.what());
  }
  // Anything else propagates to nanobind's own translators.
}

}  // namespace

nb::object out_of_memory_object(const out_of_memory& e) {
  nb::object exc = nb::steal(PyObject_CallFunction(types.out_of_memory, "s", e.what()));
  if (!exc.is_valid()) throw nb::python_error();
  fill_out_of_memory(exc, e);
  return exc;
}

void bind_errors(nb::module_& m) {
  auto tuple = [](std::initializer_list<PyObject*> items) {
    nb::list l;
    for (PyObject* o : items) l.append(nb::handle(o));
    return nb::tuple(l);
  };
  types.base = make_type(m, "GpumemError", "Base class of every error gpumem raises.",
                         nb::handle(PyExc_Exception));
  types.cuda = make_type(m, "CudaError",
                         "A CUDA driver call failed. Attributes: result (CUresult as int), "
                         "error_name, api.",
                         tuple({types.base, PyExc_RuntimeError}));
  types.driver_unavailable = make_type(
      m, "DriverUnavailableError",
      "No usable CUDA driver or GPU (set GPUMEM_BACKEND=sim for the host simulator).",
      tuple({types.cuda}));
  types.out_of_memory = make_type(
      m, "OutOfMemoryError",
      "A request could not be satisfied. Attributes: requested_bytes, device, resource, "
      "resource_held_bytes, device_free_bytes, device_total_bytes, reason.",
      tuple({PyExc_MemoryError, types.base}));
  types.logic = make_type(m, "LogicError",
                          "The caller misused the API: bad size, alignment, pointer, stream or device.",
                          tuple({types.base, PyExc_ValueError}));
  types.unsupported = make_type(m, "UnsupportedError",
                                "The backend or the resource cannot do what was asked.",
                                tuple({types.base, PyExc_NotImplementedError}));
  nb::register_exception_translator(translate);
}

}  // namespace gpumem::python
