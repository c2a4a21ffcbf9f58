// The resource contract (docs/resource-contract.md), checked against every
// resource in all_resources(). Device work touches every allocation, so on a GPU
// these tests prove the memory is usable from kernels.
//
// Host resources (properties().device == -1, e.g. pinned host memory) run the
// same checks, with the host in the device's place: "more than could ever be
// held" is more than the host's physical memory, any device's stream is
// accepted, and there is no second device to hand out memory of. Their memory
// must be reachable from device work (device_accessible), through the device
// pointer the driver gives for it (support/touch.hpp asks for it).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <new>
#include <random>
#include <thread>
#include <vector>

#include "contract/resources.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/stream.hpp"
#include "support/touch.hpp"

namespace gpumem::test {
namespace {

class Contract : public ::testing::TestWithParam<resource_factory> {
 protected:
  void SetUp() override {
    mr_ = GetParam().make(0);
    stream_ = std::make_unique<stream>(0);
  }
  void TearDown() override { stream_->synchronize(); }

  memory_resource& mr() { return *mr_; }
  stream_view s() { return stream_->view(); }
  bool host_memory() { return mr().properties().device < 0; }

  // The most memory the resource's side could ever hold: the device's total
  // memory, or the host's physical memory for host resources.
  std::size_t capacity() {
    if (!host_memory()) return device_memory_info(0).total_bytes;
    return static_cast<std::size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  }

  // The resource still works: a fresh allocation is written and read back.
  void expect_usable() {
    void* p = mr().allocate(4096, s());
    device_fill(p, 4096, 0x3C, s());
    EXPECT_EQ(device_count_mismatches(p, 4096, 0x3C, s()), 0U);
    mr().deallocate(p, 4096, s());
  }

  std::shared_ptr<memory_resource> mr_;
  std::unique_ptr<stream> stream_;
};

std::string name_of(const ::testing::TestParamInfo<resource_factory>& info) {
  return info.param.name;
}

TEST_P(Contract, AllocationsAreDistinctAlignedAndDeviceAccessible) {
  const std::vector<std::size_t> sizes = {1, 255, 256, 257, 4097, 1 << 20, (64 << 20) + 3};
  std::vector<void*> ptrs;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    void* p = mr().allocate(sizes[i], s());
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % default_alignment, 0U) << sizes[i];
    device_fill(p, sizes[i], static_cast<std::uint8_t>(0x10 + i), s());
    ptrs.push_back(p);
  }
  // Each allocation still holds its own pattern after all were written: no overlap.
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(device_count_mismatches(ptrs[i], sizes[i], static_cast<std::uint8_t>(0x10 + i), s()), 0U)
        << "allocation of " << sizes[i] << " bytes was overwritten (" << touch_method() << ")";
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) mr().deallocate(ptrs[i], sizes[i], s());
}

TEST_P(Contract, HonoursRequestedAlignment) {
  for (std::size_t alignment = 1; alignment <= (std::size_t{1} << 16); alignment <<= 1) {
    void* p = mr().allocate(1000, s(), alignment);
    const auto addr = reinterpret_cast<std::uintptr_t>(p);
    EXPECT_EQ(addr % alignment, 0U) << "alignment " << alignment;
    EXPECT_EQ(addr % default_alignment, 0U) << "alignment " << alignment;
    device_fill(p, 1000, 0x77, s());
    EXPECT_EQ(device_count_mismatches(p, 1000, 0x77, s()), 0U);
    mr().deallocate(p, 1000, s(), alignment);
  }
}

TEST_P(Contract, ZeroBytesIsALogicError) {
  EXPECT_THROW(mr().allocate(0, s()), logic_error);
  expect_usable();
}

TEST_P(Contract, BadAlignmentIsALogicError) {
  for (std::size_t alignment : {std::size_t{0}, std::size_t{3}, std::size_t{48}, std::size_t{257}}) {
    EXPECT_THROW(mr().allocate(64, s(), alignment), logic_error) << alignment;
  }
  void* p = mr().allocate(64, s());
  EXPECT_THROW(mr().deallocate(p, 64, s(), 3), logic_error);
  mr().deallocate(p, 64, s());
  expect_usable();
}

TEST_P(Contract, ImpossibleSizesAreOutOfMemoryAtOnce) {
  const std::size_t total = capacity();
  for (std::size_t bytes : {total + 1, total * 2, std::numeric_limits<std::size_t>::max() / 2,
                            std::numeric_limits<std::size_t>::max()}) {
    try {
      mr().allocate(bytes, s());
      ADD_FAILURE() << "allocating " << bytes << " bytes succeeded";
    } catch (const out_of_memory& e) {
      EXPECT_EQ(e.requested_bytes(), bytes);
      EXPECT_NE(std::string(e.what()).find(std::to_string(bytes)), std::string::npos) << e.what();
    }
  }
  // Huge alignment that cannot be honoured is out of memory too, not a crash.
  EXPECT_THROW(mr().allocate(64, s(), std::size_t{1} << 62), out_of_memory);
  expect_usable();
}

TEST_P(Contract, OutOfMemoryIsABadAlloc) {
  const std::size_t total = capacity();
  EXPECT_THROW(mr().allocate(total + 1, s()), std::bad_alloc);
}

TEST_P(Contract, NullForeignDoubleFreedAndResizedPointersAreLogicErrors) {
  void* p = mr().allocate(1024, s());
  int on_stack = 0;
  EXPECT_THROW(mr().deallocate(nullptr, 1024, s()), logic_error);
  EXPECT_THROW(mr().deallocate(&on_stack, sizeof on_stack, s()), logic_error);
  EXPECT_THROW(mr().deallocate(static_cast<char*>(p) + 256, 256, s()), logic_error);
  EXPECT_THROW(mr().deallocate(p, 1023, s()), logic_error);
  EXPECT_THROW(mr().deallocate(p, 0, s()), logic_error);

  // Memory of another instance of the same kind of resource.
  auto other = GetParam().make(0);
  void* q = other->allocate(1024, s());
  if (!(mr() == *other)) {
    EXPECT_THROW(mr().deallocate(q, 1024, s()), logic_error);
  }
  other->deallocate(q, 1024, s());

  // p survived all of that: still writable, and freed exactly once.
  device_fill(p, 1024, 0x42, s());
  EXPECT_EQ(device_count_mismatches(p, 1024, 0x42, s()), 0U);
  mr().deallocate(p, 1024, s());
  EXPECT_THROW(mr().deallocate(p, 1024, s()), logic_error);
  expect_usable();
}

TEST_P(Contract, StreamOfAnotherDeviceIsALogicError) {
  if (device_count() < 2) GTEST_SKIP() << "needs two devices";
  if (host_memory()) GTEST_SKIP() << "host memory: any device's stream may use it";
  stream other_device_stream(1);
  EXPECT_THROW(mr().allocate(256, other_device_stream), logic_error);
  void* p = mr().allocate(256, s());
  EXPECT_THROW(mr().deallocate(p, 256, other_device_stream), logic_error);
  mr().deallocate(p, 256, s());
  expect_usable();
}

TEST_P(Contract, ResourceOnSecondDeviceGivesThatDevicesMemory) {
  if (device_count() < 2) GTEST_SKIP() << "needs two devices";
  if (host_memory()) GTEST_SKIP() << "host memory is no device's";
  auto mr1 = GetParam().make(1);
  EXPECT_EQ(mr1->properties().device, 1);
  stream s1(1);
  void* p = mr1->allocate(1 << 20, s1);
  device_fill(p, 1 << 20, 0x21, s1);
  EXPECT_EQ(device_count_mismatches(p, 1 << 20, 0x21, s1), 0U);
  mr1->deallocate(p, 1 << 20, s1);
}

TEST_P(Contract, DeallocationIsStreamOrdered) {
  // Work on stream A fills a block, keeps the device busy, then checks the block.
  // The block is freed on A right after queuing that work; stream B then asks for
  // blocks of the same size and overwrites them. If the resource handed the block
  // to B before A's work was done, A's check sees B's bytes.
  constexpr std::size_t bytes = 1 << 20;
  stream a(0);
  stream b(0);
  void* p = mr().allocate(bytes, a);
  held_check check(p, bytes, 0xA1, std::chrono::milliseconds(200), a);
  mr().deallocate(p, bytes, a);
  std::vector<void*> on_b;
  for (int i = 0; i < 4; ++i) {
    void* q = mr().allocate(bytes, b);
    device_fill(q, bytes, 0x5B, b);
    on_b.push_back(q);
  }
  EXPECT_EQ(check.mismatches(), 0U) << "a block freed on one stream was reused by another "
                                       "before the first stream's work had finished";
  for (void* q : on_b) mr().deallocate(q, bytes, b);
}

TEST_P(Contract, SynchronousVariants) {
  void* p = mr().allocate_sync(12345);
  ASSERT_NE(p, nullptr);
  device_fill(p, 12345, 0x66, s());
  EXPECT_EQ(device_count_mismatches(p, 12345, 0x66, s()), 0U);
  mr().deallocate_sync(p, 12345);
  EXPECT_THROW(mr().allocate_sync(0), logic_error);
  EXPECT_THROW(mr().deallocate_sync(nullptr, 1), logic_error);
}

TEST_P(Contract, EqualityMeansInterchangeable) {
  EXPECT_TRUE(mr() == mr());
  auto other = GetParam().make(0);
  void* p = mr().allocate(512, s());
  if (mr() == *other) {
    other->deallocate(p, 512, s());  // equal resources may free each other's memory
  } else {
    EXPECT_THROW(other->deallocate(p, 512, s()), logic_error);
    mr().deallocate(p, 512, s());
  }
}

TEST_P(Contract, PropertiesDescribeTheMemory) {
  const resource_properties props = mr().properties();
  if (host_memory()) {
    EXPECT_EQ(props.device, -1);
    EXPECT_TRUE(props.host_accessible);
  } else {
    EXPECT_EQ(props.device, 0);
  }
  EXPECT_TRUE(props.device_accessible);
}

TEST_P(Contract, ConcurrentThreadsOnTheirOwnStreams) {
  if (!mr().properties().thread_safe) GTEST_SKIP() << "resource is not thread-safe";
  constexpr int threads = 4;
  constexpr int rounds = 60;
  std::atomic<int> corrupted{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      stream mine(0);
      std::mt19937 rng(static_cast<unsigned>(t + 1));
      std::uniform_int_distribution<std::size_t> size(1, 256 << 10);
      std::vector<std::pair<void*, std::size_t>> live;
      for (int i = 0; i < rounds; ++i) {
        const std::size_t bytes = size(rng);
        void* p = mr().allocate(bytes, mine);
        device_fill(p, bytes, static_cast<std::uint8_t>(t + 1), mine);
        live.emplace_back(p, bytes);
        if (live.size() > 8) {
          auto [q, n] = live.front();
          if (device_count_mismatches(q, n, static_cast<std::uint8_t>(t + 1), mine) != 0) ++corrupted;
          mr().deallocate(q, n, mine);
          live.erase(live.begin());
        }
      }
      for (auto [q, n] : live) {
        if (device_count_mismatches(q, n, static_cast<std::uint8_t>(t + 1), mine) != 0) ++corrupted;
        mr().deallocate(q, n, mine);
      }
    });
  }
  for (auto& th : pool) th.join();
  EXPECT_EQ(corrupted.load(), 0) << "threads saw each other's bytes in their allocations";
  expect_usable();
}

INSTANTIATE_TEST_SUITE_P(AllResources, Contract, ::testing::ValuesIn(all_resources()), name_of);

}  // namespace
}  // namespace gpumem::test
