// vmm_pool_resource when the GPU's address space runs short (Note [When
// addresses run short], src/vmm/page_backing.cpp): each stream's segments
// reserve the device's memory in addresses, so many streams can use the
// address space up while the device has memory. The pool then gives back the
// segments that hold nothing and serves the request; when every segment holds
// something, the out-of-memory error says that addresses ran out. The
// simulator's address space is a fixed multiple of its memory, so a few dozen
// streams reach its end; a GPU's is far larger than its memory, so these run
// on the simulator.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "gpumem/backend.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/stream.hpp"
#include "gpumem/vmm_pool_resource.hpp"
#include "pool/pool_inspector.hpp"
#include "support/touch.hpp"

namespace gpumem::test {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
// More streams than the simulator's address space holds segments for: each
// stream reserves two segments of the device's memory (blocks and slots).
constexpr int many_streams = 128;

class VmmPoolAddresses : public ::testing::Test {
 protected:
  void SetUp() override {
    if (current_backend() != backend_kind::sim) {
      GTEST_SKIP() << "a GPU's address space is far larger than its memory; the simulator's runs out first";
    }
  }
};

// A small block and a slot on `s`, written and read back, freed; the stream drained.
void round_trip(vmm_pool_resource& pool, stream& s) {
  void* small = pool.allocate(1000, s);
  void* slot = pool.allocate(4 * MiB, s);
  device_fill(small, 1000, 0x5a, s);
  device_fill(slot, 4 * MiB, 0xa5, s);
  EXPECT_EQ(device_count_mismatches(small, 1000, 0x5a, s), 0U);
  EXPECT_EQ(device_count_mismatches(slot, 4 * MiB, 0xa5, s), 0U);
  pool.deallocate(small, 1000, s);
  pool.deallocate(slot, 4 * MiB, s);
  s.synchronize();
}

TEST_F(VmmPoolAddresses, StreamsBeyondTheAddressSpaceAreServedBySegmentsThatHeldNothing) {
  vmm_pool_resource pool(0);
  const std::size_t device_bytes = device_memory_info(0).total_bytes;
  std::vector<std::unique_ptr<stream>> streams;
  for (int i = 0; i < many_streams; ++i) {
    streams.push_back(std::make_unique<stream>(0));
    ASSERT_NO_THROW(round_trip(pool, *streams.back())) << "stream " << i;
  }
  // Every stream was served, and the addresses held are fewer than the streams
  // would have reserved: segments went back.
  EXPECT_LT(pool.statistics().address_bytes, std::size_t{many_streams} * 2 * device_bytes);
  EXPECT_EQ(detail::pool_inspector::violations(pool), "");
  // The first stream, whose segments went back, is served again.
  ASSERT_NO_THROW(round_trip(pool, *streams.front()));
  EXPECT_EQ(pool.statistics().used_bytes, 0U);
  EXPECT_EQ(detail::pool_inspector::violations(pool), "");
}

TEST_F(VmmPoolAddresses, WhenEverySegmentHoldsSomethingTheShortageNamesTheAddresses) {
  vmm_pool_resource pool(0);
  std::vector<std::unique_ptr<stream>> streams;
  std::vector<void*> held;
  std::string error;
  for (int i = 0; i < 8 * many_streams && error.empty(); ++i) {
    streams.push_back(std::make_unique<stream>(0));
    try {
      held.push_back(pool.allocate(1000, *streams.back()));
    } catch (const out_of_memory& e) {
      error = e.what();
    }
  }
  ASSERT_FALSE(error.empty()) << "the simulator's address space did not run out";
  EXPECT_NE(error.find("no address range"), std::string::npos) << error;
  EXPECT_NE(error.find("address space is used up"), std::string::npos) << error;
  EXPECT_EQ(detail::pool_inspector::violations(pool), "");
  // The first stream's block freed, its segment holds nothing: the stream that
  // failed is served now.
  pool.deallocate(held.front(), 1000, *streams.front());
  held.front() = nullptr;
  streams.front()->synchronize();
  void* p = nullptr;
  ASSERT_NO_THROW(p = pool.allocate(1000, *streams.back()));
  device_fill(p, 1000, 0x11, *streams.back());
  EXPECT_EQ(device_count_mismatches(p, 1000, 0x11, *streams.back()), 0U);
  pool.deallocate(p, 1000, *streams.back());
  for (std::size_t i = 1; i < held.size(); ++i) pool.deallocate(held[i], 1000, *streams[i]);
  for (auto& s : streams) s->synchronize();
  EXPECT_EQ(pool.statistics().used_bytes, 0U);
  EXPECT_EQ(detail::pool_inspector::violations(pool), "");
}

}  // namespace
}  // namespace gpumem::test
