// managed_resource beyond the shared contract: the host and the device see the
// same bytes, both attach modes, the driver knows the memory as managed, and
// (on the simulator) it counts against the device's memory.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "driver/driver.hpp"
#include "gpumem/backend.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/managed_resource.hpp"
#include "gpumem/sim.hpp"
#include "support/touch.hpp"

namespace gpumem::test {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

bool is_managed(const void* p) {
  bool managed = false;
  GPUMEM_CU(cuPointerGetAttribute, &managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, reinterpret_cast<CUdeviceptr>(p));
  return managed;
}

class ManagedResource : public ::testing::TestWithParam<managed_attach> {};

TEST_P(ManagedResource, HostAndDeviceSeeTheSameBytes) {
  managed_resource mr(0, GetParam());
  stream s(0);
  auto* p = static_cast<unsigned char*>(mr.allocate(MiB, s));
  EXPECT_TRUE(is_managed(p));
  s.synchronize();  // the allocation is ordered on s; the host waits before touching it
  std::memset(p, 0x12, MiB);
  EXPECT_EQ(device_count_mismatches(p, MiB, 0x12, s), 0U) << "the device reads what the host wrote";
  device_fill(p + 4096, 1000, 0x34, s);
  s.synchronize();
  EXPECT_EQ(p[4095], 0x12);
  EXPECT_EQ(p[4096], 0x34);
  EXPECT_EQ(p[5095], 0x34);
  EXPECT_EQ(p[5096], 0x12);
  mr.deallocate(p, MiB, s);
}

TEST_P(ManagedResource, PropertiesAndBookkeeping) {
  managed_resource mr(0, GetParam());
  EXPECT_EQ(mr.attach(), GetParam());
  const resource_properties props = mr.properties();
  EXPECT_EQ(props.device, 0);
  EXPECT_TRUE(props.host_accessible);
  EXPECT_TRUE(props.thread_safe);
  int concurrent = 0;
  GPUMEM_CU(cuDeviceGetAttribute, &concurrent, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 0);
  EXPECT_EQ(props.device_accessible, GetParam() == managed_attach::global || concurrent != 0);
  stream s(0);
  void* a = mr.allocate(100, s);
  void* b = mr.allocate(5000, s, 4096);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b) % 4096, 0U);
  EXPECT_EQ(mr.allocated_bytes(), 5100U);
  EXPECT_EQ(mr.allocation_count(), 2U);
  mr.deallocate(a, 100, s);
  mr.deallocate(b, 5000, s, 4096);
  EXPECT_EQ(mr.allocation_count(), 0U);
}

INSTANTIATE_TEST_SUITE_P(Attach, ManagedResource, ::testing::Values(managed_attach::global, managed_attach::host),
                         [](const auto& p) { return p.param == managed_attach::global ? "global" : "host"; });

TEST(ManagedResourceSim, CountsAgainstTheDevicesMemory) {
  if (current_backend() != backend_kind::sim) GTEST_SKIP() << "a GPU populates managed memory on first touch";
  managed_resource mr(0);
  stream s(0);
  const std::size_t used = sim::used_bytes(0);
  void* p = mr.allocate(64 * MiB, s);
  EXPECT_EQ(sim::used_bytes(0), used + 64 * MiB);
  mr.deallocate(p, 64 * MiB, s);
  EXPECT_EQ(sim::used_bytes(0), used);
}

TEST(ManagedResourceErrors, BadDevicesAndForeignPointers) {
  EXPECT_THROW(managed_resource{device_count()}, logic_error);
  managed_resource mr(0);
  stream s(0);
  void* p = mr.allocate(256, s);
  EXPECT_THROW(mr.deallocate(static_cast<char*>(p) + 1, 255, s), logic_error);
  EXPECT_THROW(mr.deallocate(p, 255, s), logic_error);
  mr.deallocate(p, 256, s);
  EXPECT_THROW(mr.deallocate(p, 256, s), logic_error);
}

}  // namespace
}  // namespace gpumem::test
