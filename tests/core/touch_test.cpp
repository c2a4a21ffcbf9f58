// The tests' own checks of memory (support/touch.hpp): a check that counted
// nothing would let every test that relies on it pass whatever the pool did.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>

#include "gpumem/copy.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/stream.hpp"
#include "support/touch.hpp"

namespace gpumem::test {
namespace {

TEST(Touch, CountsEveryByteThatDiffersInEveryBlockOfTheRange) {
  cuda_resource mr(0);
  stream s(0);
  // Over several of the check's 64 KiB comparison blocks, with a ragged end.
  const std::size_t bytes = (std::size_t{200} << 10) + 37;
  void* p = mr.allocate(bytes, s);
  device_fill(p, bytes, 0x11, s);
  EXPECT_EQ(device_count_mismatches(p, bytes, 0x11, s), 0u);
  EXPECT_EQ(device_count_mismatches(p, bytes, 0x12, s), bytes);
  // Two bytes in the first block, one in the third, the last byte of the range.
  const std::uint8_t other = 0x22;
  for (const std::size_t at : {std::size_t{0}, std::size_t{5}, std::size_t{130} << 10, bytes - 1}) {
    copy(static_cast<char*>(p) + at, &other, 1, s);
  }
  EXPECT_EQ(device_count_mismatches(p, bytes, 0x11, s), 4u);
  held_check check(p, bytes, 0x33, std::chrono::milliseconds(1), s);  // fills, then counts
  EXPECT_EQ(check.mismatches(), 0u);
  mr.deallocate(p, bytes, s);
}

}  // namespace
}  // namespace gpumem::test
