// CUDA kernels the tests use to write and read allocations from the device.
#include "support/touch_kernels.hpp"

#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

namespace gpumem::test::kernels {
namespace {

__global__ void fill_kernel(unsigned char* p, std::size_t n, unsigned char v) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    p[i] = v;
  }
}

__global__ void count_kernel(const unsigned char* p, std::size_t n, unsigned char v,
                             unsigned long long* out) {
  unsigned long long local = 0;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    local += p[i] != v ? 1 : 0;
  }
  if (local != 0) atomicAdd(out, local);
}

__device__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_kernel(unsigned long long ns) {
  const unsigned long long start = global_ns();
  while (global_ns() - start < ns) {
    __nanosleep(1000);
  }
}

unsigned grid_for(std::size_t bytes) {
  const std::size_t blocks = (bytes + 255) / 256;
  return static_cast<unsigned>(blocks < 1024 ? (blocks == 0 ? 1 : blocks) : 1024);
}

void check_launch(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string(what) + " launch failed: " + cudaGetErrorString(e));
  }
}

}  // namespace

void fill(void* ptr, std::size_t bytes, std::uint8_t value, CUstream s) {
  fill_kernel<<<grid_for(bytes), 256, 0, s>>>(static_cast<unsigned char*>(ptr), bytes, value);
  check_launch("fill_kernel");
}

void count_mismatches(const void* ptr, std::size_t bytes, std::uint8_t value,
                      unsigned long long* device_counter, CUstream s) {
  count_kernel<<<grid_for(bytes), 256, 0, s>>>(static_cast<const unsigned char*>(ptr), bytes,
                                               value, device_counter);
  check_launch("count_kernel");
}

void spin(std::chrono::nanoseconds duration, CUstream s) {
  spin_kernel<<<1, 1, 0, s>>>(static_cast<unsigned long long>(duration.count()));
  check_launch("spin_kernel");
}

}  // namespace gpumem::test::kernels
