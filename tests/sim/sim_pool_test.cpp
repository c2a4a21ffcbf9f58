// Simulator: stream-ordered allocation from the default pool and pool attributes.
#include <atomic>
#include <cstring>

#include "sim_test_support.hpp"

namespace gpumem::sim_test {
namespace {

class sim_pool_test : public sim_test {
 protected:
  void SetUp() override {
    sim_test::SetUp();
    ASSERT_EQ(cu().cuStreamCreate(&s_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    ASSERT_EQ(cu().cuDeviceGetDefaultMemPool(&pool_, 0), CUDA_SUCCESS);
  }
  void TearDown() override {
    EXPECT_EQ(cu().cuStreamDestroy(s_), CUDA_SUCCESS);
    sim_test::TearDown();
  }
  cuuint64_t pool_value(CUmemPool_attribute attribute) {
    cuuint64_t value = ~cuuint64_t{0};
    EXPECT_EQ(cu().cuMemPoolGetAttribute(pool_, attribute, &value), CUDA_SUCCESS);
    return value;
  }

  CUstream s_ = nullptr;
  CUmemoryPool pool_ = nullptr;
};

TEST_F(sim_pool_test, memory_returns_only_when_the_stream_reaches_the_free) {
  const std::size_t used_before = sim::used_bytes(0);
  CUdeviceptr p = 0;
  ASSERT_EQ(cu().cuMemAllocAsync(&p, 5000, s_), CUDA_SUCCESS);
  EXPECT_EQ(p % page, 0u);
  EXPECT_EQ(sim::used_bytes(0), used_before + 2 * page);

  gate& g = new_gate();
  ASSERT_EQ(launch(s_, [&] { g.wait(); std::memset(reinterpret_cast<void*>(p), 1, 5000); }), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemFreeAsync(p, s_), CUDA_SUCCESS);
  std::this_thread::sleep_for(settle_time);
  EXPECT_EQ(sim::used_bytes(0), used_before + 2 * page);  // the stream has not reached the free
  CUdeviceptr base = 0;
  EXPECT_EQ(cu().cuMemGetAddressRange(&base, nullptr, p), CUDA_SUCCESS);
  g.open();
  ASSERT_EQ(cu().cuStreamSynchronize(s_), CUDA_SUCCESS);
  EXPECT_EQ(sim::used_bytes(0), used_before);
  EXPECT_EQ(cu().cuMemGetAddressRange(&base, nullptr, p), CUDA_ERROR_NOT_FOUND);
}

TEST_F(sim_pool_test, a_queued_free_refuses_later_use_and_second_frees) {
  CUdeviceptr p = 0;
  ASSERT_EQ(cu().cuMemAllocAsync(&p, 64, s_), CUDA_SUCCESS);
  gate& g = new_gate();
  ASSERT_EQ(launch(s_, [&] { g.wait(); }), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemFreeAsync(p, s_), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemFreeAsync(p, s_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemsetD8Async(p, 0, 64, s_), CUDA_ERROR_INVALID_VALUE);
  g.open();
  ASSERT_EQ(cu().cuStreamSynchronize(s_), CUDA_SUCCESS);
}

TEST_F(sim_pool_test, async_allocation_errors) {
  CUdeviceptr p = 0;
  EXPECT_EQ(cu().cuMemAllocAsync(&p, 0, s_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemAllocAsync(nullptr, 64, s_), CUDA_ERROR_INVALID_VALUE);
  const std::size_t remaining = (std::size_t{8} << 30) - sim::used_bytes(0);
  EXPECT_EQ(cu().cuMemAllocAsync(&p, remaining + 1, s_), CUDA_ERROR_OUT_OF_MEMORY);
  int host = 0;
  EXPECT_EQ(cu().cuMemFreeAsync(reinterpret_cast<CUdeviceptr>(&host), s_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemFreeAsync(0, s_), CUDA_ERROR_INVALID_VALUE);
  int not_a_stream = 0;
  EXPECT_EQ(cu().cuMemAllocAsync(&p, 64, reinterpret_cast<CUstream>(&not_a_stream)), CUDA_ERROR_INVALID_HANDLE);

  ASSERT_EQ(cu().cuMemAllocAsync(&p, 2 * page, s_), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemFreeAsync(p + page, s_), CUDA_ERROR_INVALID_VALUE);  // inside, not the start
  EXPECT_EQ(cu().cuMemFreeAsync(p, s_), CUDA_SUCCESS);
}

TEST_F(sim_pool_test, stream_of_another_device_is_refused) {
  CUstream on_device1 = nullptr;
  {
    current_device d1(1);
    ASSERT_EQ(cu().cuStreamCreate(&on_device1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  }
  CUdeviceptr p = 0;
  EXPECT_EQ(cu().cuMemAllocAsync(&p, 64, on_device1), CUDA_ERROR_INVALID_VALUE);
  {
    current_device d1(1);
    ASSERT_EQ(cu().cuMemAllocAsync(&p, 64, on_device1), CUDA_SUCCESS);
    int ordinal = -1;
    ASSERT_EQ(cu().cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p), CUDA_SUCCESS);
    EXPECT_EQ(ordinal, 1);
    ASSERT_EQ(cu().cuMemFreeAsync(p, on_device1), CUDA_SUCCESS);
    ASSERT_EQ(cu().cuStreamSynchronize(on_device1), CUDA_SUCCESS);
  }
  EXPECT_EQ(cu().cuStreamDestroy(on_device1), CUDA_SUCCESS);
}

TEST_F(sim_pool_test, usage_attributes_follow_live_async_bytes) {
  const cuuint64_t before = pool_value(CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
  EXPECT_EQ(pool_value(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), before);
  CUdeviceptr a = 0, b = 0, sync = 0;
  ASSERT_EQ(cu().cuMemAllocAsync(&a, 3 * page, s_), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemAllocAsync(&b, 1, s_), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemAlloc(&sync, page), CUDA_SUCCESS);  // not from the pool
  EXPECT_EQ(pool_value(CU_MEMPOOL_ATTR_USED_MEM_CURRENT), before + 4 * page);
  EXPECT_EQ(pool_value(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), before + 4 * page);
  EXPECT_GE(pool_value(CU_MEMPOOL_ATTR_USED_MEM_HIGH), before + 4 * page);
  CUmemoryPool from_pointer = nullptr;
  ASSERT_EQ(cu().cuPointerGetAttribute(&from_pointer, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, a), CUDA_SUCCESS);
  EXPECT_EQ(from_pointer, pool_);

  ASSERT_EQ(cu().cuMemFreeAsync(a, s_), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamSynchronize(s_), CUDA_SUCCESS);
  EXPECT_EQ(pool_value(CU_MEMPOOL_ATTR_USED_MEM_CURRENT), before + page);
  EXPECT_GE(pool_value(CU_MEMPOOL_ATTR_USED_MEM_HIGH), before + 4 * page);

  // High watermarks reset to the current value by setting 0, and only 0.
  cuuint64_t zero = 0, nonzero = 5;
  EXPECT_EQ(cu().cuMemPoolSetAttribute(pool_, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &nonzero), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cu().cuMemPoolSetAttribute(pool_, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemPoolSetAttribute(pool_, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero), CUDA_SUCCESS);
  EXPECT_EQ(pool_value(CU_MEMPOOL_ATTR_USED_MEM_HIGH), before + page);
  EXPECT_EQ(pool_value(CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), before + page);
  EXPECT_EQ(cu().cuMemPoolSetAttribute(pool_, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &zero), CUDA_ERROR_INVALID_VALUE);

  ASSERT_EQ(cu().cuMemFreeAsync(b, s_), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamSynchronize(s_), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemFree(sync), CUDA_SUCCESS);
  EXPECT_EQ(pool_value(CU_MEMPOOL_ATTR_USED_MEM_CURRENT), before);
}

TEST_F(sim_pool_test, settable_attributes_round_trip) {
  cuuint64_t threshold = std::uint64_t{1} << 40;
  ASSERT_EQ(cu().cuMemPoolSetAttribute(pool_, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold), CUDA_SUCCESS);
  EXPECT_EQ(pool_value(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), threshold);
  threshold = 0;
  ASSERT_EQ(cu().cuMemPoolSetAttribute(pool_, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold), CUDA_SUCCESS);

  for (CUmemPool_attribute flag : {CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
                                   CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
                                   CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES}) {
    int value = -1;
    ASSERT_EQ(cu().cuMemPoolGetAttribute(pool_, flag, &value), CUDA_SUCCESS);
    EXPECT_EQ(value, 1);  // enabled by default
    int off = 0;
    ASSERT_EQ(cu().cuMemPoolSetAttribute(pool_, flag, &off), CUDA_SUCCESS);
    ASSERT_EQ(cu().cuMemPoolGetAttribute(pool_, flag, &value), CUDA_SUCCESS);
    EXPECT_EQ(value, 0);
    int on = 1;
    ASSERT_EQ(cu().cuMemPoolSetAttribute(pool_, flag, &on), CUDA_SUCCESS);
  }
}

TEST_F(sim_pool_test, pools_are_per_device_and_handles_are_checked) {
  CUmemoryPool pool1 = nullptr;
  ASSERT_EQ(cu().cuDeviceGetDefaultMemPool(&pool1, 1), CUDA_SUCCESS);
  EXPECT_NE(pool1, pool_);
  CUmemoryPool again = nullptr;
  ASSERT_EQ(cu().cuDeviceGetDefaultMemPool(&again, 0), CUDA_SUCCESS);
  EXPECT_EQ(again, pool_);
  EXPECT_EQ(cu().cuDeviceGetDefaultMemPool(&again, 2), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(cu().cuDeviceGetDefaultMemPool(nullptr, 0), CUDA_ERROR_INVALID_VALUE);

  int not_a_pool = 0;
  auto bogus = reinterpret_cast<CUmemoryPool>(&not_a_pool);
  cuuint64_t value = 0;
  EXPECT_EQ(cu().cuMemPoolGetAttribute(bogus, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &value), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemPoolSetAttribute(bogus, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &value), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemPoolTrimTo(bogus, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemPoolTrimTo(pool_, 0), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemPoolGetAttribute(pool_, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, nullptr), CUDA_ERROR_INVALID_VALUE);
}

}  // namespace
}  // namespace gpumem::sim_test
