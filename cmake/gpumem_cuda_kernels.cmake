# CUDA test kernels: built when nvcc exists (GPUMEM_CUDA_KERNELS=AUTO) or when asked (ON).
# They let the tests prove on a real GPU that memory is usable by device code.
# The library itself never needs nvcc.
set(GPUMEM_HAVE_CUDA_KERNELS OFF)
if(NOT GPUMEM_CUDA_KERNELS STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)  # H100/H200; override with -DCMAKE_CUDA_ARCHITECTURES
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)  # the kernels need no more; CMake 3.25 cannot ask nvcc for C++20
    set(GPUMEM_HAVE_CUDA_KERNELS ON)
  elseif(GPUMEM_CUDA_KERNELS STREQUAL "ON")
    message(FATAL_ERROR "GPUMEM_CUDA_KERNELS=ON but no CUDA compiler (nvcc) was found")
  endif()
endif()
message(STATUS "gpumem: CUDA test kernels ${GPUMEM_HAVE_CUDA_KERNELS}")
