// Simulator: memcpy/memset contents, stream order, and bounds checking.
#include <array>
#include <cstring>
#include <numeric>
#include <vector>

#include "sim_test_support.hpp"

namespace gpumem::sim_test {
namespace {

class sim_copy_test : public sim_test {
 protected:
  void SetUp() override {
    sim_test::SetUp();
    ASSERT_EQ(cu().cuMemAlloc(&a_, size), CUDA_SUCCESS);
    ASSERT_EQ(cu().cuMemAlloc(&b_, size), CUDA_SUCCESS);
    ASSERT_EQ(cu().cuStreamCreate(&s_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  }
  void TearDown() override {
    EXPECT_EQ(cu().cuStreamDestroy(s_), CUDA_SUCCESS);
    EXPECT_EQ(cu().cuMemFree(a_), CUDA_SUCCESS);
    EXPECT_EQ(cu().cuMemFree(b_), CUDA_SUCCESS);
    sim_test::TearDown();
  }
  static CUdeviceptr address(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

  static constexpr std::size_t size = 10000;  // not a page multiple: bounds are the requested size
  CUdeviceptr a_ = 0;
  CUdeviceptr b_ = 0;
  CUstream s_ = nullptr;
};

TEST_F(sim_copy_test, memcpy_host_to_device_to_device_to_host) {
  std::vector<unsigned char> in(size), out(size, 0);
  std::iota(in.begin(), in.end(), 0);
  ASSERT_EQ(cu().cuMemcpy(a_, address(in.data()), size), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemcpy(b_, a_, size), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemcpy(address(out.data()), b_, size), CUDA_SUCCESS);
  EXPECT_EQ(in, out);
}

TEST_F(sim_copy_test, async_copies_and_fills_run_in_stream_order) {
  std::vector<unsigned char> out(size, 0);
  ASSERT_EQ(cu().cuMemsetD8Async(a_, 0x5a, size, s_), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemsetD8Async(a_ + 100, 0x11, 50, s_), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemcpyAsync(b_, a_, size, s_), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemcpyAsync(address(out.data()), b_, size, s_), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamSynchronize(s_), CUDA_SUCCESS);
  for (std::size_t i = 0; i < size; ++i) {
    ASSERT_EQ(out[i], (i >= 100 && i < 150) ? 0x11 : 0x5a) << "byte " << i;
  }
}

TEST_F(sim_copy_test, async_copy_happens_when_the_stream_gets_there) {
  gate& g = new_gate();
  std::array<unsigned char, 16> out{};
  ASSERT_EQ(cu().cuMemsetD8(a_, 7, 16), CUDA_SUCCESS);
  ASSERT_EQ(launch(s_, [&] { g.wait(); }), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemcpyAsync(address(out.data()), a_, 16, s_), CUDA_SUCCESS);
  std::this_thread::sleep_for(settle_time);
  EXPECT_EQ(out[0], 0);
  g.open();
  ASSERT_EQ(cu().cuStreamSynchronize(s_), CUDA_SUCCESS);
  EXPECT_EQ(out[0], 7);
  EXPECT_EQ(out[15], 7);
}

TEST_F(sim_copy_test, memset_sync_sets_bytes) {
  ASSERT_EQ(cu().cuMemsetD8(a_, 0xee, size), CUDA_SUCCESS);
  const auto* bytes = reinterpret_cast<const unsigned char*>(a_);
  EXPECT_EQ(bytes[0], 0xee);
  EXPECT_EQ(bytes[size - 1], 0xee);
}

TEST_F(sim_copy_test, overruns_are_invalid_values) {
  std::vector<unsigned char> host(2 * size);
  // One byte past the requested size, though still inside the allocation's last page.
  EXPECT_EQ(cu().cuMemsetD8(a_, 0, size + 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemsetD8Async(a_ + size - 10, 0, 11, s_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemcpy(address(host.data()), a_, size + 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemcpyAsync(a_ + 1, address(host.data()), size, s_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemcpyAsync(b_, a_, 2 * size, s_), CUDA_ERROR_INVALID_VALUE);
  // Past the requested size, in the allocation's last page: not part of the allocation.
  EXPECT_EQ(cu().cuMemsetD8(a_ + size, 0, 1), CUDA_ERROR_INVALID_VALUE);
  // Exactly the allocation is fine.
  EXPECT_EQ(cu().cuMemsetD8(a_ + size - 1, 0, 1), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemcpy(a_, address(host.data()), size), CUDA_SUCCESS);
}

TEST_F(sim_copy_test, freed_memory_is_rejected) {
  CUdeviceptr c = 0;
  ASSERT_EQ(cu().cuMemAlloc(&c, page), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemFree(c), CUDA_SUCCESS);
  std::array<unsigned char, 8> host{};
  EXPECT_EQ(cu().cuMemsetD8(c, 0, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemcpy(address(host.data()), c, host.size()), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemcpyAsync(c, address(host.data()), host.size(), s_), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(sim_copy_test, null_pointers_and_empty_copies) {
  std::array<unsigned char, 8> host{};
  EXPECT_EQ(cu().cuMemcpy(0, a_, 8), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemcpy(a_, 0, 8), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemsetD8(0, 0, 8), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemcpy(a_, address(host.data()), 0), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemsetD8Async(a_, 0, 0, s_), CUDA_SUCCESS);
  int not_a_stream = 0;
  EXPECT_EQ(cu().cuMemcpyAsync(a_, b_, 8, reinterpret_cast<CUstream>(&not_a_stream)), CUDA_ERROR_INVALID_HANDLE);
}

TEST_F(sim_copy_test, host_to_host_copies_are_allowed) {
  const char in[] = "unified addressing";
  char out[sizeof in] = {};
  ASSERT_EQ(cu().cuMemcpy(address(out), address(in), sizeof in), CUDA_SUCCESS);
  EXPECT_STREQ(out, in);
}

}  // namespace
}  // namespace gpumem::sim_test
