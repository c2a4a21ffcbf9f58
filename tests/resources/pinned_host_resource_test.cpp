// pinned_host_resource beyond the shared contract: the flags reach the driver,
// mapped memory is reachable from device work through its device pointer
// (write-combined memory through its own), portable memory from another
// device's work, and host-side limits and errors.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "driver/driver.hpp"
#include "gpumem/backend.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/pinned_host_resource.hpp"
#include "support/touch.hpp"

namespace gpumem::test {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

unsigned int driver_flags_of(const void* p) {
  detail::device_context_guard guard(0);
  unsigned int flags = 0;
  GPUMEM_CU(cuMemHostGetFlags, &flags, const_cast<void*>(p));
  return flags;
}

std::string name_of(const pinned_options& o) {
  std::string n = o.device_mapped ? "mapped" : "unmapped";
  if (o.portable) n += "_portable";
  if (o.write_combined) n += "_write_combined";
  return n;
}

class PinnedHostResource : public ::testing::TestWithParam<pinned_options> {};

TEST_P(PinnedHostResource, TheFlagsReachTheDriver) {
  const pinned_options o = GetParam();
  pinned_host_resource mr(o, 0);
  const unsigned int wanted = (o.portable ? CU_MEMHOSTALLOC_PORTABLE : 0u) |
                              (o.device_mapped ? CU_MEMHOSTALLOC_DEVICEMAP : 0u) |
                              (o.write_combined ? CU_MEMHOSTALLOC_WRITECOMBINED : 0u);
  EXPECT_EQ(mr.driver_flags(), wanted);
  stream s(0);
  void* p = mr.allocate(10000, s);
  // The driver may add flags of its own (unified addressing maps everything); ours are all there.
  EXPECT_EQ(driver_flags_of(p) & wanted, wanted) << "driver reports " << driver_flags_of(p);
  EXPECT_EQ(driver_flags_of(static_cast<char*>(p) + 5000) & wanted, wanted);
  unsigned int type = 0;
  GPUMEM_CU(cuPointerGetAttribute, &type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, reinterpret_cast<CUdeviceptr>(p));
  EXPECT_EQ(type, static_cast<unsigned int>(CU_MEMORYTYPE_HOST));
  mr.deallocate(p, 10000, s);
}

TEST_P(PinnedHostResource, DeviceWorkReachesItThroughItsDevicePointer) {
  const pinned_options o = GetParam();
  pinned_host_resource mr(o, 0);
  const resource_properties props = mr.properties();
  EXPECT_EQ(props.device, -1);
  EXPECT_TRUE(props.host_accessible);
  stream s(0);
  auto* host = static_cast<unsigned char*>(mr.allocate(MiB, s));
  if (!props.device_accessible) {
    EXPECT_THROW(mr.device_pointer(host), logic_error);
    mr.deallocate(host, MiB, s);
    return;
  }
  auto* device = static_cast<unsigned char*>(mr.device_pointer(host));
  if (!o.write_combined) {
    EXPECT_EQ(device, host) << "with unified addressing the device uses the host pointer";
  } else if (current_backend() == backend_kind::sim) {
    EXPECT_NE(device, host) << "the simulator gives write-combined memory a device pointer of its own";
  }
  EXPECT_EQ(mr.device_pointer(host + 1000), device + 1000);
  // The device writes, the host reads; the host writes, the device reads.
  device_fill(device, MiB, 0x5A, s);
  s.synchronize();
  EXPECT_EQ(host[0], 0x5A);
  EXPECT_EQ(host[MiB - 1], 0x5A);
  std::memset(host, 0x66, MiB);
  EXPECT_EQ(device_count_mismatches(device, MiB, 0x66, s), 0U);
  mr.deallocate(host, MiB, s);
}

TEST_P(PinnedHostResource, CopiesMoveDataBetweenPinnedAndDeviceMemory) {
  pinned_host_resource mr(GetParam(), 0);
  stream s(0);
  auto* host = static_cast<unsigned char*>(mr.allocate(4096, s));
  for (int i = 0; i < 4096; ++i) host[i] = static_cast<unsigned char>(i * 7);
  detail::device_context_guard guard(0);
  CUdeviceptr d = 0;
  GPUMEM_CU(cuMemAlloc, &d, 4096);
  GPUMEM_CU(cuMemcpyAsync, d, reinterpret_cast<CUdeviceptr>(host), 4096, s.handle());
  s.synchronize();
  std::memset(host, 0, 4096);
  GPUMEM_CU(cuMemcpyAsync, reinterpret_cast<CUdeviceptr>(host), d, 2048, s.handle());
  s.synchronize();
  EXPECT_EQ(host[2047], static_cast<unsigned char>(2047 * 7));
  EXPECT_EQ(host[2048], 0);
  GPUMEM_CU(cuMemFree, d);
  mr.deallocate(host, 4096, s);
}

INSTANTIATE_TEST_SUITE_P(
    Flags, PinnedHostResource,
    ::testing::Values(pinned_options{.portable = false, .device_mapped = true, .write_combined = false},
                      pinned_options{.portable = false, .device_mapped = false, .write_combined = false},
                      pinned_options{.portable = true, .device_mapped = true, .write_combined = false},
                      pinned_options{.portable = false, .device_mapped = true, .write_combined = true},
                      pinned_options{.portable = true, .device_mapped = false, .write_combined = true}),
                         [](const auto& p) { return name_of(p.param); });

TEST(PinnedHostResourcePortable, AnotherDevicesWorkReachesPortableMemory) {
  if (device_count() < 2) GTEST_SKIP() << "needs two devices";
  pinned_host_resource mr({.portable = true, .device_mapped = true, .write_combined = false}, 0);
  stream s1(1);
  auto* host = static_cast<unsigned char*>(mr.allocate(MiB, s1));  // any device's stream will do
  device_fill(host, MiB, 0x71, s1);
  s1.synchronize();
  EXPECT_EQ(host[MiB / 2], 0x71);
  mr.deallocate(host, MiB, s1);
}

TEST(PinnedHostResourceErrors, DevicePointersOnlyForItsOwnMemory) {
  pinned_host_resource mr({}, 0);
  int on_stack = 0;
  EXPECT_THROW(mr.device_pointer(&on_stack), logic_error);
  EXPECT_THROW(mr.device_pointer(nullptr), logic_error);
  pinned_host_resource write_combined_unmapped({.portable = false, .device_mapped = false, .write_combined = true}, 0);
  EXPECT_FALSE(write_combined_unmapped.properties().device_accessible);
  stream s(0);
  void* p = write_combined_unmapped.allocate(64, s);
  EXPECT_THROW(write_combined_unmapped.device_pointer(p), logic_error);
  write_combined_unmapped.deallocate(p, 64, s);
  EXPECT_THROW(pinned_host_resource({}, device_count()), logic_error);
}

TEST(PinnedHostResourceErrors, CountsAndRefusesForeignPointers) {
  pinned_host_resource mr({}, 0);
  stream s(0);
  void* a = mr.allocate(100, s);
  void* b = mr.allocate(300, s, 8192);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b) % 8192, 0U);
  EXPECT_EQ(mr.allocated_bytes(), 400U);
  EXPECT_EQ(mr.allocation_count(), 2U);
  EXPECT_THROW(mr.deallocate(a, 99, s), logic_error);
  mr.deallocate(a, 100, s);
  EXPECT_THROW(mr.deallocate(a, 100, s), logic_error);
  mr.deallocate(b, 300, s, 8192);
  EXPECT_EQ(mr.allocation_count(), 0U);
}

}  // namespace
}  // namespace gpumem::test
