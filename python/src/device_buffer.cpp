// gpumem.DeviceBuffer: untyped device memory from a gpumem resource, freed
// (stream-ordered, on the stream it was allocated on) when the object goes or
// close() is called. Exports itself through __cuda_array_interface__ (v3, with
// its stream) and DLPack (__dlpack__, __dlpack_device__) as a 1-D uint8 array.
//
// Note [Buffer lifetime and streams]
// A buffer remembers its resource (a shared owner, so set_current_resource
// cannot strand it), its stream, and, when the stream came as a Python object,
// that object, so the stream outlives every free queued on it. A DLPack capsule
// holds a reference to the buffer until the consumer's deleter runs. Zero-size
// buffers allocate nothing: ptr is 0 and no resource is called (the contract
// rejects 0-byte requests; docs/python.md says why this is the Python answer).
#include <algorithm>
#include <cstdio>
#include <exception>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>

#include "bindings.hpp"
#include "dlpack.hpp"
#include "driver/driver.hpp"
#include "gpumem/current_resource.hpp"
#include "gpumem/device.hpp"
#include "gpumem/device_buffer.hpp"
#include "gpumem/error.hpp"
#include "gpumem/event.hpp"
#include "gpumem/memory_resource.hpp"

namespace gpumem::python {
namespace {

using resource_ptr = std::shared_ptr<memory_resource>;

// The Python object around gpumem::device_buffer (include/gpumem/device_buffer.hpp),
// which owns the memory: this adds the Python stream object it must keep alive,
// the device copies use for host memory, and close().
struct device_buffer {
  gpumem::device_buffer mem;  // empty for zero-size and closed buffers
  std::size_t size = 0;       // bytes, as created (kept after close)
  CUstream stream = nullptr;
  int device = 0;       // for host memory: the device whose context copies use
  bool host = false;     // pinned host memory (a resource of device -1)
  bool closed = false;
  nb::object stream_owner;   // the Python stream object, when one was given

  device_buffer() = default;
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;

  void* data() noexcept { return mem.data(); }
  const void* data() const noexcept { return mem.data(); }
  // The resource the memory came from; null for empty or closed buffers.
  std::shared_ptr<memory_resource> resource() const { return mem.data() != nullptr ? mem.resource() : nullptr; }

  // Frees now; the memory is reused after the work queued on `stream` so far.
  // The resource goes with the memory (the object holds neither afterwards).
  void close() {
    closed = true;
    gpumem::device_buffer gone = std::move(mem);
    if (gone.data() == nullptr || gone.try_release_now()) return;  // Note [Allocating without waiting]
    nb::gil_scoped_release release;
    gone.release();  // what the resource says about the free, it says here
  }

  ~device_buffer() {
    try {
      close();
    } catch (const std::exception& e) {
      // Destructors never throw; the memory stays with the resource.
      std::fprintf(stderr, "gpumem: DeviceBuffer of %zu bytes could not be freed: %s\n", size, e.what());
    }
  }

  void check_open(const char* where) const {
    if (closed) throw logic_error(std::string("gpumem.DeviceBuffer.") + where + ": the buffer was closed");
  }
};

void construct(device_buffer* self, nb::handle size_arg, nb::handle stream, std::optional<int> device,
               resource_ptr resource) {
  const std::size_t size = to_size(size_arg, "gpumem.DeviceBuffer");
  stream_arg s = to_stream(stream);
  int dev = 0;
  bool host = false;
  if (resource) {
    dev = resource->properties().device;
    if (dev < 0) {  // host memory: any device's work may use it; copies run in `device`'s context
      host = true;
      dev = device ? *device : current_device();
    } else if (device && *device != dev) {
      throw logic_error("gpumem.DeviceBuffer: device " + std::to_string(*device) +
                        " differs from the resource's device " + std::to_string(dev));
    }
  } else if (size != 0) {
    // The hot path: the current resource says its device (no second device lookup).
    if (!device) adopt_context_once(0);  // Note [A thread's first context] in system.cpp
    resource = get_current_resource(device.value_or(-1));
    dev = resource->properties().device;
  } else {
    dev = device ? *device : current_device();
  }
  gpumem::device_buffer mem;  // zero bytes: nothing allocated, no resource held
  if (size != 0) {
    // The GIL is kept when the pool serves at once (Note [Allocating without
    // waiting] in src/pool/stream_ordered_pool.hpp), released when it may wait.
    mem = gpumem::device_buffer::try_allocate_now(size, stream_view(s.handle), resource);
    if (mem.data() == nullptr) {
      nb::gil_scoped_release release;
      mem = gpumem::device_buffer(size, stream_view(s.handle), std::move(resource));
    }
  }
  device_buffer* b = new (self) device_buffer();
  b->mem = std::move(mem);
  b->size = size;
  b->stream = s.handle;
  b->device = dev;
  b->host = host;
  b->stream_owner = std::move(s.owner);
}

void copy(device_buffer& b, void* dst, const void* src, std::size_t n) {
  if (n == 0) return;
  nb::gil_scoped_release release;
  detail::device_context_guard guard(b.device);
  GPUMEM_CU(cuMemcpyAsync, reinterpret_cast<CUdeviceptr>(dst), reinterpret_cast<CUdeviceptr>(src), n,
            b.stream);
  GPUMEM_CU(cuStreamSynchronize, b.stream);
}

struct py_buffer {
  Py_buffer view{};
  py_buffer(nb::handle obj, int flags) {
    if (PyObject_GetBuffer(obj.ptr(), &view, flags) != 0) throw nb::python_error();
  }
  ~py_buffer() { PyBuffer_Release(&view); }
  py_buffer(const py_buffer&) = delete;
  py_buffer& operator=(const py_buffer&) = delete;
};

void copy_from_host(device_buffer& b, nb::handle src) {
  b.check_open("copy_from_host");
  py_buffer in(src, PyBUF_C_CONTIGUOUS);
  if (static_cast<std::size_t>(in.view.len) != b.size) {
    throw logic_error("gpumem.DeviceBuffer.copy_from_host: the source has " + std::to_string(in.view.len) +
                      " bytes, the buffer " + std::to_string(b.size));
  }
  copy(b, b.data(), in.view.buf, b.size);
}

nb::object copy_to_host(device_buffer& b, nb::handle out) {
  b.check_open("copy_to_host");
  if (out.is_none()) {
    nb::object bytes = nb::steal(PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(b.size)));
    if (!bytes.is_valid()) throw nb::python_error();
    copy(b, PyBytes_AS_STRING(bytes.ptr()), b.data(), b.size);
    return bytes;
  }
  py_buffer o(out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE);
  if (static_cast<std::size_t>(o.view.len) != b.size) {
    throw logic_error("gpumem.DeviceBuffer.copy_to_host: the destination has " + std::to_string(o.view.len) +
                      " bytes, the buffer " + std::to_string(b.size));
  }
  copy(b, o.view.buf, b.data(), b.size);
  return nb::borrow(out);
}

nb::dict cuda_array_interface(const device_buffer& b) {
  b.check_open("__cuda_array_interface__");
  nb::dict d;
  d["shape"] = nb::make_tuple(b.size);
  d["strides"] = nb::none();
  d["typestr"] = "|u1";
  d["data"] = nb::make_tuple(reinterpret_cast<std::uintptr_t>(b.data()), false);
  d["version"] = 3;
  // Consumers synchronize on the stream the memory was allocated on. An empty
  // buffer has nothing to wait for.
  if (b.size == 0) d["stream"] = nb::none();
  else d["stream"] = protocol_stream_value(b.stream);
  return d;
}

// ---- DLPack ---------------------------------------------------------------

struct export_context {
  std::int64_t shape[1];
  std::int64_t strides[1];
  PyObject* owner;  // the DeviceBuffer, one strong reference
  dlpack::DLManagedTensor legacy;
  dlpack::DLManagedTensorVersioned versioned;
};

void release_context(export_context* ctx) noexcept {
  if (Py_IsInitialized()) {  // after interpreter teardown there is no one left to tell
    PyGILState_STATE g = PyGILState_Ensure();
    Py_DECREF(ctx->owner);
    PyGILState_Release(g);
  }
  delete ctx;
}

void legacy_deleter(dlpack::DLManagedTensor* t) {
  release_context(static_cast<export_context*>(t->manager_ctx));
}
void versioned_deleter(dlpack::DLManagedTensorVersioned* t) {
  release_context(static_cast<export_context*>(t->manager_ctx));
}

// A capsule nobody consumed (still named dltensor*) frees its tensor; a consumed
// one was renamed used_dltensor* and belongs to the consumer.
void capsule_destructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* t = static_cast<dlpack::DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    t->deleter(t);
  } else if (PyCapsule_IsValid(capsule, "dltensor_versioned")) {
    auto* t = static_cast<dlpack::DLManagedTensorVersioned*>(
        PyCapsule_GetPointer(capsule, "dltensor_versioned"));
    t->deleter(t);
  }
}

// Makes `consumer` (a DLPack stream value) wait for the buffer's stream.
void order_for_consumer(const device_buffer& b, nb::handle stream) {
  CUstream consumer = CU_STREAM_LEGACY;  // None: the legacy default stream
  if (!stream.is_none()) {
    if (PyLong_Check(stream.ptr())) {
      const long long v = nb::cast<long long>(stream);
      if (v == -1) return;  // the consumer asks for no synchronization
      if (v == 0) {
        throw logic_error("gpumem.DeviceBuffer.__dlpack__: stream 0 is ambiguous for CUDA; pass 1 "
                          "(legacy default), 2 (per-thread default) or a stream handle");
      }
      consumer = to_stream(stream).handle;
    } else {
      consumer = to_stream(stream).handle;
    }
  }
  auto normal = [](CUstream s) { return s == nullptr ? CU_STREAM_LEGACY : s; };
  if (b.size == 0 || normal(consumer) == normal(b.stream)) return;
  nb::gil_scoped_release release;
  detail::device_context_guard guard(b.device);
  event e(b.device);
  e.record(b.stream);
  stream_view(consumer).wait(e);
}

// The DLPack device of the buffer's memory.
std::pair<int, int> dl_device_of(const device_buffer& b) {
  if (b.host) return {dlpack::kDLCUDAHost, 0};
  return {dlpack::kDLCUDA, b.device};
}

// A (int, int) argument of __dlpack__, or TypeError naming it (nanobind's own
// cast error reads "std::bad_cast").
std::pair<int, int> int_pair(nb::handle h, const char* name) {
  try {
    return nb::cast<std::pair<int, int>>(h);
  } catch (const nb::cast_error&) {
    throw nb::type_error((std::string("gpumem.DeviceBuffer.__dlpack__: ") + name +
                          " must be a tuple of two ints, not " + nb::repr(h).c_str())
                             .c_str());
  }
}

nb::object to_dlpack(nb::handle self, nb::handle stream, nb::handle max_version, nb::handle dl_device,
                     nb::handle copy_arg) {
  device_buffer& b = nb::cast<device_buffer&>(self);
  b.check_open("__dlpack__");
  if (!copy_arg.is_none() && !PyBool_Check(copy_arg.ptr())) {
    throw nb::type_error((std::string("gpumem.DeviceBuffer.__dlpack__: copy must be None or a bool, not ") +
                          nb::repr(copy_arg).c_str())
                             .c_str());
  }
  if (copy_arg.ptr() == Py_True) {
    PyErr_SetString(PyExc_BufferError, "gpumem.DeviceBuffer.__dlpack__: copy=True is not supported");
    throw nb::python_error();
  }
  if (!dl_device.is_none()) {
    const auto want = int_pair(dl_device, "dl_device");
    if (want != dl_device_of(b)) {
      PyErr_SetString(PyExc_BufferError,
                      "gpumem.DeviceBuffer.__dlpack__: the buffer lives on its CUDA device; "
                      "exporting to another device needs a copy, which is not supported");
      throw nb::python_error();
    }
  }
  order_for_consumer(b, stream);
  bool versioned = false;
  if (!max_version.is_none()) {
    const auto v = int_pair(max_version, "max_version");
    versioned = v.first >= 1;
  }

  auto* ctx = new export_context{};
  ctx->shape[0] = static_cast<std::int64_t>(b.size);
  ctx->strides[0] = 1;
  ctx->owner = self.ptr();
  Py_INCREF(ctx->owner);
  dlpack::DLTensor t{};
  t.data = const_cast<void*>(b.data());
  t.device = {dl_device_of(b).first, dl_device_of(b).second};
  t.ndim = 1;
  t.dtype = {dlpack::kDLUInt, 8, 1};
  t.shape = ctx->shape;
  t.strides = ctx->strides;
  t.byte_offset = 0;
  PyObject* capsule = nullptr;
  if (versioned) {
    ctx->versioned.version = {dlpack::major_version, dlpack::minor_version};
    ctx->versioned.manager_ctx = ctx;
    ctx->versioned.deleter = versioned_deleter;
    ctx->versioned.flags = 0;
    ctx->versioned.dl_tensor = t;
    capsule = PyCapsule_New(&ctx->versioned, "dltensor_versioned", capsule_destructor);
  } else {
    ctx->legacy.dl_tensor = t;
    ctx->legacy.manager_ctx = ctx;
    ctx->legacy.deleter = legacy_deleter;
    capsule = PyCapsule_New(&ctx->legacy, "dltensor", capsule_destructor);
  }
  if (capsule == nullptr) {
    Py_DECREF(ctx->owner);
    delete ctx;
    throw nb::python_error();
  }
  return nb::steal(capsule);
}

// Note [Constructing a DeviceBuffer without argument parsing]
// DeviceBuffer(size) and DeviceBuffer(size, stream) are what allocation loops
// call, and nanobind's general dispatch (keyword arguments, defaults, casters for
// device and resource) took about a third of such a call. The type's own
// vectorcall (Python 3.12 and later call it; 3.11 never does) serves exactly
// those two forms: it makes the instance and runs construct() with the omitted
// arguments as their defaults. Every other form, keywords included, calls
// nanobind's __init__ on a new instance, as nanobind's own type call does, and a
// Python subclass goes through type.__call__ to its own __init__. A C++ error on the fast path is raised through
// raise_pending, a function nanobind dispatches, so that it becomes the same
// typed Python exception as on the general path.
thread_local std::exception_ptr pending_failure;
PyObject* raise_pending_function = nullptr;  // _core._raise_pending, held for the process
PyObject* device_buffer_type = nullptr;      // exactly DeviceBuffer: a subclass goes the general way
PyObject* init_function = nullptr;           // DeviceBuffer.__init__, nanobind's, for every other form

void raise_pending() {
  if (std::exception_ptr e = std::exchange(pending_failure, nullptr)) std::rethrow_exception(e);
}

PyObject* construct_vectorcall(PyObject* type, PyObject* const* args, std::size_t nargsf, PyObject* kwnames) noexcept {
  const Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  const Py_ssize_t total = n + (kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0);
  constexpr Py_ssize_t most = 8;  // __init__ takes four; more go the general way, which says so
  if (type == device_buffer_type && (kwnames != nullptr || n < 1 || n > 2) && total < most) {
    // What nanobind's own type call does: a new instance, then __init__ with every argument.
    PyObject* self = nullptr;
    try {
      self = nb::inst_alloc(type).release().ptr();
    } catch (nb::python_error& e) {
      e.restore();
      return nullptr;
    } catch (const std::bad_alloc&) {
      PyErr_NoMemory();
      return nullptr;
    }
    PyObject* all[most];
    all[0] = self;
    std::copy(args, args + total, all + 1);
    PyObject* none = PyObject_Vectorcall(init_function, all, static_cast<std::size_t>(n) + 1, kwnames);
    if (none == nullptr) {
      Py_DECREF(self);
      return nullptr;
    }
    Py_DECREF(none);
    return self;
  }
  if (type != device_buffer_type || total >= most) {  // a subclass: its own __init__, through type.__call__
    PyObject* tuple = PyTuple_New(n);
    if (tuple == nullptr) return nullptr;
    for (Py_ssize_t i = 0; i < n; ++i) {
      Py_INCREF(args[i]);  // Py_NewRef is 3.10 and later
      PyTuple_SET_ITEM(tuple, i, args[i]);
    }
    PyObject* kwargs = nullptr;
    if (kwnames != nullptr) {
      kwargs = PyDict_New();
      for (Py_ssize_t i = 0; kwargs != nullptr && i < PyTuple_GET_SIZE(kwnames); ++i) {
        if (PyDict_SetItem(kwargs, PyTuple_GET_ITEM(kwnames, i), args[n + i]) != 0) Py_CLEAR(kwargs);
      }
      if (kwargs == nullptr) {
        Py_DECREF(tuple);
        return nullptr;
      }
    }
    PyObject* out = PyType_Type.tp_call(type, tuple, kwargs);
    Py_DECREF(tuple);
    Py_XDECREF(kwargs);
    return out;
  }
  try {
    nb::object self = nb::inst_alloc(type);
    construct(nb::inst_ptr<device_buffer>(self), args[0], n == 2 ? nb::handle(args[1]) : nb::none(), std::nullopt,
              nullptr);
    nb::inst_mark_ready(self);
    return self.release().ptr();
  } catch (...) {
    pending_failure = std::current_exception();
    Py_XDECREF(PyObject_CallNoArgs(raise_pending_function));  // raises it: null, the error set
    pending_failure = nullptr;
    return nullptr;
  }
}

#if !defined(Py_tp_vectorcall)
#define Py_tp_vectorcall 82  // the slot's number in CPython's typeslots.h (3.14); nanobind takes it as such
#endif
PyType_Slot device_buffer_slots[] = {{Py_tp_vectorcall, reinterpret_cast<void*>(construct_vectorcall)}, {0, nullptr}};

}  // namespace

void bind_device_buffer(nb::module_& m) {
  m.def("_raise_pending", &raise_pending, "Internal: raises the error DeviceBuffer's fast constructor caught.");
  raise_pending_function = m.attr("_raise_pending").ptr();
  Py_INCREF(raise_pending_function);
  auto cls = nb::class_<device_buffer>(
      m, "DeviceBuffer", nb::is_weak_referenceable(), nb::type_slots(device_buffer_slots),
      "Untyped device memory from a gpumem resource (the device's current resource unless one is "
      "given), allocated on `stream` and freed on it when the object goes or close() is called. "
      "DeviceBuffer(0) allocates nothing and has ptr 0.")
      .def("__init__", &construct, nb::arg("size").none(), nb::arg("stream").none() = nb::none(), nb::kw_only(),
           nb::arg("device") = nb::none(), nb::arg("resource").none() = nb::none(),
           "`size` bytes from `resource` (None: the current resource of `device`, None meaning "
           "the current device), allocated on `stream` (None: the legacy default stream). Any "
           "resource or adaptor stack will do; LogicError when `device` differs from the "
           "resource's.")
      .def_static(
          "from_host",
          [](nb::handle data, nb::handle stream, std::optional<int> device, resource_ptr resource) {
            py_buffer in(data, PyBUF_C_CONTIGUOUS);
            nb::object obj = nb::type<device_buffer>()(static_cast<std::size_t>(in.view.len), stream,
                                                       nb::arg("device") = device,
                                                       nb::arg("resource") = resource);
            device_buffer& b = nb::cast<device_buffer&>(obj);
            copy(b, b.data(), in.view.buf, b.size);
            return obj;
          },
          nb::arg("data"), nb::arg("stream").none() = nb::none(), nb::kw_only(), nb::arg("device") = nb::none(),
          nb::arg("resource").none() = nb::none(),
          "A new buffer holding a copy of `data` (any C-contiguous buffer-protocol object).")
      .def_prop_ro("ptr", [](const device_buffer& b) { return reinterpret_cast<std::uintptr_t>(b.data()); },
                   "The device address as an int (0 for an empty or closed buffer).")
      .def_prop_ro("size", [](const device_buffer& b) { return b.size; }, "Bytes.")
      .def_prop_ro("nbytes", [](const device_buffer& b) { return b.size; }, "Bytes (the same as size).")
      .def_prop_ro("device", [](const device_buffer& b) { return b.device; },
                   "The device of the memory (for pinned host memory: the device whose context its "
                   "copies use).")
      .def_prop_ro("stream", [](const device_buffer& b) { return reinterpret_cast<std::uintptr_t>(b.stream); },
                   "The raw handle of the stream the buffer was allocated on and will be freed on.")
      .def_prop_ro("resource", [](const device_buffer& b) { return b.resource(); },
                   "The resource the memory came from (None for empty or closed buffers).")
      .def_prop_ro("closed", [](const device_buffer& b) { return b.closed; }, "True after close().")
      .def("close", &device_buffer::close,
           "Frees the memory now (stream-ordered on the buffer's stream). Idempotent.")
      .def("copy_from_host", &copy_from_host, nb::arg("src"),
           "Copies a C-contiguous buffer of exactly size bytes into the buffer; returns when done.")
      .def("copy_to_host", &copy_to_host, nb::arg("out").none() = nb::none(),
           "Copies the buffer to `out` (a writable buffer of size bytes) or to new bytes; returns when done.")
      .def_prop_ro("__cuda_array_interface__", &cuda_array_interface,
                   "The buffer as a 1-D uint8 array (version 3), with the stream it was allocated on.")
      .def("__dlpack__", &to_dlpack, nb::kw_only(), nb::arg("stream").none() = nb::none(),
           nb::arg("max_version").none() = nb::none(), nb::arg("dl_device").none() = nb::none(),
           nb::arg("copy").none() = nb::none(),
           "A DLPack capsule of the buffer as a 1-D uint8 tensor (versioned when max_version >= "
           "(1, 0)); `stream` (the consumer's) waits for the buffer's stream on the device.")
      .def("__dlpack_device__", [](const device_buffer& b) { return nb::make_tuple(dl_device_of(b).first, dl_device_of(b).second); },
           "(2, device) for device memory (kDLCUDA); (3, 0) for pinned host memory (kDLCUDAHost).")
      .def("__repr__", [](const device_buffer& b) {
        char buf[128];
        std::snprintf(buf, sizeof buf, "<gpumem.DeviceBuffer ptr=0x%zx size=%zu device=%d%s>",
                      reinterpret_cast<std::size_t>(b.data()), b.size, b.device, b.closed ? " closed" : "");
        return std::string(buf);
      });
  device_buffer_type = cls.ptr();  // the module holds the type for the process
  init_function = nb::object(cls.attr("__init__")).release().ptr();  // held for the process
}

}  // namespace gpumem::python
