// The driver's other kinds of memory from Python (docs/resources.md):
//   AsyncResource       the driver's stream-ordered pools (cuMemAllocFromPoolAsync)
//   ManagedResource     managed (unified) memory, cuMemAllocManaged
//   PinnedHostResource  page-locked host memory, cuMemHostAlloc
// Their options are keywords with the C++ defaults; option names that take one of
// a few values are strings (ipc="posix_file_descriptor", attach="host"), refused
// with LogicError naming the choices. Calls that may wait for the device or the
// driver release the GIL.
#include <limits>
#include <memory>
#include <optional>
#include <string>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>

#include "bindings.hpp"
#include "gpumem/async_resource.hpp"
#include "gpumem/device.hpp"
#include "gpumem/managed_resource.hpp"
#include "gpumem/pinned_host_resource.hpp"

namespace gpumem::python {
namespace {

constexpr std::pair<const char*, async_ipc_handle> ipc_choices[] = {
    {"none", async_ipc_handle::none}, {"posix_file_descriptor", async_ipc_handle::posix_file_descriptor}};
constexpr std::pair<const char*, pool_access> access_choices[] = {
    {"none", pool_access::none}, {"read", pool_access::read}, {"read_write", pool_access::read_write}};
constexpr std::pair<const char*, existing_pool> existing_choices[] = {
    {"device_default", existing_pool::device_default}, {"device_current", existing_pool::device_current}};
constexpr std::pair<const char*, managed_attach> attach_choices[] = {
    {"global", managed_attach::global}, {"host", managed_attach::host}};

constexpr std::size_t keep_everything = std::numeric_limits<std::size_t>::max();

std::string flag(bool b) { return b ? "True" : "False"; }

std::string repr(const async_reuse_policy& p) {
  return "AsyncReusePolicy(follow_event_dependencies=" + flag(p.follow_event_dependencies) +
         ", allow_opportunistic=" + flag(p.allow_opportunistic) +
         ", allow_internal_dependencies=" + flag(p.allow_internal_dependencies) + ")";
}

nb::dict statistics_dict(const async_statistics& s) {
  nb::dict d;
  d["used_bytes"] = s.used_bytes;
  d["reserved_bytes"] = s.reserved_bytes;
  d["used_high_bytes"] = s.used_high_bytes;
  d["reserved_high_bytes"] = s.reserved_high_bytes;
  return d;
}

void bind_async(nb::module_& m) {
  const async_reuse_policy reuse_defaults;
  nb::class_<async_reuse_policy>(
      m, "AsyncReusePolicy",
      "How other streams may reuse memory freed on a stream in an AsyncResource's pool (the "
      "pool's CU_MEMPOOL_ATTR_REUSE_* attributes; all on by default, as in the driver).")
      .def(
          "__init__",
          [](async_reuse_policy* self, bool follow, bool opportunistic, bool internal) {
            new (self) async_reuse_policy{follow, opportunistic, internal};
          },
          nb::kw_only(), nb::arg("follow_event_dependencies") = reuse_defaults.follow_event_dependencies,
          nb::arg("allow_opportunistic") = reuse_defaults.allow_opportunistic,
          nb::arg("allow_internal_dependencies") = reuse_defaults.allow_internal_dependencies,
          "A policy; every keyword defaults to the driver's default (True).")
      .def_rw("follow_event_dependencies", &async_reuse_policy::follow_event_dependencies,
              "A stream ordered after the free by an event or the legacy default stream may reuse it.")
      .def_rw("allow_opportunistic", &async_reuse_policy::allow_opportunistic,
              "Any stream may reuse it once the free has completed on the device.")
      .def_rw("allow_internal_dependencies", &async_reuse_policy::allow_internal_dependencies,
              "The driver may make the allocating stream wait for a pending free rather than fail.")
      .def("__eq__", [](const async_reuse_policy& a, const async_reuse_policy& b) { return a == b; },
           nb::arg("other"), "The same three settings.")
      .def("__repr__", [](const async_reuse_policy& p) { return repr(p); });

  const async_options defaults;
  nb::class_<async_resource, memory_resource>(
      m, "AsyncResource",
      "Device memory from the driver's stream-ordered allocator (cudaMallocAsync's pools), on a "
      "pool of its own or the device's default or current pool (wrap_existing_pool). Frees are "
      "ordered by the driver on the freeing stream (docs/resources.md, async_resource).")
      .def(
          "__init__",
          [](async_resource* self, std::optional<int> device, nb::int_ initial_bytes,
             std::optional<nb::int_> release_threshold_bytes, nb::int_ maximum_bytes,
             std::optional<async_reuse_policy> reuse, const std::string& ipc, bool access_for_every_peer) {
            const char* where = "gpumem.AsyncResource";
            async_options o;
            o.initial_bytes = to_size(initial_bytes, where);
            o.release_threshold_bytes =
                release_threshold_bytes ? to_size(*release_threshold_bytes, where) : keep_everything;
            o.maximum_bytes = to_size(maximum_bytes, where);
            if (reuse) o.reuse = *reuse;
            o.ipc = parse_choice(ipc, ipc_choices, where, "ipc");
            o.access_for_every_peer = access_for_every_peer;
            const int d = device.value_or(-1);
            nb::gil_scoped_release release;
            new (self) async_resource(d, o);
          },
          nb::arg("device") = nb::none(), nb::kw_only(), nb::arg("initial_bytes") = defaults.initial_bytes,
          nb::arg("release_threshold_bytes").none() = nb::none(),
          nb::arg("maximum_bytes") = defaults.maximum_bytes, nb::arg("reuse").none() = nb::none(),
          nb::arg("ipc") = choice_name(defaults.ipc, ipc_choices),
          nb::arg("access_for_every_peer") = defaults.access_for_every_peer,
          "A new pool of `device` (None: the current device), owned by the resource. Keywords are "
          "async_options: initial_bytes reserved now; release_threshold_bytes kept across "
          "synchronisations (None: everything); maximum_bytes the pool's hard limit (0: the "
          "device); reuse an AsyncReusePolicy (None: the driver's defaults); ipc 'none' or "
          "'posix_file_descriptor' (shareable with other processes, fixed at creation); "
          "access_for_every_peer: read-write access for every device that can reach this one. "
          "LogicError for initial_bytes above maximum_bytes or release_threshold_bytes.")
      .def_static(
          "wrap_existing_pool",
          [](const std::string& which, std::optional<int> device) {
            const existing_pool w =
                parse_choice(which, existing_choices, "gpumem.AsyncResource.wrap_existing_pool", "which");
            const int d = device.value_or(-1);
            nb::gil_scoped_release release;
            return std::make_shared<async_resource>(w, d);
          },
          nb::arg("which") = "device_default", nb::arg("device") = nb::none(),
          "An AsyncResource over the device's default pool ('device_default') or the one "
          "cuDeviceSetMemPool made current ('device_current'), not owned: its settings are the "
          "device's, shared with every library that uses that pool.")
      .def_prop_ro("owns_pool", &async_resource::owns_pool, "True when the resource created its pool.")
      .def_prop_ro("pool_handle",
                   [](const async_resource& r) { return reinterpret_cast<std::uintptr_t>(r.pool_handle()); },
                   "The CUmemoryPool handle as an int.")
      .def_prop_ro("ipc", [](const async_resource& r) { return choice_name(r.ipc_handle(), ipc_choices); },
                   "The pool's handle type for other processes: 'none' or 'posix_file_descriptor'.")
      .def_prop_ro("allocated_bytes", &async_resource::allocated_bytes,
                   "Bytes handed out and not yet returned (as requested).")
      .def_prop_ro("allocation_count", &async_resource::allocation_count, "Allocations live now.")
      .def(
          "trim_to",
          [](async_resource& r, nb::int_ bytes_to_keep) {
            const std::size_t keep = to_size(bytes_to_keep, "gpumem.AsyncResource.trim_to");
            nb::gil_scoped_release release;
            r.trim_to(keep);
          },
          nb::arg("bytes_to_keep"),
          "Returns free memory to the device until the pool holds about `bytes_to_keep` (never "
          "memory in use; frees count as in use until the host has seen them complete, so "
          "synchronise the freeing streams first). Does not block.")
      .def_prop_rw(
          "release_threshold",
          [](const async_resource& r) -> std::optional<std::size_t> {
            const std::size_t t = r.release_threshold();
            if (t == keep_everything) return std::nullopt;
            return t;
          },
          [](async_resource& r, std::optional<nb::int_> bytes) {
            r.set_release_threshold(bytes ? to_size(*bytes, "gpumem.AsyncResource.release_threshold")
                                          : keep_everything);
          },
          nb::for_setter(nb::arg("bytes").none()),
          "Free bytes the pool keeps across synchronisations (None: everything); memory above it "
          "returns to the device at the next stream, event or context synchronisation.")
      .def_prop_rw("reuse_policy", &async_resource::reuse_policy, &async_resource::set_reuse_policy,
                   "The pool's AsyncReusePolicy (set it to change the pool's attributes).")
      .def(
          "statistics",
          [](const async_resource& r) {
            async_statistics s;
            {
              nb::gil_scoped_release release;
              s = r.statistics();
            }
            return statistics_dict(s);
          },
          "The pool's attributes, in the driver's granularity: used_bytes, reserved_bytes, "
          "used_high_bytes, reserved_high_bytes.")
      .def("reset_high_watermarks", &async_resource::reset_high_watermarks,
           "Sets used_high_bytes and reserved_high_bytes back to the current values.")
      .def(
          "set_access",
          [](async_resource& r, int peer_device, const std::string& access) {
            const pool_access a = parse_choice(access, access_choices, "gpumem.AsyncResource.set_access", "access");
            nb::gil_scoped_release release;
            r.set_access(peer_device, a);
          },
          nb::arg("peer_device"), nb::arg("access") = "read_write",
          "Lets `peer_device`'s work use the pool's memory ('read_write', 'read') or stops it "
          "('none'); the devices must reach each other. LogicError for the owning device.")
      .def(
          "access_from",
          [](const async_resource& r, int device) { return choice_name(r.access_from(device), access_choices); },
          nb::arg("device"), "The access `device` has to the pool's memory: 'none', 'read' or 'read_write'.")
      .def("__repr__", [](const async_resource& r) {
        return "<gpumem.AsyncResource device=" + std::to_string(r.device()) +
               " allocated_bytes=" + std::to_string(r.allocated_bytes()) +
               (r.owns_pool() ? "" : " existing pool") + ">";
      });
}

void bind_managed(nb::module_& m) {
  nb::class_<managed_resource, memory_resource>(
      m, "ManagedResource",
      "Managed (unified) memory from cuMemAllocManaged, at the same address for the host and "
      "every device, migrated by the driver. Frees wait for the device (cuMemFree).")
      .def(
          "__init__",
          [](managed_resource* self, std::optional<int> device, const std::string& attach) {
            const managed_attach a = parse_choice(attach, attach_choices, "gpumem.ManagedResource", "attach");
            const int d = device.value_or(-1);
            nb::gil_scoped_release release;
            new (self) managed_resource(d, a);
          },
          nb::arg("device") = nb::none(), nb::kw_only(), nb::arg("attach") = "global",
          "Managed memory associated with `device` (None: the current device); `attach` is the "
          "default stream association: 'global' (any stream on any device) or 'host' "
          "(CU_MEM_ATTACH_HOST). CudaError (CUDA_ERROR_NOT_SUPPORTED) where the device has no "
          "managed memory.")
      .def_prop_ro("attach", [](const managed_resource& r) { return choice_name(r.attach(), attach_choices); },
                   "'global' or 'host'.")
      .def_prop_ro("allocated_bytes", &managed_resource::allocated_bytes,
                   "Bytes handed out and not yet returned (as requested).")
      .def_prop_ro("allocation_count", &managed_resource::allocation_count, "Allocations live now.")
      .def("__repr__", [](const managed_resource& r) {
        return "<gpumem.ManagedResource device=" + std::to_string(r.device()) +
               " attach=" + choice_name(r.attach(), attach_choices) +
               " allocated_bytes=" + std::to_string(r.allocated_bytes()) + ">";
      });
}

void bind_pinned(nb::module_& m) {
  const pinned_options defaults;
  nb::class_<pinned_host_resource, memory_resource>(
      m, "PinnedHostResource",
      "Page-locked host memory from cuMemHostAlloc: copies move at full speed and device work "
      "reads and writes it in place (through device_pointer()). A free waits on the host for "
      "the stream's work, then unpins: for long-lived buffers (put a pool in front for churn). "
      "properties.device is -1; a DeviceBuffer over it is host memory (DLPack kDLCUDAHost).")
      .def(
          "__init__",
          [](pinned_host_resource* self, std::optional<int> device, bool portable, bool device_mapped,
             bool write_combined) {
            pinned_options o;
            o.portable = portable;
            o.device_mapped = device_mapped;
            o.write_combined = write_combined;
            const int d = device.value_or(-1);
            nb::gil_scoped_release release;
            new (self) pinned_host_resource(o, d);
          },
          nb::arg("device") = nb::none(), nb::kw_only(), nb::arg("portable") = defaults.portable,
          nb::arg("device_mapped") = defaults.device_mapped, nb::arg("write_combined") = defaults.write_combined,
          "Pinned host memory allocated in `device`'s context (None: the current device). "
          "portable: pinned for every context; device_mapped: mapped into the device's address "
          "space; write_combined: fast for the host to write and the device to read, very slow "
          "for the host to read.")
      .def_prop_ro("context_device", &pinned_host_resource::device,
                   "The device in whose context the memory is allocated.")
      .def_prop_ro("portable", [](const pinned_host_resource& r) { return r.options().portable; },
                   "CU_MEMHOSTALLOC_PORTABLE.")
      .def_prop_ro("device_mapped", [](const pinned_host_resource& r) { return r.options().device_mapped; },
                   "CU_MEMHOSTALLOC_DEVICEMAP.")
      .def_prop_ro("write_combined", [](const pinned_host_resource& r) { return r.options().write_combined; },
                   "CU_MEMHOSTALLOC_WRITECOMBINED.")
      .def_prop_ro("driver_flags", &pinned_host_resource::driver_flags,
                   "The CU_MEMHOSTALLOC_* flags every allocation is made with.")
      .def(
          "device_pointer",
          [](const pinned_host_resource& r, std::uintptr_t host_pointer) {
            return reinterpret_cast<std::uintptr_t>(r.device_pointer(reinterpret_cast<const void*>(host_pointer)));
          },
          nb::arg("host_pointer"),
          "The address device work uses for `host_pointer` (anywhere inside this resource's "
          "memory): the pointer itself with unified addressing, except for write-combined memory. "
          "LogicError for memory that is not this resource's, or not mapped.")
      .def_prop_ro("allocated_bytes", &pinned_host_resource::allocated_bytes,
                   "Bytes handed out and not yet returned (as requested).")
      .def_prop_ro("allocation_count", &pinned_host_resource::allocation_count, "Allocations live now.")
      .def("__repr__", [](const pinned_host_resource& r) {
        return "<gpumem.PinnedHostResource context_device=" + std::to_string(r.device()) +
               " allocated_bytes=" + std::to_string(r.allocated_bytes()) + ">";
      });
}

}  // namespace

void bind_driver_resources(nb::module_& m) {
  bind_async(m);
  bind_managed(m);
  bind_pinned(m);
}

}  // namespace gpumem::python
