// cuda_resource beyond the shared contract: its bookkeeping, over-aligned
// requests, real exhaustion of the device, and fault injection on the simulator.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "gpumem/backend.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/sim.hpp"
#include "support/touch.hpp"

namespace gpumem::test {
namespace {

TEST(CudaResource, CountsWhatIsLive) {
  cuda_resource mr(0);
  stream s(0);
  void* a = mr.allocate(1000, s);
  void* b = mr.allocate(3000, s, 4096);
  EXPECT_EQ(mr.allocated_bytes(), 4000U);
  EXPECT_EQ(mr.allocation_count(), 2U);
  mr.deallocate(a, 1000, s);
  EXPECT_EQ(mr.allocated_bytes(), 3000U);
  mr.deallocate(b, 3000, s, 4096);
  EXPECT_EQ(mr.allocated_bytes(), 0U);
  EXPECT_EQ(mr.allocation_count(), 0U);
}

TEST(CudaResource, DefaultsToTheCurrentDevice) {
  const int last = device_count() - 1;
  const int before = current_device();
  set_current_device(last);
  cuda_resource mr;
  EXPECT_EQ(mr.device(), last);
  set_current_device(before);
  EXPECT_THROW(cuda_resource{device_count()}, logic_error);
}

TEST(CudaResource, AllocatesOnItsDeviceWhateverIsCurrent) {
  if (device_count() < 2) GTEST_SKIP() << "needs two devices";
  const int before = current_device();
  set_current_device(0);
  cuda_resource mr(1);
  stream s1(1);
  const std::size_t free_before = device_memory_info(1).free_bytes;
  void* p = mr.allocate(64 << 20, s1);
  EXPECT_LT(device_memory_info(1).free_bytes, free_before);
  EXPECT_EQ(current_device(), 0) << "the resource must restore the caller's device";
  mr.deallocate(p, 64 << 20, s1);
  set_current_device(before);
}

TEST(CudaResource, ExhaustingTheDeviceIsOutOfMemoryAndRecoverable) {
  cuda_resource mr(0);
  stream s(0);
  const memory_info info = device_memory_info(0);
  const std::size_t chunk = std::max<std::size_t>(info.total_bytes / 64, 64 << 20);
  std::vector<void*> held;
  bool hit_oom = false;
  while (held.size() < 4096) {
    try {
      held.push_back(mr.allocate(chunk, s));
    } catch (const out_of_memory& e) {
      hit_oom = true;
      EXPECT_EQ(e.info().requested_bytes, chunk);
      EXPECT_EQ(e.info().device, 0);
      EXPECT_EQ(e.info().resource_held_bytes, held.size() * chunk);
      EXPECT_LT(e.info().device_free_bytes, chunk + (64u << 20)) << e.what();
      break;
    }
  }
  EXPECT_TRUE(hit_oom);
  EXPECT_GT(held.size(), 0U);
  for (void* p : held) mr.deallocate(p, chunk, s);
  void* again = mr.allocate(chunk, s);  // memory came back
  device_fill(again, chunk, 0x01, s);
  EXPECT_EQ(device_count_mismatches(again, chunk, 0x01, s), 0U);
  mr.deallocate(again, chunk, s);
}

TEST(CudaResource, InjectedFailureIsOutOfMemoryAndRecoverable) {
  if (current_backend() != backend_kind::sim) GTEST_SKIP() << "fault injection is the simulator's";
  cuda_resource mr(0);
  stream s(0);
  void* before = mr.allocate(256, s);
  sim::fail_nth_allocation(2);
  void* first = mr.allocate(256, s);  // the 1st from now succeeds
  EXPECT_THROW(mr.allocate(256, s), out_of_memory);
  EXPECT_EQ(mr.allocation_count(), 2U);
  void* after = mr.allocate(256, s);
  for (void* p : {before, first, after}) mr.deallocate(p, 256, s);
  EXPECT_EQ(mr.allocation_count(), 0U);
  sim::fail_nth_allocation(0);
}

TEST(CudaResource, SimControlsRefuseTheRealBackend) {
  if (current_backend() != backend_kind::cuda) GTEST_SKIP() << "checks the cuda backend";
  EXPECT_THROW(sim::fail_nth_allocation(1), logic_error);
}

}  // namespace
}  // namespace gpumem::test
