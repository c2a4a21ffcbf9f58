// gpumem._core's IPC: exporting a pointer to handle bytes and importing them (the
// gpumem.ipc module builds the Python objects on these; docs/ipc.md).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"
#include "driver/driver.hpp"
#include "gpumem/error.hpp"
#include "gpumem/ipc.hpp"

namespace gpumem::python {
namespace {

const char* kind_name(ipc_kind k) {
  switch (k) {
    case ipc_kind::legacy: return "legacy";
    case ipc_kind::pool: return "pool";
    case ipc_kind::vmm: return "vmm";
  }
  return "unknown";
}

nb::bytes to_bytes(const std::vector<std::byte>& v) { return nb::bytes(reinterpret_cast<const char*>(v.data()), v.size()); }

std::span<const std::byte> view(const nb::bytes& b) {
  return {reinterpret_cast<const std::byte*>(b.c_str()), b.size()};
}

}  // namespace

void bind_ipc(nb::module_& m) {
  nb::class_<ipc_handle>(m, "_IpcHandle",
                         "An exported allocation (owns the descriptors it carries in the exporting process).")
      .def_prop_ro("kind", [](const ipc_handle& h) { return kind_name(h.kind()); })
      .def_prop_ro("size", &ipc_handle::size)
      .def_prop_ro("offset", &ipc_handle::offset)
      .def_prop_ro("exporter_pid", [](const ipc_handle& h) { return static_cast<long>(h.exporter_pid()); })
      .def("serialize", [](const ipc_handle& h) { return to_bytes(h.serialize()); })
      .def_static("deserialize", [](const nb::bytes& b) { return ipc_handle::deserialize(view(b)); });

  nb::class_<ipc_mapping>(m, "_IpcMapping", "Another process's memory mapped here; close() unmaps.")
      .def_prop_ro("ptr", [](const ipc_mapping& mp) { return reinterpret_cast<std::uintptr_t>(mp.data()); })
      .def_prop_ro("size", &ipc_mapping::size)
      .def_prop_ro("device", &ipc_mapping::device)
      .def_prop_ro("closed", [](const ipc_mapping& mp) { return !mp; })
      .def("copy_to_host",
           [](const ipc_mapping& mp) {
             if (!mp) throw logic_error("gpumem.ipc: the memory is closed");
             std::vector<std::byte> host(mp.size());
             {
               nb::gil_scoped_release release;
               const detail::device_context_guard guard(mp.device());
               GPUMEM_CU(cuMemcpy, reinterpret_cast<CUdeviceptr>(host.data()), reinterpret_cast<CUdeviceptr>(mp.data()),
                         mp.size());
             }
             return to_bytes(host);
           })
      .def("copy_from_host",
           [](const ipc_mapping& mp, const nb::bytes& data) {
             if (!mp) throw logic_error("gpumem.ipc: the memory is closed");
             if (data.size() != mp.size()) throw logic_error("gpumem.ipc: copy_from_host needs exactly size bytes");
             nb::gil_scoped_release release;
             const detail::device_context_guard guard(mp.device());
             GPUMEM_CU(cuMemcpy, reinterpret_cast<CUdeviceptr>(mp.data()), reinterpret_cast<CUdeviceptr>(data.c_str()),
                       mp.size());
           })
      .def_prop_ro("user_device", &ipc_mapping::user_device,
                   "The device the mapping was made for (peer access where it is not `device`).")
      .def("close", &ipc_mapping::close);

  m.def(
      "_ipc_export",
      [](std::uintptr_t ptr, std::size_t size) {
        nb::gil_scoped_release release;
        return export_allocation(reinterpret_cast<const void*>(ptr), size);
      },
      nb::arg("ptr"), nb::arg("size"));
  m.def(
      "_ipc_import",
      [](const ipc_handle& h, int device) {
        nb::gil_scoped_release release;
        return import_allocation(h, import_options{.device = device});
      },
      nb::arg("handle"), nb::arg("device") = -1);
}

}  // namespace gpumem::python
