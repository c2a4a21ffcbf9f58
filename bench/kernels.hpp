// Running hand-written PTX from gpumem-bench: a module loaded into a device's
// primary context (the driver JIT-compiles the PTX for the device), and timing
// work queued on a stream with CUDA events. gpumem-bench links no CUDA library,
// so workloads that need the device to touch memory (W8, W9) embed their kernels
// as PTX text; ctest checks each with ptxas where a CUDA toolkit is installed.
#pragma once

#include <functional>

#include <cuda.h>

namespace gpumem::bench {

class ptx_module {
 public:
  // Loads `ptx` (NUL-terminated) into `device`'s primary context.
  ptx_module(int device, const char* ptx);
  ~ptx_module();
  ptx_module(const ptx_module&) = delete;
  ptx_module& operator=(const ptx_module&) = delete;

  CUfunction function(const char* name) const;
  int device() const { return device_; }

 private:
  int device_;
  CUmodule module_ = nullptr;
};

// Milliseconds between two events recorded on `s` around `enqueue()` (which
// queues work on `s`), after waiting for the second. `s` belongs to `device`.
double elapsed_ms(int device, CUstream s, const std::function<void()>& enqueue);

}  // namespace gpumem::bench
