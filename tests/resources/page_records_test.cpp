// The paged pool's per-page records of its segments are zero until written and
// cost host memory only where written (Note [Page records on demand],
// src/pool/zeroed_array.hpp): a stream's first allocations no longer write
// records for the whole of its segments, each the device's memory long.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "gpumem/stream.hpp"
#include "gpumem/vmm_pool_resource.hpp"
#include "pool/pool_inspector.hpp"
#include "pool/zeroed_array.hpp"
#include "support/touch.hpp"

namespace gpumem::test {
namespace {

using detail::zeroed_array;

constexpr std::size_t MiB = std::size_t{1} << 20;

std::size_t os_page() { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }

TEST(ZeroedArray, HoldsHostMemoryOnlyWhereWritten) {
  constexpr std::size_t n = 8 * MiB / sizeof(std::uint64_t);
  zeroed_array<std::uint64_t> a(n);
  ASSERT_EQ(a.size(), n);
  EXPECT_EQ(a.bytes(), 8 * MiB);
  EXPECT_EQ(a.resident_bytes(), 0U);  // nothing written (nor read) yet
  a[0] = 1;
  a[n / 2] = 2;
  a[n - 1] = 3;
  // Three host pages, not a huge page each and not the whole array.
  EXPECT_EQ(a.resident_bytes(), 3 * os_page());
  EXPECT_EQ(a[0], 1U);
  EXPECT_EQ(a[n / 2], 2U);
  EXPECT_EQ(a.back(), 3U);
  std::size_t nonzero = 0;
  for (std::uint64_t v : a) nonzero += v != 0;
  EXPECT_EQ(nonzero, 3U);
}

TEST(ZeroedArray, RecordsStartAsTheirValueInitialisedState) {
  struct record {
    std::uint64_t mark = 0;
    const void* where = nullptr;
  };
  zeroed_array<record> a(100'000);
  for (const record& r : a) {
    ASSERT_EQ(r.mark, 0U);
    ASSERT_EQ(r.where, nullptr);
  }
}

TEST(ZeroedArray, MovesOwnershipAndIsEmptyWhenDefaultOrZero) {
  zeroed_array<std::uint64_t> none;
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.resident_bytes(), 0U);
  zeroed_array<std::uint64_t> zero(0);
  EXPECT_TRUE(zero.empty());
  EXPECT_EQ(zero.begin(), zero.end());

  zeroed_array<std::uint64_t> a(1000);
  a[7] = 42;
  const std::uint64_t* data = a.begin();
  zeroed_array<std::uint64_t> b(std::move(a));
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): the moved-from state is the point
  EXPECT_EQ(b.begin(), data);
  EXPECT_EQ(b[7], 42U);
  zeroed_array<std::uint64_t> c(10);
  c = std::move(b);
  EXPECT_EQ(c.size(), 1000U);
  EXPECT_EQ(c[7], 42U);
}

TEST(ZeroedArray, SizesPastTheAddressSpaceThrowBadAlloc) {
  // The byte count overflows.
  EXPECT_THROW(zeroed_array<std::uint64_t>(SIZE_MAX / 4), std::bad_array_new_length);
  // It does not, but no host address range is that large.
  EXPECT_THROW(zeroed_array<std::uint64_t>(std::size_t{1} << 60), std::bad_alloc);
}

// A stream's first allocations (a small block and a slot, each in a segment
// the device's memory long) hold host memory for the pages used, a small part
// of the records their segments have: before, every record was written.
TEST(VmmPoolPageRecords, NewStreamsHoldRecordsForThePagesTheyUse) {
  vmm_pool_resource pool(0);
  constexpr int streams = 8;
  std::vector<std::unique_ptr<stream>> ss;
  std::vector<void*> held;
  for (int i = 0; i < streams; ++i) {
    ss.push_back(std::make_unique<stream>(0));
    held.push_back(pool.allocate(1000, *ss.back()));
    held.push_back(pool.allocate(4 * MiB, *ss.back()));
    device_fill(held.back(), 4 * MiB, 0x3c, *ss.back());
    EXPECT_EQ(device_count_mismatches(held.back(), 4 * MiB, 0x3c, *ss.back()), 0U);
  }
  const auto records = detail::pool_inspector::page_records(pool);
  // Two segments a stream, each with a record of 8 bytes or more a page.
  const std::size_t pages_per_segment = pool.statistics().address_bytes / (2 * streams) / pool.page_bytes();
  EXPECT_GE(records.total, std::size_t{2} * streams * pages_per_segment * sizeof(std::uint64_t));
  EXPECT_GT(records.resident, 0U);
  EXPECT_LT(records.resident * 4, records.total) << records.resident << " of " << records.total << " bytes held";
  for (int i = 0; i < streams; ++i) {
    pool.deallocate(held[2 * i], 1000, *ss[i]);
    pool.deallocate(held[2 * i + 1], 4 * MiB, *ss[i]);
  }
  for (auto& s : ss) s->synchronize();
  EXPECT_EQ(detail::pool_inspector::violations(pool), "");
}

}  // namespace
}  // namespace gpumem::test
