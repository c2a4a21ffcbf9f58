// libgpumem_torch.so: the C entry points torch.cuda.memory.CUDAPluggableAllocator
// loads (gpumem.torch.use_gpumem_for_torch installs them), and what gpumem.torch
// reads back through ctypes: PyTorch's figures and its last out-of-memory.
//
//   void* gpumem_torch_alloc(size_t size, int device, cudaStream_t stream);
//   void  gpumem_torch_free(void* ptr, size_t size, int device, cudaStream_t stream);
//   void  gpumem_torch_empty_cache(void);    // the allocator's reset_fn: torch.cuda.empty_cache()
//
// Allocation comes from the current gpumem resource of `device`, on the stream
// PyTorch passes (its current stream); the free goes, on the stream PyTorch
// passes back, to the resource that made the allocation, even if the current
// resource has changed since. A size of 0 gives a null pointer and allocates
// nothing, as PyTorch's own allocator does; freeing null does nothing.
//
// Errors: an allocation that fails throws the gpumem C++ error through PyTorch
// (Note [Out of memory inside a PyTorch allocation]). A free must not throw
// (PyTorch calls it from destructors): a failure is reported on stderr and the
// memory stays with the resource.
//
// Counters, per device, of what PyTorch holds through these entry points (the
// bytes it asked for): gpumem.torch.memory_stats turns them, with what the
// resource stack says, into torch.cuda.memory_stats' keys. They are kept under
// the lock that already guards the table of live allocations, so they cost the
// hot path nothing more than a few additions.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <cuda.h>

#include "gpumem/current_resource.hpp"
#include "gpumem/error.hpp"
#include "gpumem/export.hpp"
#include "gpumem/memory_resource.hpp"

// What gpumem.torch reads; python/gpumem/torch.py mirrors both layouts (ctypes) and
// checks their sizes (gpumem_torch_layout) before it reads either.
extern "C" {
struct gpumem_torch_counters {
  std::uint64_t current_bytes, peak_bytes, allocated_bytes, freed_bytes;  // bytes PyTorch asked for
  std::uint64_t current_count, peak_count, allocated_count, freed_count;  // allocations
  std::uint64_t ooms;            // allocations refused with gpumem::out_of_memory
  std::uint64_t released_bytes;  // given back to the device by gpumem_torch_empty_cache
};

struct gpumem_torch_oom {
  std::uint64_t serial;  // 1 for the process's first out-of-memory, ...; 0: none recorded
  std::uint64_t requested_bytes;
  std::int64_t device;
  std::uint64_t resource_held_bytes, device_free_bytes, device_total_bytes;
};
}

namespace {

// Note [Out of memory inside a PyTorch allocation]
// PyTorch raises torch.OutOfMemoryError (torch.cuda.OutOfMemoryError) only for a
// c10::OutOfMemoryError, a C++ type of libc10 that this library, built and
// shipped without PyTorch, cannot throw. A null return is no way out either:
// CUDAPluggableAllocator::malloc records and returns whatever the hook returns
// without checking it (so in PyTorch 2.11: its source, and the machine code of
// libtorch_cuda.so 2.11.0), so a failed allocation would become a tensor at
// address 0. Throwing c10's type would need a copy of the hook built against
// each PyTorch release (c10::Error's layout is PyTorch's to change), tying
// gpumem's wheel to one of them. So the hook throws gpumem's own error.
// PyTorch's Python bindings catch any other std::exception and raise RuntimeError
// with its what(): gpumem's explanation ("gpumem: out of memory: ... could not
// allocate N bytes ... on device D; ..."), unchanged. gpumem.torch turns that into
// torch.OutOfMemoryError where the program asks (translate_out_of_memory), with
// the figures attached, and gives them any time (last_out_of_memory). The hook
// therefore records each out_of_memory before rethrowing it: per thread (what the
// allocating thread asks for) and for the process (the autograd engine allocates
// the backward pass on its own threads, and rethrows on the caller's).
struct oom_record {
  std::uint64_t serial = 0;
  gpumem::out_of_memory_info info;
  std::string message;
};

struct allocation {
  std::shared_ptr<gpumem::memory_resource> resource;
  std::size_t bytes;
  int device;
};

struct hook_state {
  std::mutex mutex;  // guards everything below
  std::unordered_map<void*, allocation> live;
  std::map<int, gpumem_torch_counters> counters;  // per device PyTorch has allocated on
  oom_record last_oom;                            // the process's latest
};

// Leaked on purpose: PyTorch frees tensors during interpreter teardown, after
// static destructors may have run.
hook_state& state() {
  static auto* s = new hook_state;
  return *s;
}

thread_local oom_record last_oom_here;

gpumem_torch_counters& counters_of(hook_state& s, int device) {
  return s.counters.try_emplace(device, gpumem_torch_counters{}).first->second;
}

void note_out_of_memory(int device, const gpumem::out_of_memory& e) noexcept {
  try {
    hook_state& s = state();
    std::lock_guard lock(s.mutex);
    ++counters_of(s, device).ooms;
    s.last_oom.serial += 1;
    s.last_oom.info = e.info();
    s.last_oom.message = e.what();
    last_oom_here = s.last_oom;
  } catch (...) {
    // No memory even for the record: the error itself still reaches PyTorch.
  }
}

// Writes the three texts of `r`, each ending in NUL, into `texts` when they fit;
// returns the bytes they need (0 when nothing is recorded).
std::size_t copy_oom(const oom_record& r, gpumem_torch_oom* out, char* texts, std::size_t capacity) {
  *out = gpumem_torch_oom{};
  if (r.serial == 0) return 0;
  out->serial = r.serial;
  out->requested_bytes = r.info.requested_bytes;
  out->device = r.info.device;
  out->resource_held_bytes = r.info.resource_held_bytes;
  out->device_free_bytes = r.info.device_free_bytes;
  out->device_total_bytes = r.info.device_total_bytes;
  const std::string* parts[] = {&r.message, &r.info.resource, &r.info.reason};
  std::size_t need = 0;
  for (const std::string* p : parts) need += p->size() + 1;
  if (texts != nullptr && need <= capacity) {
    for (const std::string* p : parts) {
      std::memcpy(texts, p->c_str(), p->size() + 1);
      texts += p->size() + 1;
    }
  }
  return need;
}

}  // namespace

extern "C" {

GPUMEM_EXPORT void* gpumem_torch_alloc(std::size_t size, int device, CUstream stream) {
  if (size == 0) return nullptr;
  std::shared_ptr<gpumem::memory_resource> r = gpumem::get_current_resource(device);
  if (device < 0) device = r->properties().device;
  void* p = nullptr;
  try {
    p = r->allocate(size, stream);
  } catch (const gpumem::out_of_memory& e) {
    note_out_of_memory(device, e);
    throw;  // Note [Out of memory inside a PyTorch allocation]
  }
  try {
    hook_state& s = state();
    std::lock_guard lock(s.mutex);
    gpumem_torch_counters& c = counters_of(s, device);  // first: emplace is then the last step that may throw
    if (s.live.emplace(p, allocation{r, size, device}).second) {
      c.current_bytes += size;
      c.allocated_bytes += size;
      c.current_count += 1;
      c.allocated_count += 1;
      if (c.current_bytes > c.peak_bytes) c.peak_bytes = c.current_bytes;
      if (c.current_count > c.peak_count) c.peak_count = c.current_count;
    }
  } catch (...) {
    r->deallocate(p, size, stream);
    throw;
  }
  return p;
}

GPUMEM_EXPORT void gpumem_torch_free(void* ptr, std::size_t size, int device, CUstream stream) {
  if (ptr == nullptr) return;
  try {
    std::shared_ptr<gpumem::memory_resource> r;
    {
      hook_state& s = state();
      std::lock_guard lock(s.mutex);
      auto it = s.live.find(ptr);
      if (it != s.live.end()) {
        gpumem_torch_counters& c = counters_of(s, it->second.device);
        c.current_bytes -= it->second.bytes;
        c.freed_bytes += it->second.bytes;
        c.current_count -= 1;
        c.freed_count += 1;
        r = std::move(it->second.resource);
        s.live.erase(it);
      }
    }
    if (!r) r = gpumem::get_current_resource(device);  // not ours: let the resource say so
    r->deallocate(ptr, size, stream);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpumem: PyTorch free of %zu bytes at %p on device %d failed: %s\n", size, ptr,
                 device, e.what());
  }
}

// torch.cuda.empty_cache(): release_free_memory() of the current resource of every
// device PyTorch has allocated on, and of any earlier resource that still holds
// PyTorch's memory. Each is asked once, even if one fails; the first error is
// rethrown afterwards (PyTorch raises it as RuntimeError from empty_cache).
GPUMEM_EXPORT void gpumem_torch_empty_cache() {
  std::vector<std::shared_ptr<gpumem::memory_resource>> resources;  // each once
  auto add = [&resources](const std::shared_ptr<gpumem::memory_resource>& r) {
    for (const auto& known : resources) {
      if (known == r) return;
    }
    resources.push_back(r);
  };
  std::vector<int> devices;
  hook_state& s = state();
  {
    std::lock_guard lock(s.mutex);
    for (const auto& [device, c] : s.counters) devices.push_back(device);
    for (const auto& [p, a] : s.live) add(a.resource);
  }
  // Outside the lock: the registry may make a resource, and releasing waits for the device.
  for (int d : devices) add(gpumem::get_current_resource(d));
  std::exception_ptr first_error;
  for (const auto& r : resources) {
    try {
      const std::size_t released = r->release_free_memory();
      std::lock_guard lock(s.mutex);
      counters_of(s, r->properties().device).released_bytes += released;
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

// ---- For gpumem.torch (ctypes) and tests: nothing below throws ----

// sizeof(gpumem_torch_counters) in the low 16 bits, sizeof(gpumem_torch_oom) above.
GPUMEM_EXPORT std::uint32_t gpumem_torch_layout() {
  return static_cast<std::uint32_t>(sizeof(gpumem_torch_counters) | (sizeof(gpumem_torch_oom) << 16));
}

// PyTorch's figures on `device` (zeros where it has allocated nothing).
GPUMEM_EXPORT void gpumem_torch_get_counters(int device, gpumem_torch_counters* out) {
  hook_state& s = state();
  std::lock_guard lock(s.mutex);
  auto it = s.counters.find(device);
  *out = it == s.counters.end() ? gpumem_torch_counters{} : it->second;
}

// torch.cuda.reset_peak_memory_stats: the peaks restart from what is held now.
GPUMEM_EXPORT void gpumem_torch_reset_peaks(int device) {
  hook_state& s = state();
  std::lock_guard lock(s.mutex);
  auto it = s.counters.find(device);
  if (it == s.counters.end()) return;
  it->second.peak_bytes = it->second.current_bytes;
  it->second.peak_count = it->second.current_count;
}

// torch.cuda.reset_accumulated_memory_stats: totals, out-of-memory and release counts to 0.
GPUMEM_EXPORT void gpumem_torch_reset_totals(int device) {
  hook_state& s = state();
  std::lock_guard lock(s.mutex);
  auto it = s.counters.find(device);
  if (it == s.counters.end()) return;
  gpumem_torch_counters& c = it->second;
  c.allocated_bytes = c.freed_bytes = c.allocated_count = c.freed_count = c.ooms = c.released_bytes = 0;
}

// The latest out_of_memory of the calling thread (any_thread == 0) or of the
// process: its figures into *out, and its message, resource and reason, each
// ending in NUL, into `texts` if `capacity` holds them. Returns the bytes the
// texts need; 0 (and out->serial 0) when none is recorded.
GPUMEM_EXPORT std::size_t gpumem_torch_last_out_of_memory(int any_thread, gpumem_torch_oom* out, char* texts,
                                                          std::size_t capacity) {
  if (any_thread == 0) return copy_oom(last_oom_here, out, texts, capacity);
  hook_state& s = state();
  std::lock_guard lock(s.mutex);
  return copy_oom(s.last_oom, out, texts, capacity);
}

// gpumem_torch_alloc as PyTorch calls it, with its error caught: 0 and *out set,
// or 1 for out of memory, 2 for another error (ctypes cannot catch C++ errors).
GPUMEM_EXPORT int gpumem_torch_try_alloc(std::size_t size, int device, CUstream stream, void** out) {
  try {
    *out = gpumem_torch_alloc(size, device, stream);
    return 0;
  } catch (const gpumem::out_of_memory&) {
    return 1;
  } catch (...) {
    return 2;
  }
}

// Allocations made through gpumem_torch_alloc and not yet freed (for tests and tools).
GPUMEM_EXPORT std::size_t gpumem_torch_live_allocations() {
  hook_state& s = state();
  std::lock_guard lock(s.mutex);
  return s.live.size();
}

}  // extern "C"
