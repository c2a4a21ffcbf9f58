// gpumem::copy (include/gpumem/copy.hpp): host to device, device to device (also
// across devices), device to host, in stream order; bad pointers are logic_errors.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "gpumem/copy.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/stream.hpp"

namespace gpumem::test {
namespace {

TEST(Copy, HostToDeviceToDeviceToHostInStreamOrder) {
  cuda_resource mr(0);
  stream s(0);
  std::vector<std::uint32_t> host(1 << 18);
  std::iota(host.begin(), host.end(), 7U);
  const std::size_t bytes = host.size() * sizeof(host[0]);
  void* a = mr.allocate(bytes, s);
  void* b = mr.allocate(bytes, s);
  copy(a, host.data(), bytes, s);
  copy(b, a, bytes, s);
  std::vector<std::uint32_t> back(host.size());
  copy(back.data(), b, bytes, s);
  s.synchronize();
  EXPECT_EQ(back, host);
  mr.deallocate(a, bytes, s);
  mr.deallocate(b, bytes, s);
}

TEST(Copy, BetweenDevices) {
  if (device_count() < 2) GTEST_SKIP() << "needs two devices";
  cuda_resource on0(0), on1(1);
  stream s0(0), s1(1);
  std::vector<std::uint8_t> host(1 << 20, 0x5C);
  void* a = on0.allocate(host.size(), s0);
  void* b = on1.allocate(host.size(), s1);
  copy(a, host.data(), host.size(), s1);
  copy(b, a, host.size(), s1);
  std::vector<std::uint8_t> back(host.size());
  copy(back.data(), b, back.size(), s1);
  s1.synchronize();
  EXPECT_EQ(back, host);
  on0.deallocate(a, host.size(), s0);
  on1.deallocate(b, host.size(), s1);
}

TEST(Copy, NothingToCopyAndNullPointers) {
  stream s(0);
  int x = 1;
  EXPECT_NO_THROW(copy(nullptr, nullptr, 0, s));
  EXPECT_THROW(copy(nullptr, &x, sizeof x, s), logic_error);
  EXPECT_THROW(copy(&x, nullptr, sizeof x, s), logic_error);
}

}  // namespace
}  // namespace gpumem::test
