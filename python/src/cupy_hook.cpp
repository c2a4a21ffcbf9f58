// gpumem.cupy's two ways into CuPy (docs/python-frameworks.md, "CuPy"):
//
//   CupyAllocator  C functions for cupy.cuda.memory.CFunctionAllocator (CuPy >= 14.1):
//                  malloc(param, size, device_id) and free(param, ptr, device_id),
//                  called by CuPy's Cython code with no Python call in between.
//   CupyHook       malloc(size, device_id) / free(ptr, device_id) as Python callables
//                  for PythonFunctionAllocator: the route for older CuPy.
//
// Both allocate from the current gpumem resource of CuPy's device, on CuPy's current
// stream, and free on that stream to the resource that allocated. CuPy tells free
// only the pointer, so each remembers every live allocation's size, stream and
// resource.
//
// Note [CuPy's C allocator]
// Five decisions make CFunctionAllocator usable and fast.
//
// Errors. CuPy declares malloc `except +` from 14.1 on: a C++ exception thrown by
// malloc becomes a Python exception, and when a Python error is already set Cython
// raises that one and ignores the C++ exception. Before 14.1 malloc could neither
// raise nor fail (a null pointer became an array at address 0), so gpumem.cupy
// takes this route only for CuPy >= 14.1. On failure `malloc` sets the Python error
// through `raise_error` (gpumem.cupy builds a cupy.cuda.memory.OutOfMemoryError that
// is also a gpumem.OutOfMemoryError, with gpumem's explanation; any other failure is
// gpumem's own exception) and rethrows. That Python call is on the failure path
// only. `try_malloc` is the same allocation for C callers (and ctypes): it returns
// null instead, and the failure is kept for raise_failure(). The last out-of-memory
// error is kept either way (last_out_of_memory()).
//
// The stream. CuPy's current stream lives in Python objects (a thread-local of
// cupy_backends.cuda.stream), but CuPy exports a C function that reads it:
// `intptr_t get_stream_ptr(int device_id)`, in that module's Cython C-API table
// (__pyx_capi__), the call CuPy's own MemoryPool makes. gpumem.cupy passes its address
// as `stream_function`; it needs the GIL, which CuPy holds when it calls malloc. A
// stream other than the default ones (handles 0, 1, 2) also has its CuPy object kept
// alive until the free (`keep_stream`, cupy.cuda.get_current_stream: one call into
// CuPy's Cython, no Python code), because a stream destroyed before its arrays would
// leave the free ordered on a dead handle; arrays on the default streams, the common
// case, make no call at all.
//
// The GIL. CuPy calls both functions holding the GIL. The pool may have to wait for
// the device, so the GIL is released around the pool's work, as every allocation from
// gpumem's Python package does (a stream callback that needs the GIL cannot deadlock
// against it). Callers without the GIL (ctypes.CDLL) are served too: the GIL is taken
// only for the stream lookup.
//
// The context. CuPy's own pool makes its first cudaMalloc, which makes the primary
// context of CuPy's device current; through gpumem nothing does, and CuPy's runtime
// calls are slow while none is current. Each route's allocation calls
// adopt_context_once (Note [A thread's first context] in system.cpp).
//
// Lifetime. CuPy's memory objects keep `param` and `free` but not the allocator's
// owner, so a free may come after gpumem.cupy's module globals are gone (at
// interpreter exit). The state is therefore never destroyed: one per allocator made,
// which in practice is one per process.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include <nanobind/stl/string.h>

#include "bindings.hpp"
#include "gpumem/current_resource.hpp"
#include "gpumem/diagnostics.hpp"
#include "gpumem/memory_resource.hpp"

namespace gpumem::python {
namespace {

std::string pointer_text(const void* p) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", p);
  return text;
}

void report_foreign_free(const void* p, int device) {
  diagnose(diagnostic_level::error, "gpumem.cupy: free of " + pointer_text(p) + " on device " +
                                        std::to_string(device) + ", which gpumem.cupy did not allocate: ignored");
}

void report_failed_free(const void* p, std::size_t bytes, int device, const char* why) {
  diagnose(diagnostic_level::error, "gpumem.cupy: free of " + std::to_string(bytes) + " bytes at " + pointer_text(p) +
                                        " on device " + std::to_string(device) + " failed: " + why);
}

// Releases the GIL for its scope if this thread holds it.
class release_gil_if_held {
 public:
  release_gil_if_held() noexcept : saved_(PyGILState_Check() ? PyEval_SaveThread() : nullptr) {}
  ~release_gil_if_held() {
    if (saved_ != nullptr) PyEval_RestoreThread(saved_);
  }
  release_gil_if_held(const release_gil_if_held&) = delete;
  release_gil_if_held& operator=(const release_gil_if_held&) = delete;

 private:
  PyThreadState* saved_;
};

// Holds the GIL for its scope, taking it only if this thread does not hold it.
class hold_gil {
 public:
  hold_gil() noexcept : taken_(!PyGILState_Check()) {
    if (taken_) state_ = PyGILState_Ensure();
  }
  ~hold_gil() {
    if (taken_) PyGILState_Release(state_);
  }
  hold_gil(const hold_gil&) = delete;
  hold_gil& operator=(const hold_gil&) = delete;

 private:
  bool taken_;
  PyGILState_STATE state_{};
};

// Drops one reference, from any thread; leaks it once the interpreter is gone.
void drop_reference(PyObject* o) noexcept {
  if (o == nullptr) return;
  if (PyGILState_Check()) {
    Py_DECREF(o);
  } else if (Py_IsInitialized()) {
    hold_gil gil;
    Py_DECREF(o);
  }
}

bool is_out_of_memory(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const out_of_memory&) {
    return true;
  } catch (...) {
    return false;
  }
}

// The last allocation of this thread, through either route, that ran out of memory.
thread_local std::exception_ptr this_thread_out_of_memory;


// The out-of-memory error `e` as a gpumem.OutOfMemoryError (not raised), or None.
nb::object out_of_memory_or_none(const std::exception_ptr& e) {
  if (!e) return nb::none();
  try {
    std::rethrow_exception(e);
  } catch (const out_of_memory& oom) {
    return out_of_memory_object(oom);
  } catch (...) {
    return nb::none();
  }
}

// ---- CupyAllocator: the C route ---------------------------------------------------

// What `param` points at. Never destroyed (Note [CuPy's C allocator], lifetime).
struct c_allocator {
  struct entry {
    std::size_t bytes = 0;
    CUstream stream = nullptr;
    int device = 0;
    std::shared_ptr<memory_resource> resource;
    PyObject* stream_owner = nullptr;  // a strong reference, or none for the default streams
  };

  std::intptr_t (*stream_function)(int device) = nullptr;  // CuPy's current stream of a device
  PyObject* keep_stream = nullptr;                         // callable(device) -> stream object, or none
  PyObject* raise_error = nullptr;                         // callable(size, device) that raises, or none
  std::mutex mutex;
  std::unordered_map<void*, entry> live;
  std::exception_ptr last_out_of_memory;
};

// The failure of this thread's last allocation through try_malloc or malloc, until
// raise_failure() takes it.
thread_local std::exception_ptr this_thread_failure;

void* allocate(c_allocator& a, std::size_t size, int device) {
  if (size == 0) return nullptr;  // CuPy does not ask for 0 bytes; keep it harmless if asked
  std::intptr_t raw = 0;
  PyObject* owner = nullptr;
  {
    hold_gil gil;  // CuPy's stream lookup reads Python objects
    raw = a.stream_function(device);
    if (raw == -1 && PyErr_Occurred() != nullptr) throw nb::python_error();
    if (raw > 2 && a.keep_stream != nullptr) {
      owner = PyObject_CallFunction(a.keep_stream, "i", device);
      if (owner == nullptr) throw nb::python_error();
    }
  }
  c_allocator::entry e{size, reinterpret_cast<CUstream>(raw), device, nullptr, owner};
  void* p = nullptr;
  try {
    adopt_context_once(device);
    e.resource = get_current_resource(device);
    // The GIL is kept when the pool serves at once (Note [Allocating without waiting]).
    p = e.resource->try_allocate_now(size, e.stream);
    if (p == nullptr) {
      release_gil_if_held nogil;
      p = e.resource->allocate(size, e.stream);
    }
    try {
      std::lock_guard lock(a.mutex);
      a.live.emplace(p, e);
    } catch (...) {
      e.resource->deallocate(p, size, e.stream);
      throw;
    }
  } catch (...) {
    drop_reference(owner);
    throw;
  }
  return p;
}

void remember_failure(c_allocator& a, const std::exception_ptr& failure) {
  if (is_out_of_memory(failure)) {
    this_thread_out_of_memory = failure;
    std::lock_guard lock(a.mutex);
    a.last_out_of_memory = failure;
  }
}

// For C callers and ctypes: the pointer, or null with the failure kept.
void* cupy_try_malloc(void* param, std::size_t size, int device) noexcept {
  auto& a = *static_cast<c_allocator*>(param);
  try {
    return allocate(a, size, device);
  } catch (const nb::python_error& e) {
    // Keep its text, not the Python objects: this thread's record may outlive the interpreter.
    hold_gil gil;
    this_thread_failure = std::make_exception_ptr(std::runtime_error(e.what()));
  } catch (...) {
    this_thread_failure = std::current_exception();
    remember_failure(a, this_thread_failure);
  }
  return nullptr;
}

// For CFunctionAllocator (CuPy >= 14.1, `except +`): never returns null for a size
// above 0; throws with the Python error set. Called with the GIL held.
void* cupy_malloc(void* param, std::size_t size, int device) {
  auto& a = *static_cast<c_allocator*>(param);
  try {
    return allocate(a, size, device);
  } catch (nb::python_error& e) {
    hold_gil gil;
    e.restore();  // CuPy's own error (its stream lookup), raised as it was
    throw;
  } catch (...) {
    const std::exception_ptr failure = std::current_exception();
    remember_failure(a, failure);
    if (a.raise_error != nullptr) {
      hold_gil gil;
      this_thread_failure = failure;
      PyObject* result = PyObject_CallFunction(a.raise_error, "ni", static_cast<Py_ssize_t>(size), device);
      Py_XDECREF(result);  // it raises: result is null and the error is set
      this_thread_failure = nullptr;
    }
    throw;  // with no Python error set, Cython raises this one (out_of_memory: MemoryError)
  }
}

void cupy_free(void* param, void* ptr, int device) noexcept {
  if (ptr == nullptr) return;  // CuPy's empty allocation; CuPy does not free it, a C caller may
  auto& a = *static_cast<c_allocator*>(param);
  c_allocator::entry e;
  bool found = false;
  {
    std::lock_guard lock(a.mutex);  // held for the lookup only, never across a wait
    auto it = a.live.find(ptr);
    if (it != a.live.end()) {
      e = std::move(it->second);
      a.live.erase(it);
      found = true;
    }
  }
  if (!found) {
    report_foreign_free(ptr, device);
    return;
  }
  // The GIL is kept when the pool frees at once (Note [Allocating without waiting]);
  // released for a free that may wait, and for the last reference to a resource,
  // whose destruction may.
  bool freed = false;
  try {
    freed = e.resource->try_deallocate_now(ptr, e.bytes, e.stream);
  } catch (...) {  // a failed capture query, or no memory: the ordinary free reports what happens
  }
  if (!freed || e.resource.use_count() == 1) {
    release_gil_if_held nogil;
    try {
      if (!freed) e.resource->deallocate(ptr, e.bytes, e.stream);
    } catch (const std::exception& ex) {
      report_failed_free(ptr, e.bytes, device, ex.what());
    } catch (...) {
      report_failed_free(ptr, e.bytes, device, "an unknown error");
    }
    e.resource.reset();
  }
  drop_reference(e.stream_owner);
}

// The Python object over one c_allocator (gpumem._core.CupyAllocator).
class cupy_allocator {
 public:
  cupy_allocator(std::uintptr_t stream_function, nb::object keep_stream, nb::object raise_error) {
    if (stream_function == 0) throw logic_error("gpumem.CupyAllocator: stream_function is a null address");
    state_ = new c_allocator;  // never deleted: Note [CuPy's C allocator], lifetime
    state_->stream_function = reinterpret_cast<std::intptr_t (*)(int)>(stream_function);
    if (!keep_stream.is_none()) state_->keep_stream = keep_stream.release().ptr();
    if (!raise_error.is_none()) state_->raise_error = raise_error.release().ptr();
  }

  std::uintptr_t param() const { return reinterpret_cast<std::uintptr_t>(state_); }

  std::size_t live_allocations() const {
    std::lock_guard lock(state_->mutex);
    return state_->live.size();
  }

  nb::list live() const {
    nb::list out;
    std::lock_guard lock(state_->mutex);
    for (const auto& [p, e] : state_->live) {
      nb::dict d;
      d["ptr"] = reinterpret_cast<std::uintptr_t>(p);
      d["bytes"] = e.bytes;
      d["stream"] = reinterpret_cast<std::uintptr_t>(e.stream);
      d["device"] = e.device;
      d["keeps_stream_object"] = e.stream_owner != nullptr;
      out.append(d);
    }
    return out;
  }

  nb::object last_out_of_memory(bool any_thread) const {
    if (!any_thread) return out_of_memory_or_none(this_thread_out_of_memory);
    std::exception_ptr e;
    {
      std::lock_guard lock(state_->mutex);
      e = state_->last_out_of_memory;
    }
    return out_of_memory_or_none(e);
  }

  // Raises this thread's last failed allocation as gpumem's exception (and forgets it);
  // nothing when there is none.
  static void raise_failure() {
    std::exception_ptr e = std::exchange(this_thread_failure, nullptr);
    if (e) std::rethrow_exception(e);
  }

  // The C function a Cython module exports in __pyx_capi__ under `signature`, or None.
  static nb::object capsule_function(nb::handle capsule, const std::string& signature) {
    if (!PyCapsule_IsValid(capsule.ptr(), signature.c_str())) return nb::none();
    return nb::int_(reinterpret_cast<std::uintptr_t>(PyCapsule_GetPointer(capsule.ptr(), signature.c_str())));
  }

 private:
  c_allocator* state_ = nullptr;
};

// ---- CupyHook: the Python-callable route -------------------------------------------

class cupy_hook {
 public:
  // current_stream: CuPy's cupy.cuda.get_current_stream (the object, kept alive
  // for streams other than the defaults); current_stream_ptr: a cheaper callable
  // giving just its handle (cupy.cuda.stream.get_current_stream_ptr), or None.
  cupy_hook(nb::object current_stream, nb::object current_stream_ptr)
      : current_stream_(std::move(current_stream)), current_stream_ptr_(std::move(current_stream_ptr)) {}

  std::uintptr_t malloc(std::size_t size, int device) {
    if (size == 0) return 0;  // CuPy does not call malloc for 0; keep it harmless if it does
    nb::object stream_obj;
    std::uintptr_t raw = 0;
    if (current_stream_ptr_.is_valid() && !current_stream_ptr_.is_none()) {
      raw = nb::cast<std::uintptr_t>(current_stream_ptr_());
      if (raw > 2) stream_obj = current_stream_();  // to keep it alive
    } else {
      stream_obj = current_stream_();
      raw = nb::cast<std::uintptr_t>(stream_obj.attr("ptr"));
    }
    const auto stream = reinterpret_cast<CUstream>(raw);
    adopt_context_once(device);
    std::shared_ptr<memory_resource> r = get_current_resource(device);
    void* p = nullptr;
    try {
      p = r->try_allocate_now(size, stream);  // Note [Allocating without waiting]
      if (p == nullptr) {
        nb::gil_scoped_release release;  // a pool that must grow may wait for the device
        p = r->allocate(size, stream);
      }
    } catch (const out_of_memory&) {
      this_thread_out_of_memory = std::current_exception();
      std::lock_guard lock(mutex_);
      last_out_of_memory_ = this_thread_out_of_memory;
      throw;
    }
    entry e{size, stream, std::move(r), raw > 2 ? std::move(stream_obj) : nb::object()};
    try {
      std::lock_guard lock(mutex_);
      live_.emplace(p, std::move(e));
    } catch (...) {
      e.resource->deallocate(p, size, stream);
      throw;
    }
    return reinterpret_cast<std::uintptr_t>(p);
  }

  // Called from CuPy's memory destructor: never raises, reports through the diagnostics sink.
  void free(std::uintptr_t ptr, int device) noexcept {
    void* p = reinterpret_cast<void*>(ptr);
    entry e;
    {
      std::lock_guard lock(mutex_);
      auto it = live_.find(p);
      if (it == live_.end()) {
        report_foreign_free(p, device);
        return;
      }
      e = std::move(it->second);
      live_.erase(it);
    }
    try {
      // CuPy calls free with the GIL held: kept when the pool frees at once
      // (Note [Allocating without waiting]), released when it may wait.
      if (!e.resource->try_deallocate_now(p, e.size, e.stream)) {
        nb::gil_scoped_release release;
        e.resource->deallocate(p, e.size, e.stream);
      }
    } catch (const std::exception& ex) {
      report_failed_free(p, e.size, device, ex.what());
    }
    // e.stream_owner is released here, with the GIL held (CuPy calls free with it).
  }

  std::size_t live_allocations() {
    std::lock_guard lock(mutex_);
    return live_.size();
  }

  nb::object last_out_of_memory(bool any_thread) {
    if (!any_thread) return out_of_memory_or_none(this_thread_out_of_memory);
    std::exception_ptr e;
    {
      std::lock_guard lock(mutex_);
      e = last_out_of_memory_;
    }
    return out_of_memory_or_none(e);
  }

 private:
  struct entry {
    std::size_t size = 0;
    CUstream stream = nullptr;
    std::shared_ptr<memory_resource> resource;
    nb::object stream_owner;
  };
  nb::object current_stream_;
  nb::object current_stream_ptr_;
  std::mutex mutex_;
  std::unordered_map<void*, entry> live_;
  std::exception_ptr last_out_of_memory_;
};

}  // namespace

void bind_cupy_hook(nb::module_& m) {
  static constexpr const char* last_oom_doc =
      "The last allocation of the calling thread (any_thread: of any thread, through this object) "
      "that ran out of memory, as a gpumem.OutOfMemoryError (not raised), or None.";
  nb::class_<cupy_allocator>(
      m, "CupyAllocator",
      "C functions for cupy.cuda.memory.CFunctionAllocator (used by gpumem.cupy with CuPy >= 14.1).\n\n"
      "stream_function: the address of `intptr_t f(int device_id)` giving CuPy's current stream\n"
      "(cupy_backends.cuda.stream.get_stream_ptr); keep_stream: callable(device_id) returning the\n"
      "stream object to keep alive until the free (streams other than 0, 1, 2), or None;\n"
      "raise_error: callable(size, device_id) that raises this thread's failure (raise_failure()),\n"
      "or None. The functions: malloc_function, void* malloc(void* param, size_t size, int device_id),\n"
      "throwing a C++ exception with the Python error set; try_malloc_function, the same returning\n"
      "null; free_function, void free(void* param, void* ptr, int device_id); param: the state.")
      .def(nb::init<std::uintptr_t, nb::object, nb::object>(), nb::arg("stream_function"),
           nb::arg("keep_stream").none() = nb::none(), nb::arg("raise_error").none() = nb::none())
      .def_prop_ro("param", &cupy_allocator::param)
      .def_prop_ro("malloc_function",
                   [](const cupy_allocator&) { return reinterpret_cast<std::uintptr_t>(&cupy_malloc); })
      .def_prop_ro("try_malloc_function",
                   [](const cupy_allocator&) { return reinterpret_cast<std::uintptr_t>(&cupy_try_malloc); })
      .def_prop_ro("free_function", [](const cupy_allocator&) { return reinterpret_cast<std::uintptr_t>(&cupy_free); })
      .def("live_allocations", &cupy_allocator::live_allocations)
      .def("live", &cupy_allocator::live, "Live allocations: ptr, bytes, stream, device, keeps_stream_object.")
      .def("last_out_of_memory", &cupy_allocator::last_out_of_memory, nb::arg("any_thread") = false, last_oom_doc)
      .def_static("raise_failure", &cupy_allocator::raise_failure,
                  "Raises this thread's last failed allocation as gpumem's exception, once.")
      .def_static("capsule_function", &cupy_allocator::capsule_function, nb::arg("capsule"), nb::arg("signature"),
                  "The address of the C function in a Cython __pyx_capi__ capsule of that signature, or None.");

  nb::class_<cupy_hook>(m, "CupyHook",
                        "malloc/free for cupy.cuda.memory.PythonFunctionAllocator (gpumem.cupy with CuPy < 14.1).")
      .def(nb::init<nb::object, nb::object>(), nb::arg("current_stream"),
           nb::arg("current_stream_ptr").none() = nb::none())
      .def("malloc", &cupy_hook::malloc, nb::arg("size"), nb::arg("device_id"))
      .def("free", &cupy_hook::free, nb::arg("ptr"), nb::arg("device_id"))
      .def("live_allocations", &cupy_hook::live_allocations)
      .def("last_out_of_memory", &cupy_hook::last_out_of_memory, nb::arg("any_thread") = false, last_oom_doc);
}

}  // namespace gpumem::python
