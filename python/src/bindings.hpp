// gpumem's Python extension (gpumem._core): what the binding files share.
//
// The extension is a thin layer over libgpumem. Every call that can fail throws
// one of gpumem's C++ errors, which errors.cpp maps to gpumem's Python
// exceptions; nothing here prints or swallows an error except destructors,
// which never throw (docs/python.md, "Errors").
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include <cuda.h>
#include <nanobind/nanobind.h>

#include "gpumem/error.hpp"

namespace gpumem {
struct allocation_counters;  // gpumem/adaptors/statistics.hpp
}

namespace gpumem::python {

namespace nb = nanobind;

// A stream as Python callers give it: None, a gpumem.Stream, a raw int handle,
// or any object with the __cuda_stream__ protocol. `owner` keeps the Python
// object alive as long as the stream is needed (none for raw ints and None).
struct stream_arg {
  CUstream handle = nullptr;  // nullptr: the legacy default stream
  nb::object owner;
};

// Converts a Python stream argument; TypeError for anything else.
stream_arg to_stream(nb::handle obj);

// Makes `device`'s primary context current if the calling thread has none, checked
// once per thread and device (Note [A thread's first context] in system.cpp).
void adopt_context_once(int device);

// A byte count from Python: an int (or anything with __index__, as numpy's
// integers), not a bool, a str or a float (TypeError naming `where`); negative
// or past 2^64 - 1: gpumem.LogicError.
std::size_t to_size(nb::handle obj, const char* where);

// The value the __cuda_array_interface__ and DLPack protocols use for a stream:
// 1 for the legacy default stream, 2 for the per-thread default stream, else the handle.
std::uintptr_t protocol_stream_value(CUstream handle) noexcept;

// Raised for what a resource or backend cannot do (Python NotImplementedError subclass).
struct unsupported_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The gpumem.OutOfMemoryError instance (with its attributes) that the exception
// translator raises for `e`; for code that hands the error to Python without raising
// it (the OomRetryAdaptor's callbacks). Needs the GIL.
nb::object out_of_memory_object(const out_of_memory& e);

// A statistics adaptor's counters as a dict: current_bytes, peak_bytes, total_bytes
// and the same three as counts (StatisticsAdaptor.statistics(), stack_report()).
nb::dict counters_dict(const allocation_counters& c);

// One of a few names for an option (strings as Python callers write them, e.g.
// ipc="posix_file_descriptor"); LogicError naming `where`, the option and the choices.
template <typename E, std::size_t N>
E parse_choice(const std::string& value, const std::pair<const char*, E> (&choices)[N], const char* where,
               const char* option) {
  std::string known;
  for (const auto& [name, e] : choices) {
    if (value == name) return e;
    known += std::string(known.empty() ? "'" : ", '") + name + "'";
  }
  throw logic_error(std::string(where) + ": " + option + "='" + value + "' is not one of " + known);
}

// The name of `e` among `choices` (the inverse of parse_choice).
template <typename E, std::size_t N>
const char* choice_name(E e, const std::pair<const char*, E> (&choices)[N]) {
  for (const auto& c : choices) {
    if (c.second == e) return c.first;
  }
  return "unknown";
}

void bind_errors(nb::module_& m);
void bind_system(nb::module_& m);
void bind_streams(nb::module_& m);
void bind_resources(nb::module_& m);
void bind_driver_resources(nb::module_& m);  // AsyncResource, ManagedResource, PinnedHostResource
void bind_host_registration(nb::module_& m);
void bind_adaptors(nb::module_& m);          // every adaptor but the next
void bind_oom_retry(nb::module_& m);         // OomRetryAdaptor: Python callbacks on out-of-memory
void bind_device_buffer(nb::module_& m);
void bind_cupy_hook(nb::module_& m);
void bind_numba_allocations(nb::module_& m);  // gpumem.numba's device allocations
void bind_ipc(nb::module_& m);
void bind_config(nb::module_& m);
void bind_diagnostics(nb::module_& m);     // gpumem's diagnostics into logging

}  // namespace gpumem::python
