// gpumem._core.NumbaAllocations: the device allocations of one gpumem.numba plugin
// (one per Numba context), each a NumbaAllocation that the runtime's MemoryPointer
// keeps as its finalizer.
//
// Note [Numba allocations in C++]
// Numba's MemoryPointer frees through weakref.finalize when it is given a finalizer:
// a weak reference with a callback, an entry in finalize's registry and its atexit
// bookkeeping, made for every array and undone at every free. With a Python object per
// allocation beside it (the DeviceBuffer, a dict entry for reset(), a closure), that was
// most of what the plugin added to device_array over a plugin that allocates nothing
// (W7, docs/benchmarks.md). So memalloc makes the runtime's plain MemoryPointer and sets
// its finalizer afterwards (is_managed = True, _finalizer = a NumbaAllocation): the
// MemoryPointer's contract is kept (free() calls it once, `alive` then reads False and a
// second free() raises "Freeing dead memory"), and when the pointer goes, its
// NumbaAllocation goes with it and frees in its destructor: no weak reference, no
// Python code on either path. After the plugin's reset() a call frees nothing, as the
// finalizers of Numba's own manager.
//
// The group keeps what the plugin's reset() and defer_cleanup() need: the live
// allocations (free_all frees them; their objects stay, dead), and while a
// defer_cleanup is active the freed memory is held, not freed, until the outermost one
// exits. Frees are stream-ordered on the plugin's stream (the runtime's default
// stream) and run with the GIL released. The group's state is shared with its
// allocations, so an allocation that outlives the plugin still frees.
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "gpumem/current_resource.hpp"
#include "gpumem/device_buffer.hpp"
#include "gpumem/diagnostics.hpp"
#include "gpumem/error.hpp"

namespace gpumem::python {
namespace {

struct numba_allocation;

struct group_state {
  std::mutex mutex;
  std::unordered_set<numba_allocation*> live;
  std::vector<gpumem::device_buffer> deferred;  // freed while a defer_cleanup was active
  int defer_depth = 0;
  CUstream stream = nullptr;
  int device = -1;
};

// Frees `buffers`, with the GIL released for those the pool cannot free at once; a
// failure is reported, never raised (a free runs from destructors).
void free_all_of(std::vector<gpumem::device_buffer>& buffers) {
  // Those the pool frees at once keep the GIL (Note [Allocating without waiting]).
  std::erase_if(buffers, [](gpumem::device_buffer& b) { return b.try_release_now(); });
  if (buffers.empty()) return;
  nb::gil_scoped_release release;
  for (auto& b : buffers) {
    try {
      b.release();
    } catch (const std::exception& e) {
      diagnose(diagnostic_level::error, std::string("gpumem.numba: a device allocation could not be freed: ") + e.what());
    }
  }
  buffers.clear();
}

struct numba_allocation {
  std::shared_ptr<group_state> group;
  gpumem::device_buffer mem;
  std::uintptr_t ptr = 0;
  bool called = false;  // the finalizer ran (reset()'s free_all does not count: it never calls)

  numba_allocation(std::shared_ptr<group_state> g, gpumem::device_buffer m)
      : group(std::move(g)), mem(std::move(m)), ptr(reinterpret_cast<std::uintptr_t>(mem.data())) {}
  numba_allocation(const numba_allocation&) = delete;
  numba_allocation& operator=(const numba_allocation&) = delete;
  ~numba_allocation() { free(); }

  // As weakref.finalize's `alive`: true until the finalizer is called. After the
  // group's free_all (the plugin's reset) it is still true and a call frees nothing,
  // as a finalizer of Numba's own manager does after its reset.
  bool alive() {
    std::lock_guard lock(group->mutex);
    return !called;
  }

  // The finalizer: frees now (or holds the memory while a defer_cleanup is active).
  void call() {
    {
      std::lock_guard lock(group->mutex);
      called = true;
    }
    free();
  }

  // Frees now (or holds the memory while a defer_cleanup is active); nothing if freed.
  void free() {
    std::vector<gpumem::device_buffer> gone;
    {
      std::lock_guard lock(group->mutex);
      if (mem.data() == nullptr) return;
      group->live.erase(this);
      if (group->defer_depth > 0) {
        group->deferred.push_back(std::move(mem));
        return;
      }
      gone.push_back(std::move(mem));
    }
    free_all_of(gone);
  }
};

class numba_allocations {
 public:
  explicit numba_allocations(std::uintptr_t stream) : state_(std::make_shared<group_state>()) {
    state_->stream = reinterpret_cast<CUstream>(stream);
  }

  int device() const { return state_->device; }
  void set_device(int d) { state_->device = d; }

  numba_allocation* allocate(std::size_t size) {
    if (state_->device < 0) throw logic_error("gpumem.numba: the plugin allocated before it knew its device");
    if (size == 0) throw logic_error("gpumem.numba: 0 bytes (memalloc gives an empty pointer for those)");
    std::shared_ptr<memory_resource> r = get_current_resource(state_->device);
    // The GIL is kept when the pool serves at once (Note [Allocating without waiting]).
    gpumem::device_buffer mem = gpumem::device_buffer::try_allocate_now(size, stream_view(state_->stream), r);
    if (mem.data() == nullptr) {
      nb::gil_scoped_release release;  // a pool that must grow may wait for the device
      mem = gpumem::device_buffer(size, stream_view(state_->stream), std::move(r));
    }
    auto a = std::make_unique<numba_allocation>(state_, std::move(mem));
    std::lock_guard lock(state_->mutex);
    state_->live.insert(a.get());
    return a.release();
  }

  // reset(): frees every live allocation and what a defer_cleanup holds.
  void free_all() {
    std::vector<gpumem::device_buffer> gone;
    {
      std::lock_guard lock(state_->mutex);
      for (numba_allocation* a : state_->live) gone.push_back(std::move(a->mem));
      state_->live.clear();
      for (auto& b : state_->deferred) gone.push_back(std::move(b));
      state_->deferred.clear();
    }
    free_all_of(gone);
  }

  void defer_begin() {
    std::lock_guard lock(state_->mutex);
    ++state_->defer_depth;
  }

  // The end of a defer_cleanup: the outermost frees what was held.
  void defer_end() {
    std::vector<gpumem::device_buffer> gone;
    {
      std::lock_guard lock(state_->mutex);
      if (state_->defer_depth == 0) throw logic_error("gpumem.numba: defer_end without defer_begin");
      if (--state_->defer_depth == 0) gone.swap(state_->deferred);
    }
    free_all_of(gone);
  }

  std::size_t live_count() const {
    std::lock_guard lock(state_->mutex);
    return state_->live.size();
  }

  std::size_t deferred_count() const {
    std::lock_guard lock(state_->mutex);
    return state_->deferred.size();
  }

 private:
  std::shared_ptr<group_state> state_;
};

}  // namespace

void bind_numba_allocations(nb::module_& m) {
  nb::class_<numba_allocation>(m, "NumbaAllocation",
                               "One device allocation of gpumem.numba: the finalizer of the MemoryPointer "
                               "over it (Note [Numba allocations in C++]). Calling it frees the memory once.")
      .def_ro("ptr", &numba_allocation::ptr, "The device address.")
      .def_prop_ro("alive", &numba_allocation::alive, "True until called (as weakref.finalize's alive).")
      .def("__call__", &numba_allocation::call,
           "Frees now, or holds the memory while a defer_cleanup is active; nothing once freed.");

  nb::class_<numba_allocations>(m, "NumbaAllocations",
                                "The device allocations of one gpumem.numba plugin: allocate, free_all (reset) "
                                "and deferral (defer_cleanup).")
      .def(nb::init<std::uintptr_t>(), nb::arg("stream"))
      .def_prop_rw("device", &numba_allocations::device, &numba_allocations::set_device,
                   "The device whose current resource allocates (-1 until set).")
      .def("allocate", &numba_allocations::allocate, nb::arg("size"), nb::rv_policy::take_ownership,
           "A NumbaAllocation of `size` bytes from the device's current resource, on the stream.")
      .def("free_all", &numba_allocations::free_all, "Frees every live allocation and what deferral holds.")
      .def("defer_begin", &numba_allocations::defer_begin, "A defer_cleanup begins: frees are held.")
      .def("defer_end", &numba_allocations::defer_end, "A defer_cleanup ends: the outermost frees what was held.")
      .def("live_count", &numba_allocations::live_count, "Allocations not yet freed.")
      .def("deferred_count", &numba_allocations::deferred_count, "Freed allocations that deferral holds.");
}

}  // namespace gpumem::python
