// Simulator: initialization, devices, attributes, error names and contexts.
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>

#include "sim_test_support.hpp"

namespace gpumem::sim_test {
namespace {

using sim_device_test = sim_test;

TEST_F(sim_device_test, init_rejects_flags_and_is_idempotent) {
  EXPECT_EQ(cu().cuInit(1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuInit(0), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuInit(0), CUDA_SUCCESS);
}

TEST_F(sim_device_test, driver_version_is_the_headers) {
  int version = 0;
  EXPECT_EQ(cu().cuDriverGetVersion(&version), CUDA_SUCCESS);
  EXPECT_EQ(version, CUDA_VERSION);
  EXPECT_EQ(cu().cuDriverGetVersion(nullptr), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(sim_device_test, two_devices_by_default) {
  int count = 0;
  ASSERT_EQ(cu().cuDeviceGetCount(&count), CUDA_SUCCESS);
  EXPECT_EQ(count, 2);
  CUdevice dev = -1;
  EXPECT_EQ(cu().cuDeviceGet(&dev, 1), CUDA_SUCCESS);
  EXPECT_EQ(dev, 1);
  EXPECT_EQ(cu().cuDeviceGet(&dev, 2), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(cu().cuDeviceGet(&dev, -1), CUDA_ERROR_INVALID_DEVICE);
}

TEST_F(sim_device_test, context_peer_access_is_enabled_once_and_disabled_once) {
  const CUcontext zero = primary_context_of(0), one = primary_context_of(1);
  CUcontext previous = nullptr;
  ASSERT_EQ(cu().cuCtxGetCurrent(&previous), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuCtxEnablePeerAccess(one, 0), CUDA_ERROR_INVALID_CONTEXT);  // no current context
  ASSERT_EQ(cu().cuCtxSetCurrent(previous), CUDA_SUCCESS);
  current_device on(0);
  EXPECT_EQ(cu().cuCtxDisablePeerAccess(one), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
  EXPECT_EQ(cu().cuCtxEnablePeerAccess(one, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuCtxEnablePeerAccess(zero, 0), CUDA_ERROR_INVALID_DEVICE);  // itself
  EXPECT_EQ(cu().cuCtxEnablePeerAccess(reinterpret_cast<CUcontext>(std::uintptr_t{0x1234}), 0),
            CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(cu().cuCtxEnablePeerAccess(one, 0), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuCtxEnablePeerAccess(one, 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
  {
    current_device other(1);  // per direction: 1 towards 0 is not enabled
    EXPECT_EQ(cu().cuCtxDisablePeerAccess(zero), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
  }
  EXPECT_EQ(cu().cuCtxDisablePeerAccess(one), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuCtxDisablePeerAccess(one), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
  sim::set_peer_access(false);
  EXPECT_EQ(cu().cuCtxEnablePeerAccess(one, 0), CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
  sim::set_peer_access(true);
}

TEST_F(sim_device_test, name_and_total_memory) {
  char name[64] = {};
  ASSERT_EQ(cu().cuDeviceGetName(name, sizeof name, 1), CUDA_SUCCESS);
  EXPECT_STREQ(name, "gpumem simulated device 1");
  char tiny[8] = {};
  ASSERT_EQ(cu().cuDeviceGetName(tiny, sizeof tiny, 0), CUDA_SUCCESS);
  EXPECT_STREQ(tiny, "gpumem ");  // truncated, terminated
  EXPECT_EQ(cu().cuDeviceGetName(name, sizeof name, 7), CUDA_ERROR_INVALID_DEVICE);

  std::size_t total = 0;
  ASSERT_EQ(cu().cuDeviceTotalMem(&total, 0), CUDA_SUCCESS);
  EXPECT_EQ(total, std::size_t{8} << 30);
  EXPECT_EQ(cu().cuDeviceTotalMem(&total, 2), CUDA_ERROR_INVALID_DEVICE);
}

TEST_F(sim_device_test, attribute_table) {
  auto attribute = [](CUdevice_attribute a, CUdevice dev) {
    int value = -12345;
    EXPECT_EQ(cu().cuDeviceGetAttribute(&value, a, dev), CUDA_SUCCESS) << "attribute " << a;
    return value;
  };
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0), 9);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0), 0);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0), 132);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0), 1);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 0), 1);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 0), 1024);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_WARP_SIZE, 0), 32);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0), 0);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 1), 1);
  // Modelled: managed, mapped and registered host memory, IPC-capable pools.
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 0), 1);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 0), 1);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 0), 1);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, 0), 1);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, 0), 1);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, 0), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  // Virtual memory management, with POSIX-file-descriptor handles (sim_vmm_test.cpp).
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0), 1);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0), 1);

  int value = 0;
  EXPECT_EQ(cu().cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH, 0),
            CUDA_ERROR_INVALID_VALUE);  // not in the table
  EXPECT_EQ(cu().cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 5), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(cu().cuDeviceGetAttribute(nullptr, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 0), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(sim_device_test, error_names_and_strings) {
  const CUresult codes[] = {CUDA_SUCCESS,
                            CUDA_ERROR_INVALID_VALUE,
                            CUDA_ERROR_OUT_OF_MEMORY,
                            CUDA_ERROR_NOT_INITIALIZED,
                            CUDA_ERROR_INVALID_CONTEXT,
                            CUDA_ERROR_INVALID_DEVICE,
                            CUDA_ERROR_INVALID_HANDLE,
                            CUDA_ERROR_NOT_READY,
                            CUDA_ERROR_NOT_FOUND,
                            CUDA_ERROR_NOT_SUPPORTED,
                            CUDA_ERROR_NOT_PERMITTED,
                            CUDA_ERROR_NO_DEVICE,
                            CUDA_ERROR_SHARED_OBJECT_INIT_FAILED,
                            CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER,
                            CUDA_ERROR_ILLEGAL_ADDRESS,
                            CUDA_ERROR_UNKNOWN};
  for (CUresult code : codes) {
    const char* name = nullptr;
    const char* text = nullptr;
    EXPECT_EQ(cu().cuGetErrorName(code, &name), CUDA_SUCCESS) << code;
    EXPECT_EQ(cu().cuGetErrorString(code, &text), CUDA_SUCCESS) << code;
    ASSERT_NE(name, nullptr);
    ASSERT_NE(text, nullptr);
    EXPECT_EQ(std::string(name).rfind("CUDA_", 0), 0u) << name;
    EXPECT_GT(std::strlen(text), 0u);
  }
  const char* name = nullptr;
  ASSERT_EQ(cu().cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &name), CUDA_SUCCESS);
  EXPECT_STREQ(name, "CUDA_ERROR_OUT_OF_MEMORY");
  const char* text = nullptr;
  ASSERT_EQ(cu().cuGetErrorString(CUDA_ERROR_INVALID_VALUE, &text), CUDA_SUCCESS);
  EXPECT_STREQ(text, "invalid argument");

  // An unknown code: INVALID_VALUE and a null string, like the driver.
  const char* unknown = "untouched";
  EXPECT_EQ(cu().cuGetErrorName(static_cast<CUresult>(1000), &unknown), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(unknown, nullptr);
  unknown = "untouched";
  EXPECT_EQ(cu().cuGetErrorString(static_cast<CUresult>(1000), &unknown), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(unknown, nullptr);
}

TEST_F(sim_device_test, primary_context_is_one_per_device) {
  CUcontext a = primary_context_of(0);
  CUcontext b = primary_context_of(0);
  CUcontext c = primary_context_of(1);
  EXPECT_NE(a, nullptr);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  CUcontext ctx = nullptr;
  EXPECT_EQ(cu().cuDevicePrimaryCtxRetain(&ctx, 9), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(cu().cuDevicePrimaryCtxRetain(nullptr, 0), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(sim_device_test, current_context_is_per_thread) {
  CUcontext mine = nullptr;
  ASSERT_EQ(cu().cuCtxGetCurrent(&mine), CUDA_SUCCESS);
  EXPECT_EQ(mine, primary_context_of(0));
  CUdevice dev = -1;
  EXPECT_EQ(cu().cuCtxGetDevice(&dev), CUDA_SUCCESS);
  EXPECT_EQ(dev, 0);

  std::thread([&] {
    CUcontext theirs = primary_context_of(0);
    EXPECT_EQ(cu().cuCtxGetCurrent(&theirs), CUDA_SUCCESS);
    EXPECT_EQ(theirs, nullptr);  // a new thread has no current context
    CUdevice d = -1;
    EXPECT_EQ(cu().cuCtxGetDevice(&d), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(cu().cuCtxSetCurrent(primary_context_of(1)), CUDA_SUCCESS);
    EXPECT_EQ(cu().cuCtxGetDevice(&d), CUDA_SUCCESS);
    EXPECT_EQ(d, 1);
  }).join();

  ASSERT_EQ(cu().cuCtxGetDevice(&dev), CUDA_SUCCESS);
  EXPECT_EQ(dev, 0);  // untouched by the other thread
}

TEST_F(sim_device_test, set_current_rejects_unknown_contexts_and_accepts_null) {
  int not_a_context = 0;
  EXPECT_EQ(cu().cuCtxSetCurrent(reinterpret_cast<CUcontext>(&not_a_context)), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(cu().cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
  CUcontext ctx = primary_context_of(1);
  EXPECT_EQ(cu().cuCtxGetCurrent(&ctx), CUDA_SUCCESS);
  EXPECT_EQ(ctx, nullptr);
  EXPECT_EQ(cu().cuCtxGetCurrent(nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuCtxSetCurrent(primary_context_of(0)), CUDA_SUCCESS);
}

TEST_F(sim_device_test, calls_needing_a_context_fail_without_one) {
  std::thread([] {
    CUdeviceptr p = 0;
    std::size_t free = 0, total = 0;
    CUstream s = nullptr;
    CUevent e = nullptr;
    CUdevice d = -1;
    EXPECT_EQ(cu().cuMemAlloc(&p, 4096), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(cu().cuMemGetInfo(&free, &total), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(cu().cuStreamCreate(&s, CU_STREAM_DEFAULT), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(cu().cuEventCreate(&e, CU_EVENT_DEFAULT), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(cu().cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(cu().cuStreamSynchronize(nullptr), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(cu().cuStreamGetDevice(CU_STREAM_LEGACY, &d), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(cu().cuMemcpy(0, 0, 0), CUDA_ERROR_INVALID_CONTEXT);
  }).join();
}

}  // namespace
}  // namespace gpumem::sim_test
