// The real backend: libcuda.so.1 opened with dlopen, entry points resolved with
// cuGetProcAddress. gpumem links no CUDA library, so it loads where no driver is.
#include "driver/cuda_loader.hpp"

#include <dlfcn.h>

#include <string>

namespace gpumem::detail {
namespace {

// An entry point the driver does not have: calls fail with CUDA_ERROR_NOT_FOUND,
// which GPUMEM_CU reports with the API's name, instead of a null call.
template <class F>
struct missing_entry;
template <class... A>
struct missing_entry<CUresult (*)(A...)> {
  static CUresult CUDAAPI call(A...) { return CUDA_ERROR_NOT_FOUND; }
};

// Oldest driver gpumem supports: cuStreamGetDevice arrived in 12.8.
constexpr int minimum_driver_version = 12080;

cuda_load_result load() noexcept {
  cuda_load_result out;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    out.result = CUDA_ERROR_SHARED_OBJECT_INIT_FAILED;
    out.reason = std::string("cannot load the CUDA driver libcuda.so.1 (") + (why ? why : "?") +
                 "); install an NVIDIA driver, or set GPUMEM_BACKEND=sim to use the host simulator";
    return out;
  }
  using get_proc_fn = CUresult(CUDAAPI*)(const char*, void**, int, cuuint64_t,
                                         CUdriverProcAddressQueryResult*);
  auto get_proc = reinterpret_cast<get_proc_fn>(dlsym(lib, "cuGetProcAddress_v2"));
  if (get_proc == nullptr) {
    out.result = CUDA_ERROR_NOT_FOUND;
    out.reason = "libcuda.so.1 has no cuGetProcAddress_v2: the driver is older than CUDA 12";
    return out;
  }
  static driver_api table;
  table.kind = backend_kind::cuda;
#define GPUMEM_RESOLVE_ENTRY(name, version)                                                           \
  {                                                                                          \
    void* fn = nullptr;                                                                      \
    CUdriverProcAddressQueryResult status{};                                                 \
    if (get_proc(#name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &status) ==               \
            CUDA_SUCCESS &&                                                                  \
        status == CU_GET_PROC_ADDRESS_SUCCESS && fn != nullptr) {                            \
      table.name = reinterpret_cast<decltype(table.name)>(fn);                               \
    } else {                                                                                 \
      table.name = &missing_entry<decltype(table.name)>::call;                               \
    }                                                                                        \
  }
  GPUMEM_DRIVER_ENTRY_POINTS(GPUMEM_RESOLVE_ENTRY)
#undef GPUMEM_RESOLVE_ENTRY

  int version = 0;
  if (table.cuDriverGetVersion(&version) != CUDA_SUCCESS || version < minimum_driver_version) {
    out.result = CUDA_ERROR_NOT_SUPPORTED;
    out.reason = "the CUDA driver reports version " + std::to_string(version) +
                 "; gpumem needs 12.8 (12080) or newer";
    return out;
  }
  if (CUresult r = table.cuInit(0); r != CUDA_SUCCESS) {
    const char* name = nullptr;
    table.cuGetErrorName(r, &name);
    out.result = r;
    out.reason = std::string("cuInit failed with ") + (name ? name : "an unknown error") +
                 ": no usable GPU; set GPUMEM_BACKEND=sim to use the host simulator";
    return out;
  }
  int count = 0;
  if (CUresult r = table.cuDeviceGetCount(&count); r != CUDA_SUCCESS || count == 0) {
    out.result = r != CUDA_SUCCESS ? r : CUDA_ERROR_NO_DEVICE;
    out.reason = "the CUDA driver sees no GPU; set GPUMEM_BACKEND=sim to use the host simulator";
    return out;
  }
  out.table = &table;
  return out;
}

}  // namespace

const cuda_load_result& load_cuda_driver() noexcept {
  static const cuda_load_result result = load();
  return result;
}

}  // namespace gpumem::detail
