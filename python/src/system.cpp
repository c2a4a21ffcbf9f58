// Backend selection, devices, and the simulator's controls (gpumem.sim).
#include <optional>
#include <string>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"
#include "gpumem/backend.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/sim.hpp"

namespace gpumem::python {
namespace {

backend_choice parse_choice(const std::optional<std::string>& kind) {
  if (!kind) return backend_choice::from_environment;
  if (*kind == "cuda") return backend_choice::cuda;
  if (*kind == "sim") return backend_choice::sim;
  if (*kind == "cuda_or_sim") return backend_choice::cuda_or_sim;
  throw logic_error("gpumem.select_backend: '" + *kind +
                    "' is not a backend choice: use 'cuda', 'sim', 'cuda_or_sim' or None");
}

std::string name(backend_kind k) { return std::string(to_string(k)); }

// The device whose context this thread last checked.
thread_local int this_thread_context_device = -1;

}  // namespace

// Note [A thread's first context]
// A program that allocates through gpumem's Python package may never call the CUDA
// runtime, which would make a context current at its first call on a thread: CuPy
// through gpumem.cupy (its own pool's first cudaMalloc would), or DeviceBuffer alone.
// While no context is current, the driver's and the runtime's "which context is
// current" answers take a slow path on some hosts: a DeviceBuffer made and dropped,
// whose only driver call is cuCtxGetCurrent, and CuPy's allocate+free through gpumem
// cost several times more there (W7, docs/benchmarks-history.md, "W7 again"). So the first allocation
// of a thread makes the device's primary context current when the thread has none
// (adopt_primary_context): CuPy's device is the runtime's current device, and
// DeviceBuffer's default is device 0, the runtime's default; exactly what the
// runtime's first call would have done. A thread with a current context keeps it,
// and a later check costs one compare.
void adopt_context_once(int device) {
  if (this_thread_context_device == device) [[likely]] return;
  adopt_primary_context(device);
  this_thread_context_device = device;
}

void bind_system(nb::module_& m) {
  m.def(
      "select_backend",
      [](std::optional<std::string> kind) { return name(select_backend(parse_choice(kind))); },
      nb::arg("kind").none() = nb::none(),
      "Selects the driver backend before gpumem is first used: 'cuda', 'sim', 'cuda_or_sim' (the "
      "real driver when a GPU is usable, else the simulator) or None (GPUMEM_BACKEND, default "
      "'cuda'). Returns the backend in use. LogicError if another backend is already in use.");
  m.def("current_backend", [] { return name(current_backend()); },
        "The backend in use, 'cuda' or 'sim' (selects it from GPUMEM_BACKEND if none was selected).");
  m.def("cuda_driver_usable", &cuda_driver_usable,
        "True when libcuda.so.1 loads, cuInit succeeds and a GPU exists. Selects no backend.");
  m.def("device_count", &device_count, "Devices the backend has.");
  m.def("current_device", &current_device,
        "The device of the calling thread's current context (0 when none is current).");
  m.def("set_current_device", &set_current_device, nb::arg("device"),
        "Makes the device's primary context current on the calling thread (as cudaSetDevice).");
  m.def("current_context_device", &current_context_device,
        "The device of the calling thread's current context, or None when none is current.");
  m.def(
      "device_memory_info",
      [](int device) {
        const memory_info i = gpumem::device_memory_info(device);
        return std::make_pair(i.free_bytes, i.total_bytes);
      },
      nb::arg("device"), "(free, total) bytes as the driver reports them.");
  m.def("device_name", &device_name, nb::arg("device"), "The device's name, as the driver reports it.");
  m.def("peers_of", &peers_of, nb::arg("device"),
        "The other devices whose work can reach the device's memory (peer access), in ordinal order.");
  m.def("driver_version", &driver_version, "CUDA version of the driver, e.g. 13000.");

  nb::module_ sim = m.def_submodule("sim", "Controls of the host simulator (GPUMEM_BACKEND=sim).");
  sim.def("fail_nth_allocation", &sim::fail_nth_allocation, nb::arg("n"),
          "The nth device allocation from now on fails with out-of-memory (0: off).");
  sim.def("fail_allocations_at_random", &sim::fail_allocations_at_random, nb::arg("probability"),
          nb::arg("seed"),
          "Each device allocation from now on fails with out-of-memory with this probability "
          "(0: off), drawn from a generator seeded with `seed`.");
  sim.def("injected_failures", &sim::injected_failures,
          "Allocations (and mappings) the fault injection has failed so far.");
  sim.def("used_bytes", &sim::used_bytes, nb::arg("device"),
          "Bytes of the device's simulated memory in use, as the driver counts them.");
  sim.def("live_allocations", &sim::live_allocations, nb::arg("device"),
          "Device allocations of the simulated device not yet freed, as the driver counts them.");
  sim.def("set_capture_watch_available", &sim::set_capture_watch_available, nb::arg("available"),
          "Whether a capture watch can start (default True); False stands for a profiler holding "
          "CUPTI: a watch started meanwhile stays inactive and the pools ask the driver.");
  sim.def("driver_calls", &sim::driver_calls, nb::arg("entry_point"),
          "Calls gpumem has made through the driver entry point (as cuda.h names it, e.g. "
          "'cuStreamWaitEvent'), from every thread, since the simulator started.");
}

}  // namespace gpumem::python
