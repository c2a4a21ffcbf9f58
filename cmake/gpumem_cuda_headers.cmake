# Finds the CUDA toolkit's cuda.h (types only; nothing is linked) and defines
# the interface target gpumem_cuda_headers. Looked for, in order: GPUMEM_CUDA_INCLUDE_DIR,
# CUDA_HOME / CUDA_PATH, the directory of nvcc, /usr/local/cuda, and the include/ of
# the pip package nvidia-cuda-runtime (scripts/bootstrap installs it when no toolkit exists).
if(TARGET gpumem_cuda_headers)
  return()
endif()
find_program(_gpumem_nvcc nvcc HINTS $ENV{CUDA_HOME}/bin $ENV{CUDA_PATH}/bin /usr/local/cuda/bin)
set(_gpumem_hints ${GPUMEM_CUDA_INCLUDE_DIR} $ENV{GPUMEM_CUDA_INCLUDE_DIR}
    $ENV{CUDA_HOME}/include $ENV{CUDA_PATH}/include /usr/local/cuda/include)
if(_gpumem_nvcc)
  get_filename_component(_gpumem_nvcc_dir "${_gpumem_nvcc}" DIRECTORY)
  list(APPEND _gpumem_hints "${_gpumem_nvcc_dir}/../include")
endif()
find_path(GPUMEM_CUDA_H_DIR cuda.h HINTS ${_gpumem_hints} PATH_SUFFIXES targets/x86_64-linux/include)
if(NOT GPUMEM_CUDA_H_DIR)
  message(FATAL_ERROR "gpumem needs the CUDA toolkit's cuda.h (CUDA >= 12.8). Install the toolkit, "
                      "or run scripts/bootstrap, or set GPUMEM_CUDA_INCLUDE_DIR.")
endif()
add_library(gpumem_cuda_headers INTERFACE)
target_include_directories(gpumem_cuda_headers SYSTEM INTERFACE "$<BUILD_INTERFACE:${GPUMEM_CUDA_H_DIR}>")
