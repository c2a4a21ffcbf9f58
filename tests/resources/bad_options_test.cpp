// Options and requests past any device: a logic_error naming the field, or an
// out_of_memory naming what was asked, never an arithmetic trap; and the
// resource stays usable afterwards.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>

#include "gpumem/cuda_resource.hpp"
#include "gpumem/error.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/stream.hpp"
#include "gpumem/vmm/virtual_memory.hpp"
#include "gpumem/vmm_pool_resource.hpp"

namespace gpumem::test {
namespace {

template <class F>
std::string logic_error_of(F&& f) {
  try {
    f();
  } catch (const logic_error& e) {
    return e.what();
  }
  return "no logic_error";
}

TEST(BadOptions, PoolChunkSizesAndInitialBytesPastAPebibyteNameTheField) {
  auto up = std::make_shared<cuda_resource>(0);
  pool_options o;
  o.min_chunk_bytes = SIZE_MAX;
  o.max_chunk_bytes = SIZE_MAX;
  EXPECT_NE(logic_error_of([&] { pool_resource p(up, o); }).find("max_chunk_bytes 18446744073709551615"),
            std::string::npos);
  pool_options i;
  i.initial_bytes = SIZE_MAX;
  EXPECT_NE(logic_error_of([&] { pool_resource p(up, i); }).find("initial_bytes 18446744073709551615"),
            std::string::npos);
  pool_options inverted;
  inverted.min_chunk_bytes = 1 << 20;
  inverted.max_chunk_bytes = 1 << 19;
  EXPECT_NE(logic_error_of([&] { pool_resource p(up, inverted); }).find("min_chunk_bytes 1048576"),
            std::string::npos);
}

TEST(BadOptions, VmmPoolSegmentAndPageSizesPastTheDeviceNameTheField) {
  if (!vmm::supported(0)) GTEST_SKIP() << "no virtual memory management on device 0";
  vmm_pool_options seg;
  seg.segment_bytes = SIZE_MAX;
  EXPECT_NE(logic_error_of([&] { vmm_pool_resource p(0, seg); }).find("segment_bytes (18446744073709551615)"),
            std::string::npos);
  vmm_pool_options page;
  page.page_bytes = std::size_t{1} << 63;
  EXPECT_NE(logic_error_of([&] { vmm_pool_resource p(0, page); }).find("page_bytes"), std::string::npos);
  vmm_pool_options odd;
  odd.page_bytes = 3 * vmm::granularity(0);
  EXPECT_NE(logic_error_of([&] { vmm_pool_resource p(0, odd); }).find("power of two"), std::string::npos);
  for (unsigned ms : {0U, 3'600'001U, ~0U}) {
    vmm_pool_options idle;
    idle.idle_stream_ms = ms;
    EXPECT_NE(logic_error_of([&] { vmm_pool_resource p(0, idle); }).find("idle_stream_ms (" + std::to_string(ms) + ")"),
              std::string::npos);
  }
}

TEST(BadOptions, AHugeAlignmentIsNamedAndThePoolStaysUsable) {
  stream s(0);
  auto check = [&](memory_resource& mr) {
    try {
      (void)mr.allocate(256, s, std::size_t{1} << 40);
      ADD_FAILURE() << "a 1 TiB alignment was served";
    } catch (const out_of_memory& e) {
      EXPECT_NE(std::string(e.what()).find("alignment 1099511627776"), std::string::npos) << e.what();
    }
    void* p = mr.allocate(256, s);
    mr.deallocate(p, 256, s);
    s.synchronize();
  };
  pool_resource pool(std::make_shared<cuda_resource>(0));
  check(pool);
  if (vmm::supported(0)) {
    vmm_pool_resource vmm_pool(0);
    check(vmm_pool);
  }
}

}  // namespace
}  // namespace gpumem::test
