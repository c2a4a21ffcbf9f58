// Simulator: fault injection for device allocations.
#include <algorithm>
#include <cmath>
#include <vector>

#include "sim_test_support.hpp"

namespace gpumem::sim_test {
namespace {

using sim_fault_injection_test = sim_test;

// Tries `count` small allocations; true where one failed. Frees what it got.
std::vector<bool> failure_pattern(int count) {
  std::vector<bool> failed;
  std::vector<CUdeviceptr> got;
  for (int i = 0; i < count; ++i) {
    CUdeviceptr p = 0;
    CUresult r = cu().cuMemAlloc(&p, 64);
    EXPECT_TRUE(r == CUDA_SUCCESS || r == CUDA_ERROR_OUT_OF_MEMORY) << r;
    failed.push_back(r != CUDA_SUCCESS);
    if (r == CUDA_SUCCESS) got.push_back(p);
  }
  for (CUdeviceptr p : got) EXPECT_EQ(cu().cuMemFree(p), CUDA_SUCCESS);
  return failed;
}

TEST_F(sim_fault_injection_test, nth_allocation_fails_exactly_once) {
  const std::uint64_t injected_before = sim::injected_failures();
  sim::fail_nth_allocation(3);
  const std::vector<bool> expected = {false, false, true, false, false};
  EXPECT_EQ(failure_pattern(5), expected);
  EXPECT_EQ(sim::injected_failures(), injected_before + 1);
}

TEST_F(sim_fault_injection_test, nth_counts_async_allocations_too) {
  sim::fail_nth_allocation(2);
  CUdeviceptr a = 0, b = 0;
  ASSERT_EQ(cu().cuMemAlloc(&a, 64), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemAllocAsync(&b, 64, nullptr), CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_EQ(cu().cuMemAllocAsync(&b, 64, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemFreeAsync(b, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemFree(a), CUDA_SUCCESS);
}

TEST_F(sim_fault_injection_test, invalid_requests_are_not_counted) {
  sim::fail_nth_allocation(1);
  CUdeviceptr p = 0;
  EXPECT_EQ(cu().cuMemAlloc(&p, 0), CUDA_ERROR_INVALID_VALUE);  // not an allocation attempt
  EXPECT_EQ(cu().cuMemAlloc(&p, 64), CUDA_ERROR_OUT_OF_MEMORY);
}

TEST_F(sim_fault_injection_test, zero_turns_it_off) {
  sim::fail_nth_allocation(1);
  sim::fail_nth_allocation(0);
  EXPECT_EQ(failure_pattern(3), std::vector<bool>(3, false));
}

TEST_F(sim_fault_injection_test, random_failures_repeat_with_the_same_seed) {
  const std::uint64_t injected_before = sim::injected_failures();
  sim::fail_allocations_at_random(0.5, 42);
  const std::vector<bool> first = failure_pattern(64);
  sim::fail_allocations_at_random(0.5, 42);
  const std::vector<bool> second = failure_pattern(64);
  EXPECT_EQ(first, second);

  const auto failures = static_cast<std::uint64_t>(std::count(first.begin(), first.end(), true));
  EXPECT_GT(failures, 10u);  // about half of 64
  EXPECT_LT(failures, 54u);
  EXPECT_EQ(sim::injected_failures(), injected_before + 2 * failures);

  sim::fail_allocations_at_random(0.5, 43);
  EXPECT_NE(failure_pattern(64), first);  // another seed, another set
}

TEST_F(sim_fault_injection_test, probability_one_fails_everything_zero_nothing) {
  sim::fail_allocations_at_random(1.0, 7);
  EXPECT_EQ(failure_pattern(4), std::vector<bool>(4, true));
  sim::fail_allocations_at_random(0.0, 7);
  EXPECT_EQ(failure_pattern(4), std::vector<bool>(4, false));
}

TEST_F(sim_fault_injection_test, bad_probability_is_a_logic_error) {
  EXPECT_THROW(sim::fail_allocations_at_random(1.5, 1), logic_error);
  EXPECT_THROW(sim::fail_allocations_at_random(-0.1, 1), logic_error);
  EXPECT_THROW(sim::fail_allocations_at_random(std::nan(""), 1), logic_error);
}

}  // namespace
}  // namespace gpumem::sim_test
