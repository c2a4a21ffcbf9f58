// device_buffer: stream-ordered, untyped memory from any resource (the current
// one by default), copies from and to host and device memory, resize, moves,
// and errors that leave the buffer as it was.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "gpumem/async_resource.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/current_resource.hpp"
#include "gpumem/device.hpp"
#include "gpumem/device_buffer.hpp"
#include "gpumem/error.hpp"
#include "gpumem/managed_resource.hpp"
#include "gpumem/pinned_host_resource.hpp"
#include "support/touch.hpp"

namespace gpumem::test {
namespace {

std::vector<unsigned char> pattern(std::size_t n, unsigned seed = 1) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>((i * 31 + seed) & 0xFF);
  return v;
}

std::vector<unsigned char> read_back(const device_buffer& b, stream_view s) {
  std::vector<unsigned char> out(b.size());
  b.copy_to(out.data(), b.size(), s);
  s.synchronize();
  return out;
}

// Makes `r` device 0's current resource for the scope.
class current_resource_scope {
 public:
  explicit current_resource_scope(std::shared_ptr<memory_resource> r)
      : previous_(set_current_resource(0, std::move(r))) {}
  ~current_resource_scope() { set_current_resource(0, previous_); }

 private:
  std::shared_ptr<memory_resource> previous_;
};

TEST(DeviceBuffer, AllocatesFromTheCurrentResourceByDefault) {
  auto counted = std::make_shared<cuda_resource>(0);
  current_resource_scope scope(counted);
  stream s(0);
  {
    device_buffer b(1000, s);
    EXPECT_EQ(b.resource(), counted);
    EXPECT_EQ(b.size(), 1000U);
    EXPECT_EQ(b.capacity(), 1000U);
    EXPECT_EQ(b.device(), 0);
    EXPECT_EQ(b.stream(), s.view());
    EXPECT_NE(b.data(), nullptr);
    EXPECT_EQ(counted->allocation_count(), 1U);
  }
  EXPECT_EQ(counted->allocation_count(), 0U) << "freed with the buffer";
}

TEST(DeviceBuffer, CopiesFromAndToHostMemory) {
  cuda_resource mr(0);
  stream s(0);
  const auto src = pattern(100000);
  device_buffer b(src.data(), src.size(), s, std::shared_ptr<memory_resource>(std::shared_ptr<void>{}, &mr));
  EXPECT_EQ(read_back(b, s), src);
  // Part of it, at an offset, both ways.
  const auto patch = pattern(1000, 7);
  b.copy_from(patch.data(), patch.size(), s, 5000);
  std::vector<unsigned char> out(1000);
  b.copy_to(out.data(), out.size(), s, 5000);
  s.synchronize();
  EXPECT_EQ(out, patch);
  const auto all = read_back(b, s);
  EXPECT_EQ(all[4999], src[4999]);
  EXPECT_EQ(all[6000], src[6000]);
}

TEST(DeviceBuffer, CopiesFromAndToDeviceMemory) {
  cuda_resource mr(0);
  stream s(0);
  const auto src = pattern(65536);
  device_buffer a(src.data(), src.size(), s, std::shared_ptr<memory_resource>(std::shared_ptr<void>{}, &mr));
  device_buffer b(src.size(), s, mr);
  b.copy_from(a.data(), a.size(), s);  // device to device
  EXPECT_EQ(read_back(b, s), src);
  device_buffer c(a, s);  // a deep copy, from a's resource
  EXPECT_NE(c.data(), a.data());
  EXPECT_EQ(c.resource().get(), &mr);
  EXPECT_EQ(read_back(c, s), src);
  device_fill(a.data(), a.size(), 0, s);  // the copies do not share a's memory
  EXPECT_EQ(read_back(c, s), src);
  EXPECT_EQ(mr.allocation_count(), 3U);
}

TEST(DeviceBuffer, ResizeKeepsTheBytesAndReallocatesOnlyBeyondTheCapacity) {
  cuda_resource mr(0);
  stream s(0);
  stream t(0);
  const auto src = pattern(1000);
  device_buffer b(src.data(), src.size(), s, std::shared_ptr<memory_resource>(std::shared_ptr<void>{}, &mr));
  s.synchronize();  // the caller orders s's work on the buffer before t's (here: the first copy)
  b.resize(5000, t);
  EXPECT_EQ(b.size(), 5000U);
  EXPECT_EQ(b.capacity(), 5000U);
  EXPECT_EQ(b.stream(), t.view()) << "the buffer now lives on the stream it was resized on";
  auto grown = read_back(b, t);
  EXPECT_TRUE(std::equal(src.begin(), src.end(), grown.begin()));
  void* before = b.data();
  b.resize(10, t);
  EXPECT_EQ(b.data(), before) << "shrinking within the capacity moves nothing";
  EXPECT_EQ(b.capacity(), 5000U);
  b.shrink_to_fit(t);
  EXPECT_EQ(b.capacity(), 10U);
  auto shrunk = read_back(b, t);
  EXPECT_TRUE(std::equal(shrunk.begin(), shrunk.end(), src.begin()));
  b.reserve(20000, t);
  EXPECT_EQ(b.size(), 10U);
  EXPECT_EQ(b.capacity(), 20000U);
  EXPECT_EQ(mr.allocation_count(), 1U) << "every old block was freed";
  b.resize(0, t);
  b.shrink_to_fit(t);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(mr.allocation_count(), 0U);
}

TEST(DeviceBuffer, ZeroSizeAndEmptyBuffersHoldNothing) {
  auto counted = std::make_shared<cuda_resource>(0);
  current_resource_scope scope(counted);
  stream s(0);
  device_buffer zero(0, s);
  EXPECT_EQ(zero.data(), nullptr);
  EXPECT_TRUE(zero.empty());
  EXPECT_EQ(zero.resource(), counted);
  zero.resize(100, s);
  EXPECT_NE(zero.data(), nullptr);
  device_buffer empty;
  EXPECT_EQ(empty.resource(), nullptr);
  EXPECT_EQ(empty.device(), -1);
  empty.resize(64, s);  // the current resource, as the constructors would take
  EXPECT_EQ(empty.resource(), counted);
  EXPECT_EQ(counted->allocation_count(), 2U);
}

TEST(DeviceBuffer, MovesTransferTheMemory) {
  cuda_resource mr(0);
  stream s(0);
  const auto src = pattern(4096);
  device_buffer a(src.data(), src.size(), s, std::shared_ptr<memory_resource>(std::shared_ptr<void>{}, &mr));
  void* p = a.data();
  device_buffer b(std::move(a));
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(a.size(), 0U);       // NOLINT(bugprone-use-after-move)
  device_buffer c(10, s, mr);
  c = std::move(b);  // c's own memory is freed
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(mr.allocation_count(), 1U);
  EXPECT_EQ(read_back(c, s), src);
  c.release();
  EXPECT_EQ(c.data(), nullptr);
  EXPECT_EQ(mr.allocation_count(), 0U);
}

TEST(DeviceBuffer, BadCopiesAndFailedResizesLeaveTheBufferAsItWas) {
  async_options o;
  o.maximum_bytes = 8 << 20;
  auto pool = std::make_shared<async_resource>(0, o);
  stream s(0);
  const auto src = pattern(4 << 20);
  device_buffer b(src.data(), src.size(), s, pool);
  std::vector<unsigned char> out(16);
  EXPECT_THROW(b.copy_to(out.data(), 16, s, src.size() - 8), logic_error);
  EXPECT_THROW(b.copy_from(out.data(), 16, s, src.size() + 1), logic_error);
  EXPECT_THROW(b.copy_from(nullptr, 16, s), logic_error);
  EXPECT_THROW(b.copy_to(out.data(), static_cast<std::size_t>(-1), s, 1), logic_error);
  void* before = b.data();
  EXPECT_THROW(b.resize(16 << 20, s), out_of_memory);
  EXPECT_EQ(b.data(), before);
  EXPECT_EQ(b.size(), src.size());
  EXPECT_EQ(b.capacity(), src.size());
  EXPECT_EQ(read_back(b, s), src);
  EXPECT_THROW(device_buffer(nullptr, 10, s, pool), logic_error);
  EXPECT_EQ(pool->allocation_count(), 1U);
}

TEST(DeviceBuffer, WorksWithAnyResource) {
  stream s(0);
  const auto src = pattern(300000, 3);
  std::vector<std::shared_ptr<memory_resource>> resources = {
      std::make_shared<async_resource>(0), std::make_shared<managed_resource>(0),
      std::make_shared<pinned_host_resource>(pinned_options{}, 0), get_current_resource(0)};
  for (const auto& r : resources) {
    device_buffer b(src.data(), src.size(), s, r);
    EXPECT_EQ(read_back(b, s), src);
    b.resize(600000, s);
    b.copy_from(src.data(), src.size(), s, 300000);
    const auto both = read_back(b, s);
    EXPECT_TRUE(std::equal(src.begin(), src.end(), both.begin()));
    EXPECT_TRUE(std::equal(src.begin(), src.end(), both.begin() + 300000));
  }
  EXPECT_EQ(device_buffer(16, s, resources[2]).device(), -1) << "host memory";
}

TEST(DeviceBuffer, TheFreeIsOrderedAfterTheBuffersStream) {
  // Work on the buffer's stream still uses the memory when the buffer goes; a
  // stream-ordered resource must not hand it to another stream before that work is done.
  async_resource mr(0, async_options{.reuse = {false, false, false}});
  stream a(0);
  stream b(0);
  std::unique_ptr<held_check> check;
  {
    device_buffer buf(1 << 20, a, mr);
    check = std::make_unique<held_check>(buf.data(), buf.size(), 0xA1, std::chrono::milliseconds(200), a);
  }
  device_buffer other(1 << 20, b, mr);
  device_fill(other.data(), other.size(), 0x5B, b);
  EXPECT_EQ(check->mismatches(), 0U);
}

}  // namespace
}  // namespace gpumem::test
