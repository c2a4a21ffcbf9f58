// Modules and kernel launches: the simulator has no device code to run, so it
// loads no module and launches nothing; each call answers CUDA_ERROR_NOT_SUPPORTED
// (gpumem-bench's W8, the only caller, reports its cells as needing a GPU).
#include "sim/sim_entry_points.hpp"

namespace gpumem::detail::simulator {

CUresult module_load_data(CUmodule* module, const void*) {
  if (module != nullptr) *module = nullptr;
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult module_unload(CUmodule) { return CUDA_ERROR_NOT_SUPPORTED; }

CUresult module_get_function(CUfunction* function, CUmodule, const char*) {
  if (function != nullptr) *function = nullptr;
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult launch_kernel(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                       unsigned int, unsigned int, CUstream, void**, void**) {
  return CUDA_ERROR_NOT_SUPPORTED;
}

}  // namespace gpumem::detail::simulator
