// The interface between gpumem-bench and its peer plugins: shared libraries
// beside the executable that wrap an allocator gpumem does not link, built only
// where that allocator's headers and libraries are (libgpumem-bench-rmm.so with
// RMM's wheel, libgpumem-bench-torch.so with the torch package). gpumem-bench
// loads them with dlopen at start, so a missing or broken plugin costs its rows
// and nothing else (peers/plugin_peers.cpp).
//
// A plugin includes only this header, never gpumem's: it exports
//   extern "C" gpumem::bench::plugin::library* gpumem_bench_plugin(int api_version);
// returning a library that lives as long as the process (or nullptr when it
// does not speak `api_version`). Both sides are built by the same compiler
// against the same C++ library; nothing crosses but these classes, C strings
// and exceptions whose catching needs only std:: types.
#pragma once

#include <cstddef>
#include <new>
#include <string>
#include <utility>

namespace gpumem::bench::plugin {

inline constexpr int api_version = 1;
inline constexpr const char* entry_point = "gpumem_bench_plugin";

// The plugins and the rows they serve (the rows' names in every table).
inline constexpr char rmm_library[] = "libgpumem-bench-rmm.so";
inline constexpr char rmm_pool[] = "RMM pool";
inline constexpr char rmm_arena[] = "RMM arena";
inline constexpr char rmm_arena_free[] = "RMM arena (free memory)";
inline constexpr char rmm_binning[] = "RMM binning";
inline constexpr char rmm_cuda_async[] = "RMM cuda_async";
inline constexpr char torch_library[] = "libgpumem-bench-torch.so";
inline constexpr char torch_caching[] = "torch caching";
inline constexpr char torch_expandable[] = "torch caching (expandable)";

// Thrown by allocate when the allocator ran out of memory: a std::bad_alloc, as
// gpumem's own out_of_memory is, so the workloads treat both alike. Any other
// failure is some other std::exception, which the bench reports as a failed cell.
class out_of_memory : public std::bad_alloc {
 public:
  explicit out_of_memory(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

// One row's allocator, made fresh for every cell as gpumem's resources are.
// `stream` is a CUstream (= cudaStream_t) of the device's primary context, which
// the bench and the CUDA runtime share; allocate returns memory usable by work
// queued on it after the call, deallocate frees in that stream's order.
class allocator {
 public:
  virtual ~allocator() = default;
  virtual void* allocate(std::size_t bytes, void* stream, std::size_t alignment) = 0;
  virtual void deallocate(void* ptr, std::size_t bytes, void* stream, std::size_t alignment) = 0;
  // May allocate and deallocate be called from several threads at once (W3)?
  virtual bool thread_safe() const noexcept = 0;
};

class library {
 public:
  // What the plugin wraps, with its version: "RMM 26.10.0".
  virtual const char* version() const noexcept = 0;
  // Whether this library serves the row named `peer` ("RMM pool").
  virtual bool has(const char* peer) const noexcept = 0;
  // A new allocator for the row `peer` on `device`; throws what its
  // constructor throws (out_of_memory when the initial pool does not fit).
  virtual allocator* create(const char* peer, int device) = 0;

 protected:
  ~library() = default;  // never deleted through this interface
};

using entry_function = library* (*)(int api_version);

}  // namespace gpumem::bench::plugin
