// The driver seam: one table of CUDA driver entry points, filled by the real
// driver (cuda_loader.cpp) or by the host simulator (src/sim), and the one way
// gpumem calls into it (GPUMEM_CU). See entry_points.hpp for the contract.
#pragma once

#include <atomic>
#include <cstddef>
#include <string_view>
#include <type_traits>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "driver/entry_points.hpp"
#include "gpumem/backend.hpp"
#include "gpumem/export.hpp"

namespace gpumem::detail {

struct driver_api {
#define GPUMEM_DECLARE_ENTRY(name, version) decltype(&::name) name = nullptr;
  GPUMEM_DRIVER_ENTRY_POINTS(GPUMEM_DECLARE_ENTRY)
#undef GPUMEM_DECLARE_ENTRY
  backend_kind kind = backend_kind::cuda;
};

// The version each entry is resolved at has the signature gpumem calls.
#define GPUMEM_CHECK_ENTRY_ABI(name, version)                                           \
  static_assert(std::is_same_v<decltype(&::name), PFN_##name##_v##version>,             \
                #name ": the ABI version in entry_points.hpp does not match cuda.h");
GPUMEM_DRIVER_ENTRY_POINTS(GPUMEM_CHECK_ENTRY_ABI)
#undef GPUMEM_CHECK_ENTRY_ABI

// The selected backend's table, or null before selection. Written only under
// driver.cpp's selection mutex; read here, on every driver call.
GPUMEM_EXPORT extern std::atomic<const driver_api*> selected_driver;

// Selects the backend (GPUMEM_BACKEND) when none is yet, under the selection mutex.
GPUMEM_EXPORT const driver_api& select_driver();

// The table of the selected backend; selects it on first use (GPUMEM_BACKEND or
// select_backend()). Throws driver_unavailable when the backend cannot be used.
// Inline: the pools' capture query goes through it on every call, where an
// exported accessor costs a call through the PLT each time (docs/benchmarks.md,
// "Where gpumem loses, and why").
inline const driver_api& driver() {
  if (const driver_api* d = selected_driver.load(std::memory_order_acquire)) [[likely]] return *d;
  return select_driver();
}
// The selected backend's table, or null before selection; never selects or locks.
inline const driver_api* driver_if_selected() noexcept { return selected_driver.load(std::memory_order_acquire); }

// Throws gpumem::cuda_error for a failed call. Cold path kept out of line.
[[noreturn]] GPUMEM_EXPORT void throw_cuda_error(CUresult result, const char* api, const char* file, int line);

inline void check(CUresult result, const char* api, const char* file, int line) {
  if (result != CUDA_SUCCESS) [[unlikely]] {
    throw_cuda_error(result, api, file, line);
  }
}

// Name and description of a result, from the backend when it can say, else generic.
GPUMEM_EXPORT std::string_view error_name(CUresult result) noexcept;
GPUMEM_EXPORT std::string_view error_string(CUresult result) noexcept;

// Makes `device`'s primary context current on this thread for the guard's
// lifetime and restores the previous one after (like cudaSetDevice, undone).
class GPUMEM_EXPORT device_context_guard {
 public:
  explicit device_context_guard(int device);
  ~device_context_guard();
  device_context_guard(const device_context_guard&) = delete;
  device_context_guard& operator=(const device_context_guard&) = delete;

 private:
  CUcontext previous_ = nullptr;
  bool switched_ = false;
};

// The handles that mean the current context's default streams. A call on one
// needs the device's context current (device_context_guard); a call on a
// created stream acts in that stream's context, whichever is current (so the
// pools' fences and waits on created streams skip the guard's driver calls).
inline bool is_default_stream(CUstream h) noexcept {
  return h == nullptr || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD;
}

// The primary context of a device (retained once, held for the process's life).
GPUMEM_EXPORT CUcontext primary_context(int device);
// Throws gpumem::logic_error unless 0 <= device < device count.
GPUMEM_EXPORT void validate_device(int device, const char* where);
// The device whose primary context gpumem retained is `ctx`, or -1 (another
// context, or a primary context gpumem has not retained): no driver call.
GPUMEM_EXPORT int device_of_primary_context(CUcontext ctx) noexcept;

}  // namespace gpumem::detail

// In-tree tools and tests call the table too; hence the exports above.

// Calls a driver entry point through the table and throws gpumem::cuda_error,
// naming the API, the CUDA error and file:line, if it fails.
#define GPUMEM_CU(fn, ...) \
  ::gpumem::detail::check(::gpumem::detail::driver().fn(__VA_ARGS__), #fn, __FILE__, __LINE__)
