// Simulator: page-locked host memory (cuMemHostAlloc and its flags, device
// pointers, write-combined aliases), registration of existing host memory, and
// managed memory.
#include <sys/mman.h>

#include <cstring>
#include <vector>

#include "sim_test_support.hpp"

namespace gpumem::sim_test {
namespace {

class sim_host_memory_test : public sim_test {};

void* host_alloc(std::size_t bytes, unsigned int flags) {
  void* p = nullptr;
  EXPECT_EQ(cu().cuMemHostAlloc(&p, bytes, flags), CUDA_SUCCESS);
  return p;
}

TEST_F(sim_host_memory_test, flags_are_kept_and_checked) {
  constexpr unsigned int all = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  for (unsigned int flags : {0u, 1u * CU_MEMHOSTALLOC_PORTABLE, 1u * CU_MEMHOSTALLOC_DEVICEMAP, all}) {
    void* p = host_alloc(10000, flags);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % page, 0u);
    std::memset(p, 0x5A, 10000);  // host memory: the host writes it directly
    unsigned int got = ~0u;
    EXPECT_EQ(cu().cuMemHostGetFlags(&got, static_cast<char*>(p) + 100), CUDA_SUCCESS);
    EXPECT_EQ(got, flags);
    EXPECT_EQ(cu().cuMemFreeHost(p), CUDA_SUCCESS);
  }
  void* p = nullptr;
  EXPECT_EQ(cu().cuMemHostAlloc(&p, 64, 0x8), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemHostAlloc(&p, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemHostAlloc(nullptr, 64, 0), CUDA_ERROR_INVALID_VALUE);
  int on_stack = 0;
  unsigned int got = 0;
  EXPECT_EQ(cu().cuMemHostGetFlags(&got, &on_stack), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemFreeHost(&on_stack), CUDA_ERROR_INVALID_VALUE);
  p = host_alloc(64, 0);
  EXPECT_EQ(cu().cuMemFreeHost(static_cast<char*>(p) + 16), CUDA_ERROR_INVALID_VALUE);  // inside, not the start
  EXPECT_EQ(cu().cuMemFreeHost(p), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemFreeHost(p), CUDA_ERROR_INVALID_VALUE);  // twice
}

TEST_F(sim_host_memory_test, calls_need_a_context) {
  current_device d0(0);
  ASSERT_EQ(cu().cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
  void* p = nullptr;
  EXPECT_EQ(cu().cuMemHostAlloc(&p, 64, 0), CUDA_ERROR_INVALID_CONTEXT);
  std::vector<char> buffer(64);
  EXPECT_EQ(cu().cuMemHostRegister(buffer.data(), buffer.size(), 0), CUDA_ERROR_INVALID_CONTEXT);
  CUdeviceptr d = 0;
  EXPECT_EQ(cu().cuMemAllocManaged(&d, 64, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_INVALID_CONTEXT);
}

TEST_F(sim_host_memory_test, mapped_memory_has_a_device_pointer) {
  void* mapped = host_alloc(3 * page, CU_MEMHOSTALLOC_DEVICEMAP);
  CUdeviceptr d = 0;
  ASSERT_EQ(cu().cuMemHostGetDevicePointer(&d, mapped, 0), CUDA_SUCCESS);
  EXPECT_EQ(d, reinterpret_cast<CUdeviceptr>(mapped)) << "unified addressing: the same value";
  ASSERT_EQ(cu().cuMemHostGetDevicePointer(&d, static_cast<char*>(mapped) + 100, 0), CUDA_SUCCESS);
  EXPECT_EQ(d, reinterpret_cast<CUdeviceptr>(mapped) + 100);
  EXPECT_EQ(cu().cuMemHostGetDevicePointer(&d, mapped, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemHostGetDevicePointer(nullptr, mapped, 0), CUDA_ERROR_INVALID_VALUE);

  void* unmapped = host_alloc(page, 0);
  EXPECT_EQ(cu().cuMemHostGetDevicePointer(&d, unmapped, 0), CUDA_ERROR_INVALID_VALUE);
  int on_stack = 0;
  EXPECT_EQ(cu().cuMemHostGetDevicePointer(&d, &on_stack, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemFreeHost(mapped), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemFreeHost(unmapped), CUDA_SUCCESS);
}

TEST_F(sim_host_memory_test, write_combined_memory_has_its_own_device_pointer_to_the_same_bytes) {
  auto* host =
      static_cast<unsigned char*>(host_alloc(2 * page, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED));
  CUdeviceptr d = 0;
  ASSERT_EQ(cu().cuMemHostGetDevicePointer(&d, host, 0), CUDA_SUCCESS);
  EXPECT_NE(d, reinterpret_cast<CUdeviceptr>(host)) << "the driver's device pointer differs for write-combined memory";
  // Device work through the device pointer writes what the host then reads.
  CUstream s = nullptr;
  ASSERT_EQ(cu().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemsetD8Async(d + 10, 0xC3, 100, s), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamSynchronize(s), CUDA_SUCCESS);
  EXPECT_EQ(host[10], 0xC3);
  EXPECT_EQ(host[109], 0xC3);
  host[500] = 0x11;
  unsigned char back = 0;
  ASSERT_EQ(cu().cuMemcpy(reinterpret_cast<CUdeviceptr>(&back), d + 500, 1), CUDA_SUCCESS);
  EXPECT_EQ(back, 0x11);
  // Pointer queries answer for both addresses.
  void* host_pointer = nullptr;
  ASSERT_EQ(cu().cuPointerGetAttribute(&host_pointer, CU_POINTER_ATTRIBUTE_HOST_POINTER, d + 7), CUDA_SUCCESS);
  EXPECT_EQ(host_pointer, host + 7);
  CUdeviceptr device_pointer = 0;
  ASSERT_EQ(cu().cuPointerGetAttribute(&device_pointer, CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
                                       reinterpret_cast<CUdeviceptr>(host + 7)), CUDA_SUCCESS);
  EXPECT_EQ(device_pointer, d + 7);
  EXPECT_EQ(cu().cuStreamDestroy(s), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemFreeHost(host), CUDA_SUCCESS);
  unsigned int flags = 0;
  EXPECT_EQ(cu().cuPointerGetAttribute(&flags, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d), CUDA_ERROR_INVALID_VALUE)
      << "the alias goes with the allocation";
}

TEST_F(sim_host_memory_test, pointer_attributes_of_host_memory) {
  void* p = host_alloc(5000, CU_MEMHOSTALLOC_PORTABLE);
  const auto inside = reinterpret_cast<CUdeviceptr>(p) + 99;
  unsigned int type = 0;
  ASSERT_EQ(cu().cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, inside), CUDA_SUCCESS);
  EXPECT_EQ(type, static_cast<unsigned int>(CU_MEMORYTYPE_HOST));
  CUcontext ctx = nullptr;
  ASSERT_EQ(cu().cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, inside), CUDA_SUCCESS);
  EXPECT_EQ(ctx, primary_context_of(0));
  CUdeviceptr start = 0;
  std::size_t size = 0;
  ASSERT_EQ(cu().cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, inside), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, inside), CUDA_SUCCESS);
  EXPECT_EQ(start, reinterpret_cast<CUdeviceptr>(p));
  EXPECT_EQ(size, 5000u);
  bool managed = true;
  ASSERT_EQ(cu().cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, inside), CUDA_SUCCESS);
  EXPECT_FALSE(managed);
  EXPECT_EQ(cu().cuMemFreeHost(p), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, inside), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(sim_host_memory_test, registration_errors) {
  std::vector<char> buffer(8 * page);
  char* p = buffer.data();
  EXPECT_EQ(cu().cuMemHostRegister(p, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemHostRegister(nullptr, 64, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemHostRegister(p, 64, 0x40), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemHostRegister(p, 64, CU_MEMHOSTREGISTER_IOMEMORY), CUDA_ERROR_NOT_SUPPORTED);

  ASSERT_EQ(cu().cuMemHostRegister(p + page, 2 * page, CU_MEMHOSTREGISTER_DEVICEMAP), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemHostRegister(p + page, 2 * page, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_EQ(cu().cuMemHostRegister(p, page + 1, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_EQ(cu().cuMemHostRegister(p + 2 * page, 4 * page, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  ASSERT_EQ(cu().cuMemHostRegister(p, page, 0), CUDA_SUCCESS);  // the neighbour, not overlapping

  EXPECT_EQ(cu().cuMemHostUnregister(p + page + 8), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  EXPECT_EQ(cu().cuMemHostUnregister(p + 5 * page), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  CUdeviceptr d = 0;
  ASSERT_EQ(cu().cuMemHostGetDevicePointer(&d, p + page + 8, 0), CUDA_SUCCESS);
  EXPECT_EQ(d, reinterpret_cast<CUdeviceptr>(p + page + 8));
  EXPECT_EQ(cu().cuMemHostGetDevicePointer(&d, p, 0), CUDA_ERROR_INVALID_VALUE) << "registered without DEVICEMAP";
  unsigned int flags = 0;
  EXPECT_EQ(cu().cuMemHostGetFlags(&flags, p), CUDA_ERROR_INVALID_VALUE) << "only cuMemHostAlloc memory has flags";

  EXPECT_EQ(cu().cuMemHostUnregister(p + page), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemHostUnregister(p + page), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  EXPECT_EQ(cu().cuMemHostRegister(p + page, 2 * page, 0), CUDA_SUCCESS);  // free again
  EXPECT_EQ(cu().cuMemHostUnregister(p + page), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemHostUnregister(p), CUDA_SUCCESS);

  // Pinned allocations are page-locked already: the driver answers INVALID_VALUE
  // there (not ALREADY_REGISTERED); device memory and unmapped memory cannot be registered.
  void* pinned = host_alloc(page, 0);
  EXPECT_EQ(cu().cuMemHostRegister(pinned, 64, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemFreeHost(pinned), CUDA_SUCCESS);
  CUdeviceptr device = 0;
  ASSERT_EQ(cu().cuMemAlloc(&device, page), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemHostRegister(reinterpret_cast<void*>(device), page, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemFree(device), CUDA_SUCCESS);
  void* gone = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(gone, MAP_FAILED);
  ASSERT_EQ(munmap(static_cast<char*>(gone) + page, page), 0);
  EXPECT_EQ(cu().cuMemHostRegister(gone, 2 * page, 0), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(munmap(gone, page), 0);

  const char* name = nullptr;
  ASSERT_EQ(cu().cuGetErrorName(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, &name), CUDA_SUCCESS);
  EXPECT_STREQ(name, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED");
  ASSERT_EQ(cu().cuGetErrorName(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, &name), CUDA_SUCCESS);
  EXPECT_STREQ(name, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED");
}

TEST_F(sim_host_memory_test, managed_memory_is_device_memory_the_host_can_touch) {
  const std::size_t used_before = sim::used_bytes(0);
  CUdeviceptr m = 0;
  EXPECT_EQ(cu().cuMemAllocManaged(&m, 0, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemAllocManaged(&m, 64, CU_MEM_ATTACH_SINGLE), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemAllocManaged(&m, 64, 0), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cu().cuMemAllocManaged(&m, 10000, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  EXPECT_EQ(sim::used_bytes(0), used_before + 3 * page) << "counted against the device's capacity";
  auto* host = reinterpret_cast<unsigned char*>(m);
  std::memset(host, 0x21, 10000);
  CUstream s = nullptr;
  ASSERT_EQ(cu().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemsetD8Async(m + 5000, 0x42, 10, s), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemsetD8Async(m + 9999, 0, 2, s), CUDA_ERROR_INVALID_VALUE) << "bounds-checked like device memory";
  ASSERT_EQ(cu().cuStreamSynchronize(s), CUDA_SUCCESS);
  EXPECT_EQ(host[4999], 0x21);
  EXPECT_EQ(host[5000], 0x42);
  bool managed = false;
  ASSERT_EQ(cu().cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, m + 1), CUDA_SUCCESS);
  EXPECT_TRUE(managed);
  void* host_pointer = nullptr;
  ASSERT_EQ(cu().cuPointerGetAttribute(&host_pointer, CU_POINTER_ATTRIBUTE_HOST_POINTER, m + 1), CUDA_SUCCESS);
  EXPECT_EQ(host_pointer, host + 1);
  ASSERT_EQ(cu().cuMemFree(m), CUDA_SUCCESS);
  EXPECT_EQ(sim::used_bytes(0), used_before);

  // Host-attached memory, freed in stream order.
  ASSERT_EQ(cu().cuMemAllocManaged(&m, 64, CU_MEM_ATTACH_HOST), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemFreeAsync(m, s), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamSynchronize(s), CUDA_SUCCESS);
  EXPECT_EQ(sim::used_bytes(0), used_before);
  const std::size_t remaining = (std::size_t{8} << 30) - sim::used_bytes(0);
  EXPECT_EQ(cu().cuMemAllocManaged(&m, remaining + 1, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_OUT_OF_MEMORY)
      << "no oversubscription in the simulator";
  EXPECT_EQ(cu().cuStreamDestroy(s), CUDA_SUCCESS);
}

}  // namespace
}  // namespace gpumem::sim_test
