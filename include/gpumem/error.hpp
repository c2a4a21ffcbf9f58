// gpumem's error family. Every failure is one of these types:
//  - cuda_error: a driver call failed (API name, CUDA error name and text, file:line);
//    driver_unavailable is the cuda_error for "no usable driver or GPU here".
//  - out_of_memory: a request could not be satisfied (derives from std::bad_alloc).
//  - logic_error: the caller misused the API (bad size, alignment, pointer, stream, device).
//  - ipc_error: sharing memory between processes failed for a reason other than a
//    driver call (docs/ipc.md): memory that cannot be exported, malformed handle bytes,
//    a descriptor that cannot be had, a device not visible here.
// A resource that throws any of them stays usable. All of them are also a
// gpumem::error, so `catch (const gpumem::error& e)` takes every one, while each
// keeps its standard base (std::runtime_error, std::bad_alloc, std::logic_error).
#pragma once

#include <cstddef>
#include <new>
#include <stdexcept>
#include <string>

#include <cuda.h>

#include "gpumem/export.hpp"

namespace gpumem {

// The base every gpumem exception has beside its standard one: a mixin (no
// std::exception of its own, so each keeps exactly one), with the message.
class GPUMEM_EXPORT error {
 public:
  virtual ~error();
  // The exception's message (its what()).
  virtual const char* message() const noexcept = 0;

 protected:
  error() = default;
  error(const error&) = default;
  error& operator=(const error&) = default;
};

class GPUMEM_EXPORT cuda_error : public std::runtime_error, public error {
 public:
  cuda_error(CUresult result, std::string api, std::string file, int line);
  cuda_error(CUresult result, std::string api, std::string message);
  const char* message() const noexcept override { return what(); }

  CUresult result() const noexcept { return result_; }
  const std::string& api() const noexcept { return api_; }
  const std::string& file() const noexcept { return file_; }
  int line() const noexcept { return line_; }

 private:
  CUresult result_;
  std::string api_;
  std::string file_;
  int line_ = 0;
};

// No CUDA driver (libcuda.so.1 missing), no GPU, or a driver too old for gpumem.
class GPUMEM_EXPORT driver_unavailable : public cuda_error {
 public:
  using cuda_error::cuda_error;
};

struct out_of_memory_info {
  std::size_t requested_bytes = 0;
  int device = -1;                        // -1: host memory
  std::string resource;                   // which resource failed, e.g. "cuda_resource"
  std::size_t resource_held_bytes = 0;    // what that resource holds now
  std::size_t device_free_bytes = 0;      // what the device reports free
  std::size_t device_total_bytes = 0;
  std::string reason;                     // why, in words, and a hint where one helps
};

class GPUMEM_EXPORT out_of_memory : public std::bad_alloc, public error {
 public:
  explicit out_of_memory(out_of_memory_info info);
  const char* what() const noexcept override { return message_.c_str(); }
  const char* message() const noexcept override { return message_.c_str(); }
  const out_of_memory_info& info() const noexcept { return info_; }
  std::size_t requested_bytes() const noexcept { return info_.requested_bytes; }

 private:
  out_of_memory_info info_;
  std::string message_;
};

class GPUMEM_EXPORT logic_error : public std::logic_error, public error {
 public:
  using std::logic_error::logic_error;
  const char* message() const noexcept override { return what(); }
};

enum class ipc_errc {
  not_exportable,      // managed, host or non-shareable memory: the message says what to configure
  malformed_handle,    // bytes that are not a gpumem handle: truncated, forged, another version
  same_process,        // imported in the process that exported it
  device_not_visible,  // the exporter's device (by UUID) is not visible in this process
  descriptor_unavailable,  // pidfd_getfd or the descriptor channel could not supply a descriptor
  peer_access_unavailable,  // the device asked to use imported memory cannot access its device
};

class GPUMEM_EXPORT ipc_error : public std::runtime_error, public error {
 public:
  ipc_error(ipc_errc code, const std::string& text) : std::runtime_error(text), code_(code) {}
  ipc_errc code() const noexcept { return code_; }
  const char* message() const noexcept override { return what(); }

 private:
  ipc_errc code_;
};

}  // namespace gpumem
