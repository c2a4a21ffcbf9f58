// Loads the real CUDA driver (libcuda.so.1) at run time.
#pragma once

#include <string>

#include "driver/driver.hpp"

namespace gpumem::detail {

struct cuda_load_result {
  const driver_api* table = nullptr;  // null when the driver cannot be used
  CUresult result = CUDA_SUCCESS;     // why not, as a CUDA result
  std::string reason;                 // why not, in words
};

// dlopen("libcuda.so.1"), resolve every entry point with cuGetProcAddress for the
// cuda.h version gpumem was built with, cuInit(0), and require a GPU. Done once;
// later calls return the same result.
const cuda_load_result& load_cuda_driver() noexcept;

}  // namespace gpumem::detail
