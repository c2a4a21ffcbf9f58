// gpumem's Python extension (gpumem._core): what the binding files share.
//
// The extension is a thin layer over libgpumem. Every call that can fail throws
// one of gpumem's C++ errors, which errors.cpp maps to gpumem's Python
// exceptions; nothing here prints or swallows an error except destructors,
// which never throw (docs/python.md, "Errors").
#pragma once

#include <cstdint>

#include <cuda.h>
#include <nanobind/nanobind.h>

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

void bind_errors(nb::module_& m);
void bind_system(nb::module_& m);
void bind_streams(nb::module_& m);
void bind_resources(nb::module_& m);
void bind_device_buffer(nb::module_& m);
void bind_cupy_hook(nb::module_& m);
void bind_ipc(nb::module_& m);
void bind_config(nb::module_& m);

}  // namespace gpumem::python
