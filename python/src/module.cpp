// gpumem._core: the extension module. Importing it loads libgpumem and touches
// no CUDA: the backend is selected on first use (docs/python.md).
#include "bindings.hpp"

#ifndef GPUMEM_VERSION
#define GPUMEM_VERSION "unknown"
#endif

NB_MODULE(_core, m) {
  namespace gp = gpumem::python;
  m.doc() = "gpumem's C++ library as a Python extension; use the gpumem package.";
  m.attr("__version__") = GPUMEM_VERSION;
  // Buffers that Python still holds at exit (Numba arrays in module globals, say)
  // are not leaks worth a warning: the process is ending.
  nanobind::set_leak_warnings(false);
  gp::bind_errors(m);
  gp::bind_system(m);
  gp::bind_streams(m);
  gp::bind_resources(m);
  gp::bind_driver_resources(m);
  gp::bind_host_registration(m);
  gp::bind_adaptors(m);
  gp::bind_oom_retry(m);
  gp::bind_device_buffer(m);
  gp::bind_cupy_hook(m);
  gp::bind_numba_allocations(m);
  gp::bind_ipc(m);
  gp::bind_config(m);
  gp::bind_diagnostics(m);
}
