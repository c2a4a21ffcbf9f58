// CUDA test kernels (touch_kernels.cu), launched on a driver stream.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include <cuda.h>

namespace gpumem::test::kernels {

void fill(void* ptr, std::size_t bytes, std::uint8_t value, CUstream s);
// Adds the number of bytes != value to *device_counter (device memory).
void count_mismatches(const void* ptr, std::size_t bytes, std::uint8_t value,
                      unsigned long long* device_counter, CUstream s);
// Keeps the stream busy on the device for `duration`.
void spin(std::chrono::nanoseconds duration, CUstream s);

}  // namespace gpumem::test::kernels
