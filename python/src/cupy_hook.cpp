// gpumem._core.CupyHook: the two functions gpumem.cupy hands to CuPy's
// PythonFunctionAllocator (malloc(size, device_id) -> int, free(ptr, device_id)).
//
// Note [Why CuPy goes through PythonFunctionAllocator]
// CuPy wraps what an allocator returns in its own Cython objects. Building
// UnownedMemory + MemoryPointer + a DeviceBuffer in Python cost 5-6 us per
// allocation on an H200; with PythonFunctionAllocator CuPy builds its objects
// in Cython and calls these two functions, which do the rest in C++ (about the
// cost of CuPy's own MemoryPool). CuPy's CFunctionAllocator would skip Python
// altogether, but its C malloc cannot raise: an out-of-memory would become a
// null pointer CuPy does not check. So errors stay Python exceptions.
//
// The allocation is made on CuPy's current stream (its handle read per call with
// get_current_stream_ptr where CuPy has it, which builds no object) and freed on
// that stream. CuPy tells free only the pointer, so the
// hook remembers each allocation's size, resource and stream, and keeps the CuPy
// stream object alive until the free (a user stream destroyed before its arrays
// would otherwise leave the free ordered on a dead stream). The default streams
// (handles 0, 1, 2) need no keeping.
#include <cstdio>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "bindings.hpp"
#include "gpumem/current_resource.hpp"
#include "gpumem/memory_resource.hpp"

namespace gpumem::python {
namespace {

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
    std::shared_ptr<memory_resource> r = get_current_resource(device);
    void* p = nullptr;
    {
      nb::gil_scoped_release release;  // a pool that must grow may wait for the device
      p = r->allocate(size, stream);
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

  // Called from CuPy's memory destructor: never raises, reports on stderr.
  void free(std::uintptr_t ptr, int device) noexcept {
    void* p = reinterpret_cast<void*>(ptr);
    entry e;
    {
      std::lock_guard lock(mutex_);
      auto it = live_.find(p);
      if (it == live_.end()) {
        std::fprintf(stderr, "gpumem.cupy: free of 0x%zx on device %d, which gpumem.cupy did not allocate\n",
                     static_cast<std::size_t>(ptr), device);
        return;
      }
      e = std::move(it->second);
      live_.erase(it);
    }
    try {
      e.resource->deallocate(p, e.size, e.stream);
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "gpumem.cupy: free of %zu bytes at %p on device %d failed: %s\n", e.size, p, device,
                   ex.what());
    }
    // e.stream_owner is released here, with the GIL held (CuPy calls free with it).
  }

  std::size_t live_allocations() {
    std::lock_guard lock(mutex_);
    return live_.size();
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
};

}  // namespace

void bind_cupy_hook(nb::module_& m) {
  nb::class_<cupy_hook>(m, "CupyHook",
                        "malloc/free for cupy.cuda.memory.PythonFunctionAllocator (used by gpumem.cupy).")
      .def(nb::init<nb::object, nb::object>(), nb::arg("current_stream"),
           nb::arg("current_stream_ptr").none() = nb::none())
      .def("malloc", &cupy_hook::malloc, nb::arg("size"), nb::arg("device_id"))
      .def("free", &cupy_hook::free, nb::arg("ptr"), nb::arg("device_id"))
      .def("live_allocations", &cupy_hook::live_allocations);
}

}  // namespace gpumem::python
