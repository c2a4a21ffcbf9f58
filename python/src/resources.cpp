// Memory resources from Python: the contract (MemoryResource) and the
// capabilities every stack answers (available_bytes, release_free_memory, its
// layers), cuda_resource, pool_resource, vmm_pool_resource, the per-device
// current resource, and memory_info, which says how much a device could still
// hand out through its current resource. The driver's other resources are in
// driver_resources.cpp, the adaptors in adaptors.cpp and oom_retry.cpp.
#include <algorithm>
#include <limits>
#include <memory>
#include <optional>
#include <string>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"
#include "gpumem/adaptors/limiting.hpp"
#include "gpumem/adaptors/resource_adaptor.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/current_resource.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/memory_resource.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/vmm_pool_resource.hpp"

namespace gpumem::python {
namespace {

using resource_ptr = std::shared_ptr<memory_resource>;

std::uintptr_t to_int(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

nb::dict statistics_dict(const pool_statistics& s) {
  nb::dict d;
  d["used_bytes"] = s.used_bytes;
  d["reserved_bytes"] = s.reserved_bytes;
  d["peak_reserved_bytes"] = s.peak_reserved_bytes;
  d["free_bytes"] = s.free_bytes;
  d["free_blocks"] = s.free_blocks;
  d["largest_free_block"] = s.largest_free_block;
  d["allocations"] = s.allocations;
  d["chunks"] = s.chunks;
  d["streams"] = s.streams;
  return d;
}

nb::dict statistics_dict(const vmm_pool_statistics& s) {
  nb::dict d;
  d["used_bytes"] = s.used_bytes;
  d["mapped_bytes"] = s.mapped_bytes;
  d["peak_mapped_bytes"] = s.peak_mapped_bytes;
  d["free_bytes"] = s.free_bytes;
  d["address_bytes"] = s.address_bytes;
  d["largest_free_block"] = s.largest_free_block;
  d["allocations"] = s.allocations;
  d["pages"] = s.pages;
  d["pages_created"] = s.pages_created;
  d["pages_moved"] = s.pages_moved;
  d["pages_revived"] = s.pages_revived;
  d["pages_released"] = s.pages_released;
  d["alias_pages"] = s.alias_pages;
  d["streams"] = s.streams;
  return d;
}

// The pools' release() and trim(stream=None), without the GIL while they run.
template <class Pool>
std::size_t release_memory(Pool& p) {
  nb::gil_scoped_release release;
  return p.release();
}
template <class Pool>
std::size_t trim_memory(Pool& p, nb::handle stream) {
  if (stream.is_none()) {
    nb::gil_scoped_release release;
    return p.trim();
  }
  stream_arg s = to_stream(stream);
  nb::gil_scoped_release release;
  return p.trim(s.handle);
}

// (free, total) of `device` as its current resource sees it: what the device has
// free plus what the resource holds free, through any adaptors over it (a limit
// caps what is free at what it has left). Resources that cannot say raise.
std::pair<std::size_t, std::size_t> memory_info(std::optional<int> device) {
  const int d = device ? *device : current_device();
  resource_ptr r = get_current_resource(d);
  nb::gil_scoped_release release;
  const std::size_t total = device_memory_info(d).total_bytes;
  // A capability the stack answers (memory_resource::available_bytes).
  const std::optional<std::size_t> available = r->available_bytes();
  if (!available) {
    throw unsupported_error("gpumem.memory_info: the current resource of device " + std::to_string(d) +
                            " cannot say how much of its memory is free");
  }
  return {*available, total};
}

std::vector<std::string> layer_names(const memory_resource& top) {
  std::vector<std::string> names;
  for (const memory_resource* r = &top; r != nullptr; r = r->next_layer()) names.emplace_back(r->layer_name());
  return names;
}

// Walks down the stack from `self`; each layer is returned as the Python object that
// owns it when there is one, else as a reference kept alive by the layer above it
// (which owns or outlives it).
nb::object find_layer(nb::handle self, const std::string& name) {
  nb::object current = nb::borrow(self);
  for (const memory_resource* r = &nb::cast<const memory_resource&>(self); r != nullptr;) {
    if (r->layer_name() == name) return current;
    const memory_resource* next = r->next_layer();
    if (next == nullptr) break;
    const auto* a = dynamic_cast<const resource_adaptor*>(r);
    if (a != nullptr && a->shared_upstream()) {
      current = nb::cast(a->shared_upstream());
    } else {
      current = nb::cast(const_cast<memory_resource*>(next), nb::rv_policy::reference_internal, current);
    }
    r = next;
  }
  return nb::none();
}

}  // namespace

void bind_resources(nb::module_& m) {
  nb::class_<resource_properties>(m, "ResourceProperties", "What a resource's memory is (resource.properties).")
      .def_ro("device", &resource_properties::device, "The device whose memory it is; -1 for host memory.")
      .def_ro("device_accessible", &resource_properties::device_accessible, "Device work can use it.")
      .def_ro("host_accessible", &resource_properties::host_accessible, "The host can read and write it.")
      .def_ro("thread_safe", &resource_properties::thread_safe,
              "allocate and deallocate may be called from many threads at once.")
      .def("__repr__", [](const resource_properties& p) {
        return "ResourceProperties(device=" + std::to_string(p.device) +
               ", device_accessible=" + (p.device_accessible ? "True" : "False") +
               ", host_accessible=" + (p.host_accessible ? "True" : "False") +
               ", thread_safe=" + (p.thread_safe ? "True" : "False") + ")";
      });

  nb::class_<memory_resource>(
      m, "MemoryResource",
      "The resource contract (docs/resource-contract.md): allocate and deallocate on a stream.")
      .def(
          "allocate",
          [](memory_resource& r, std::size_t nbytes, nb::handle stream, std::size_t alignment) {
            stream_arg s = to_stream(stream);
            nb::gil_scoped_release release;
            return to_int(r.allocate(nbytes, s.handle, alignment));
          },
          nb::arg("nbytes"), nb::arg("stream").none() = nb::none(), nb::arg("alignment") = default_alignment,
          "Device memory of at least `nbytes`, usable by work queued on `stream` after the call. "
          "Returns the address as an int; give it back with deallocate().")
      .def(
          "deallocate",
          [](memory_resource& r, std::uintptr_t ptr, std::size_t nbytes, nb::handle stream,
             std::size_t alignment) {
            stream_arg s = to_stream(stream);
            nb::gil_scoped_release release;
            r.deallocate(reinterpret_cast<void*>(ptr), nbytes, s.handle, alignment);
          },
          nb::arg("ptr"), nb::arg("nbytes"), nb::arg("stream").none() = nb::none(),
          nb::arg("alignment") = default_alignment,
          "Returns memory from allocate(); reused once the work queued on `stream` before the call is done.")
      .def_prop_ro("properties", &memory_resource::properties,
                   "What the memory is: its device, who can reach it, whether the resource is thread-safe.")
      .def_prop_ro("device", [](const memory_resource& r) { return r.properties().device; },
                   "The device whose memory the resource hands out (-1: host memory).")
      .def("is_equal", &memory_resource::is_equal, nb::arg("other"),
           "True when memory from one may be deallocated through the other.")
      .def("__eq__", [](const memory_resource& a, const memory_resource& b) { return a.is_equal(b); },
           nb::arg("other"), nb::is_operator(), "is_equal(): identity for every gpumem resource.")
      .def("__hash__", [](const memory_resource& r) { return to_int(&r); }, "By identity.")
      // Capabilities (memory_resource.hpp): any stack answers, adaptors forward them.
      .def(
          "available_bytes",
          [](const memory_resource& r) {
            nb::gil_scoped_release release;
            return r.available_bytes();
          },
          "Bytes the resource could hand out now: the device's free memory plus what it holds "
          "free, within its caps (a LimitingAdaptor's limit, a pool's maximum). None when it "
          "cannot say. Asks the whole stack: adaptors forward it to their upstream.")
      .def(
          "release_free_memory",
          [](memory_resource& r) {
            nb::gil_scoped_release release;
            return r.release_free_memory();
          },
          "Gives every free byte the stack holds back to the device (waiting for the device once "
          "where frees are still in flight, as torch.cuda.empty_cache does). Returns the bytes "
          "given back; 0 for resources that hold none.")
      .def_prop_ro("layer_name", [](const memory_resource& r) { return std::string(r.layer_name()); },
                   "What this layer is, in GPUMEM_CONF's words: 'pool', 'vmm', 'cuda', 'async', 'stats', "
                   "'limit', 'log', ... ('resource' for one without a name).")
      .def("layers", &layer_names,
           "The names of the stack's layers, outermost first, down to the resource that takes "
           "memory from the driver: ['stats', 'limit', 'pool', 'cuda'].")
      .def("find_layer", &find_layer, nb::arg("name"),
           nb::sig("def find_layer(self, name: str) -> MemoryResource | None"),
           "The outermost layer of the stack (this resource included) whose layer_name is `name`, "
           "or None: e.g. the StatisticsAdaptor of a stack made by make_resource('pool,stats').");

  nb::class_<cuda_resource, memory_resource>(
      m, "CudaResource", "Device memory straight from cuMemAlloc / cuMemFree (slow; an upstream).")
      .def(
          "__init__",
          [](cuda_resource* self, std::optional<int> device) {
            new (self) cuda_resource(device.value_or(-1));
          },
          nb::arg("device") = nb::none(), "Device memory of `device` (None: the current device).")
      .def_prop_ro("allocated_bytes", &cuda_resource::allocated_bytes,
                   "Bytes handed out and not yet returned (as requested).")
      .def_prop_ro("allocation_count", &cuda_resource::allocation_count, "Allocations live now.")
      .def("__repr__", [](const cuda_resource& r) {
        return "<gpumem.CudaResource device=" + std::to_string(r.device()) + " allocated_bytes=" +
               std::to_string(r.allocated_bytes()) + ">";
      });

  pool_options defaults;
  nb::class_<pool_resource, memory_resource>(
      m, "PoolResource",
      "A stream-ordered, coalescing sub-allocator over an upstream resource (docs/pool.md).")
      .def(
          "__init__",
          [](pool_resource* self, resource_ptr upstream, std::optional<int> device,
             std::size_t initial_bytes, std::size_t maximum_bytes, std::size_t min_chunk_bytes,
             std::size_t max_chunk_bytes, bool reuse_across_streams, unsigned fence_interval,
             std::size_t fence_bytes, bool watch_captures) {
            if (!upstream) {
              upstream = std::make_shared<cuda_resource>(device.value_or(-1));
            } else if (device && *device != upstream->properties().device) {
              throw logic_error("gpumem.PoolResource: device " + std::to_string(*device) +
                                " differs from the upstream's device " +
                                std::to_string(upstream->properties().device));
            }
            pool_options o;
            o.initial_bytes = initial_bytes;
            o.maximum_bytes = maximum_bytes;
            o.min_chunk_bytes = min_chunk_bytes;
            o.max_chunk_bytes = max_chunk_bytes;
            o.reuse_across_streams = reuse_across_streams;
            o.fence_interval = fence_interval;
            o.fence_bytes = fence_bytes;
            o.watch_captures = watch_captures;
            new (self) pool_resource(std::move(upstream), o);
          },
          nb::arg("upstream").none() = nb::none(), nb::kw_only(), nb::arg("device") = nb::none(),
          nb::arg("initial_bytes") = defaults.initial_bytes,
          nb::arg("maximum_bytes") = defaults.maximum_bytes,
          nb::arg("min_chunk_bytes") = defaults.min_chunk_bytes,
          nb::arg("max_chunk_bytes") = defaults.max_chunk_bytes,
          nb::arg("reuse_across_streams") = defaults.reuse_across_streams,
          nb::arg("fence_interval") = defaults.fence_interval,
          nb::arg("fence_bytes") = defaults.fence_bytes,
          nb::arg("watch_captures") = defaults.watch_captures,
          "A pool over `upstream` (None: a new CudaResource of `device`, None meaning the current device).")
      .def("release", &release_memory<pool_resource>,
           "Gives every fully free chunk back to the upstream (synchronizes the device once). Returns bytes.")
      .def("trim", &trim_memory<pool_resource>, nb::arg("stream").none() = nb::none(),
           "Gives back the fully free chunks whose frees are fenced, without blocking the host "
           "(after fencing `stream`'s frees when one is given). Returns bytes.")
      .def("statistics", [](const pool_resource& p) { return statistics_dict(p.statistics()); },
           "used_bytes, reserved_bytes, peak_reserved_bytes (the most held at once since the pool was "
           "made or reset_peak()), free_bytes, free_blocks, largest_free_block, allocations, chunks, streams.")
      .def("reset_peak", &pool_resource::reset_peak, "peak_reserved_bytes becomes what the pool holds now.")
      .def_prop_ro("upstream", [](const pool_resource& p) -> memory_resource& { return p.upstream(); },
                   nb::rv_policy::reference_internal, "The resource the pool takes its chunks from.")
      .def("__repr__", [](const pool_resource& p) {
        const pool_statistics s = p.statistics();
        return "<gpumem.PoolResource device=" + std::to_string(p.properties().device) +
               " used_bytes=" + std::to_string(s.used_bytes) +
               " reserved_bytes=" + std::to_string(s.reserved_bytes) + ">";
      });

  vmm_pool_options vmm_defaults;
  nb::class_<vmm_pool_resource, memory_resource>(
      m, "VmmPoolResource",
      "gpumem's default resource: a stream-ordered pool on CUDA virtual memory that holds little "
      "more than the live bytes and moves free pages where a request needs them (docs/vmm.md).")
      .def(
          "__init__",
          [](vmm_pool_resource* self, std::optional<int> device, std::size_t page_bytes,
             std::size_t maximum_bytes, std::size_t segment_bytes,
             std::optional<std::size_t> release_threshold_bytes, std::vector<int> peer_devices,
             bool access_for_every_peer, bool posix_fd_shareable, bool reuse_across_streams, bool quick_cache,
             std::optional<unsigned> fence_interval, bool watch_captures, unsigned idle_stream_ms) {
            vmm_pool_options o;
            o.page_bytes = page_bytes;
            o.maximum_bytes = maximum_bytes;
            o.segment_bytes = segment_bytes;
            if (release_threshold_bytes) o.release_threshold_bytes = *release_threshold_bytes;
            o.peer_devices = std::move(peer_devices);
            o.access_for_every_peer = access_for_every_peer;
            o.posix_fd_shareable = posix_fd_shareable;
            o.reuse_across_streams = reuse_across_streams;
            o.quick_cache = quick_cache;
            if (fence_interval) o.fence_interval = *fence_interval;
            o.watch_captures = watch_captures;
            o.idle_stream_ms = idle_stream_ms;
            const int d = device ? *device : current_device();
            nb::gil_scoped_release release;
            new (self) vmm_pool_resource(d, std::move(o));
          },
          nb::arg("device") = nb::none(), nb::kw_only(), nb::arg("page_bytes") = vmm_defaults.page_bytes,
          nb::arg("maximum_bytes") = vmm_defaults.maximum_bytes,
          nb::arg("segment_bytes") = vmm_defaults.segment_bytes,
          nb::arg("release_threshold_bytes").none() = nb::none(),
          nb::arg("peer_devices") = std::vector<int>{},
          nb::arg("access_for_every_peer") = vmm_defaults.access_for_every_peer,
          nb::arg("posix_fd_shareable") = vmm_defaults.posix_fd_shareable,
          nb::arg("reuse_across_streams") = vmm_defaults.reuse_across_streams,
          nb::arg("quick_cache") = vmm_defaults.quick_cache,
          nb::arg("fence_interval").none() = nb::none(),
          nb::arg("watch_captures") = vmm_defaults.watch_captures,
          nb::arg("idle_stream_ms") = vmm_defaults.idle_stream_ms,
          "A pool of `device` (None: the current device); the keywords are vmm_pool_options "
          "(0: the default; release_threshold_bytes None: keep all free memory; fence_interval "
          "None: fence only on demand).")
      .def("release", &release_memory<vmm_pool_resource>,
           "Synchronizes the device once, then gives every whole free page back. Returns bytes.")
      .def("trim", &trim_memory<vmm_pool_resource>, nb::arg("stream").none() = nb::none(),
           "Gives back the whole free pages whose frees are complete, without blocking the host "
           "(after fencing `stream`'s frees when one is given). Returns bytes.")
      .def("statistics", [](const vmm_pool_resource& p) {
             vmm_pool_statistics s;
             {
               nb::gil_scoped_release release;
               s = p.statistics();
             }
             return statistics_dict(s);
           },
           "used_bytes, mapped_bytes, peak_mapped_bytes (the most held at once since the pool was made "
           "or reset_peak()), free_bytes, address_bytes, largest_free_block, allocations, "
           "pages, pages_created, pages_moved, pages_revived, pages_released, alias_pages, streams.")
      .def("reset_peak", &vmm_pool_resource::reset_peak, "peak_mapped_bytes becomes what the pool holds now.")
      .def("__repr__", [](const vmm_pool_resource& p) {
        const vmm_pool_statistics s = p.statistics();
        return "<gpumem.VmmPoolResource device=" + std::to_string(p.properties().device) +
               " used_bytes=" + std::to_string(s.used_bytes) +
               " mapped_bytes=" + std::to_string(s.mapped_bytes) + ">";
      });

  m.def(
      "get_current_resource",
      [](std::optional<int> device) { return get_current_resource(device.value_or(-1)); },
      nb::arg("device") = nb::none(),
      "The resource `device`'s memory comes from when a caller names none (None: the current "
      "device). Default: what GPUMEM_CONF describes, else a VmmPoolResource, made on first use.");
  m.def(
      "set_current_resource",
      [](resource_ptr resource, std::optional<int> device) {
        return set_current_resource(device.value_or(-1), std::move(resource));
      },
      nb::arg("resource").none(), nb::arg("device") = nb::none(),
      "Makes `resource` current for `device` (None: the current device) and returns the previous "
      "one. None restores the default.");
  m.def("memory_info", &memory_info, nb::arg("device") = nb::none(),
        "(free, total) bytes of `device` through its current resource: the device's free memory "
        "plus what the resource holds free. UnsupportedError for resources that cannot say.");
}

}  // namespace gpumem::python
