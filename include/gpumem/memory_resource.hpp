// The resource contract every gpumem allocator obeys (docs/resource-contract.md).
//
//  allocate(bytes, stream, alignment) returns memory usable by work that is
//  ordered after the call on `stream`; deallocate(p, bytes, stream, alignment)
//  returns it once the work queued on `stream` before the call has finished.
//  Use on any other stream must be ordered by the caller (events).
//
//  Checked here, the same for every resource, before the resource sees a call:
//  bytes == 0 or a null pointer -> logic_error; alignment zero or not a power of
//  two -> logic_error; bytes larger than any device could hold (rounding would
//  overflow) -> out_of_memory. Each resource also rejects what only it can know
//  (foreign or double-freed pointers, size mismatch, a stream of another device).
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

#include "gpumem/export.hpp"
#include "gpumem/stream.hpp"

namespace gpumem {

// 256 bytes: what cuMemAlloc guarantees, and what CUDA's vector loads need.
inline constexpr std::size_t default_alignment = 256;

struct ipc_export_route;  // gpumem/ipc.hpp

struct resource_properties {
  int device = -1;               // device whose memory it hands out; -1 for host memory
  bool device_accessible = false;
  bool host_accessible = false;
  bool thread_safe = false;      // allocate/deallocate may be called from many threads at once
};

class GPUMEM_EXPORT memory_resource {
 public:
  virtual ~memory_resource() = default;
  memory_resource() = default;
  memory_resource(const memory_resource&) = delete;
  memory_resource& operator=(const memory_resource&) = delete;

  void* allocate(std::size_t bytes, stream_view stream, std::size_t alignment = default_alignment);
  void deallocate(void* ptr, std::size_t bytes, stream_view stream,
                  std::size_t alignment = default_alignment);

  // Without waiting (Note [Allocating without waiting] in src/pool/stream_ordered_pool.hpp):
  // the allocation when the resource can make it at once, taking no lock that
  // anything holds across a device wait, and null otherwise (nothing changed;
  // allocate() is then the way, and says what was wrong with the request). For
  // callers that hold a lock of their own which a waiting allocation must not be
  // made under, such as Python's GIL: they try this first and release their lock
  // only when it returns null. Only the pools answer; every other resource and
  // every adaptor (which must see each call) returns null.
  void* try_allocate_now(std::size_t bytes, stream_view stream, std::size_t alignment = default_alignment);
  // The same for a free: true when done, false when nothing changed and
  // deallocate() is the way (which also reports a foreign pointer or a wrong size).
  bool try_deallocate_now(void* ptr, std::size_t bytes, stream_view stream,
                          std::size_t alignment = default_alignment);

  // Synchronous variants: memory usable by any stream on return; deallocate_sync
  // returns memory whose use the caller has already completed.
  void* allocate_sync(std::size_t bytes, std::size_t alignment = default_alignment);
  void deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment = default_alignment);

  // Memory from one may be returned to the other.
  bool is_equal(const memory_resource& other) const noexcept { return do_is_equal(other); }
  friend bool operator==(const memory_resource& a, const memory_resource& b) noexcept {
    return a.is_equal(b);
  }

  virtual resource_properties properties() const noexcept = 0;

  // ---- Capabilities: what a resource can do beyond the contract ----
  // A resource declares one by overriding it; resource_adaptor forwards each to
  // its upstream, and an adaptor that changes one says so (limiting_adaptor caps
  // available_bytes). So a caller asks the stack it holds, whatever is in it,
  // and never switches on concrete types (docs/architecture.md, "Capabilities").

  // Bytes this resource could hand out now: the device's free memory plus what
  // it holds free, within its caps. nullopt: it cannot say (the default).
  virtual std::optional<std::size_t> available_bytes() const;
  // Gives every free byte it holds back to the device, waiting for the device
  // once where frees are still in flight (as torch.cuda.empty_cache does).
  // Returns bytes; 0 where it holds none (the default).
  virtual std::size_t release_free_memory();
  // How [ptr, ptr + bytes) of its memory is shared with another process
  // (gpumem/ipc.hpp: export_allocation). The default: the driver is asked about
  // the pointer itself (memory from cuMemAlloc or a sub-allocating pool over it).
  virtual ipc_export_route ipc_route(const void* ptr, std::size_t bytes) const;
  // What this layer is, in GPUMEM_CONF's words ("pool", "vmm", "stats", ...;
  // "resource" for one that has none), and the layer under it (adaptors: their
  // upstream; null for a base resource).
  virtual std::string_view layer_name() const noexcept { return "resource"; }
  virtual const memory_resource* next_layer() const noexcept { return nullptr; }

 protected:
  // Preconditions already checked: bytes > 0, alignment a power of two,
  // bytes + alignment does not overflow.
  virtual void* do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) = 0;
  // ptr != nullptr. Throws logic_error for pointers the resource did not hand out.
  virtual void do_deallocate(void* ptr, std::size_t bytes, stream_view stream,
                             std::size_t alignment) = 0;
  virtual bool do_is_equal(const memory_resource& other) const noexcept { return this == &other; }
  // try_allocate_now / try_deallocate_now with their preconditions checked as
  // allocate's are; the defaults never serve.
  virtual void* do_try_allocate_now(std::size_t bytes, stream_view stream, std::size_t alignment);
  virtual bool do_try_deallocate_now(void* ptr, std::size_t bytes, stream_view stream, std::size_t alignment);
};

}  // namespace gpumem
