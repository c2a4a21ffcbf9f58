// The bad-input walk (docs/resource-contract.md, "What is checked"): every field of
// every options struct at its extremes, and every resource asked for sizes and
// alignments at the edges. Each case either works or gives a typed error (a
// logic_error naming the field; out_of_memory), never a crash or another
// exception, and what was built still serves a plain request afterwards.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "contract/resources.hpp"
#include "gpumem/async_resource.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/stream.hpp"
#include "gpumem/vmm/growable_buffer.hpp"
#include "gpumem/vmm/virtual_memory.hpp"
#include "gpumem/vmm_pool_resource.hpp"
#include "support/touch.hpp"

namespace gpumem::test {
namespace {

constexpr std::size_t size_max = std::numeric_limits<std::size_t>::max();
constexpr std::size_t MiB = std::size_t{1} << 20;

// The values every size field is set to: nothing, tiny, odd, a page off either
// way of the granule, past any device, and the top of the range.
std::vector<std::size_t> extreme_sizes() {
  return {0, 1, 3, 4095, 2 * MiB - 1, 2 * MiB + 1, (std::size_t{1} << 50) + 1, size_max - 4096, size_max};
}

// Builds with one field changed, then asks for 4096 bytes. Returns what happened
// in words, for the failure message; fails the test on a crash-like outcome.
template <class Make>
void expect_built_or_refused(const std::string& field, const std::string& value, Make&& make) {
  SCOPED_TRACE(field + " = " + value);
  try {
    auto mr = make();
    stream s(0);
    try {
      void* p = mr->allocate(4096, s);
      device_fill(p, 4096, 0x5D, s);
      EXPECT_EQ(device_count_mismatches(p, 4096, 0x5D, s), 0U);
      mr->deallocate(p, 4096, s);
    } catch (const out_of_memory&) {
      // A cap of a byte, say: refused, typed.
    }
    s.synchronize();
  } catch (const logic_error& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << "the error does not name the field: " << e.what();
  } catch (const out_of_memory&) {
    // initial_bytes larger than the device: typed.
  } catch (const std::exception& e) {
    ADD_FAILURE() << "an untyped error: " << e.what();
  }
}

template <class Options>
using setter = std::function<void(Options&, std::size_t)>;

template <class Options, class Make>
void walk(const std::vector<std::pair<std::string, setter<Options>>>& fields, Make&& make) {
  for (const auto& field : fields) {
    for (std::size_t v : extreme_sizes()) {
      expect_built_or_refused(field.first, std::to_string(v), [&] {
        Options o;
        field.second(o, v);
        return make(o);
      });
    }
  }
}

TEST(BadInputWalk, PoolOptionsAtTheirExtremes) {
  using O = pool_options;
  walk<O>({{"initial_bytes", [](O& o, std::size_t v) { o.initial_bytes = v; }},
           {"maximum_bytes", [](O& o, std::size_t v) { o.maximum_bytes = v; }},
           {"min_chunk_bytes", [](O& o, std::size_t v) { o.min_chunk_bytes = v; }},
           {"max_chunk_bytes", [](O& o, std::size_t v) { o.max_chunk_bytes = v; }},
           {"chunk_bytes", [](O& o, std::size_t v) { o.min_chunk_bytes = o.max_chunk_bytes = v; }},
           {"fence_bytes", [](O& o, std::size_t v) { o.fence_bytes = v; }},
           {"fence_interval", [](O& o, std::size_t v) { o.fence_interval = static_cast<unsigned>(v); }}},
          [](const O& o) { return std::make_shared<pool_resource>(std::make_shared<cuda_resource>(0), o); });
}

TEST(BadInputWalk, VmmPoolOptionsAtTheirExtremes) {
  if (!vmm::supported(0)) GTEST_SKIP() << "no virtual memory management on device 0";
  using O = vmm_pool_options;
  walk<O>({{"page_bytes", [](O& o, std::size_t v) { o.page_bytes = v; }},
           {"maximum_bytes", [](O& o, std::size_t v) { o.maximum_bytes = v; }},
           {"segment_bytes", [](O& o, std::size_t v) { o.segment_bytes = v; }},
           {"slot_min_bytes", [](O& o, std::size_t v) { o.slot_min_bytes = v; }},
           {"release_threshold_bytes", [](O& o, std::size_t v) { o.release_threshold_bytes = v; }},
           {"fence_bytes", [](O& o, std::size_t v) { o.fence_bytes = v; }},
           {"fence_interval", [](O& o, std::size_t v) { o.fence_interval = static_cast<unsigned>(v); }}},
          [](const O& o) { return std::make_shared<vmm_pool_resource>(0, o); });
  for (int bad : {-2, -1, device_count()}) {
    expect_built_or_refused("peer_devices", std::to_string(bad), [bad] {
      vmm_pool_options o;
      o.peer_devices = {bad};
      return std::make_shared<vmm_pool_resource>(0, o);
    });
  }
}

TEST(BadInputWalk, AsyncOptionsAtTheirExtremes) {
  using O = async_options;
  std::vector<std::pair<std::string, setter<O>>> fields = {
      {"initial_bytes", [](O& o, std::size_t v) { o.initial_bytes = v; }},
      {"release_threshold_bytes", [](O& o, std::size_t v) { o.release_threshold_bytes = v; }},
      {"maximum_bytes", [](O& o, std::size_t v) { o.maximum_bytes = v; }}};
  try {
    (void)async_resource(0);
  } catch (const cuda_error& e) {
    GTEST_SKIP() << "no driver pools here: " << e.what();
  }
  walk<O>(fields, [](const O& o) { return std::make_shared<async_resource>(0, o); });
}

// A growable_buffer is not a resource: built with the options, then grown.
TEST(BadInputWalk, GrowableOptionsAtTheirExtremes) {
  if (!vmm::supported(0)) GTEST_SKIP() << "no virtual memory management on device 0";
  using O = growable_options;
  const std::vector<std::pair<std::string, setter<O>>> fields = {
      {"min_chunk_bytes", [](O& o, std::size_t v) { o.min_chunk_bytes = v; }},
      {"max_chunk_bytes", [](O& o, std::size_t v) { o.max_chunk_bytes = v; }},
      {"address_bytes", [](O& o, std::size_t v) { o.address_bytes = v; }}};
  stream s(0);
  for (const auto& field : fields) {
    for (std::size_t v : extreme_sizes()) {
      SCOPED_TRACE(field.first + " = " + std::to_string(v));
      try {
        O o;
        field.second(o, v);
        growable_buffer b(0, s, o);
        try {
          b.resize(3 * MiB);
          device_fill(b.data(), b.size(), 0x6E, s);
          EXPECT_EQ(device_count_mismatches(b.data(), b.size(), 0x6E, s), 0U);
        } catch (const out_of_memory&) {
          EXPECT_EQ(b.size(), 0U) << "a failed resize changed the buffer";
        }
      } catch (const logic_error& e) {
        EXPECT_NE(std::string(e.what()).find(field.first), std::string::npos) << e.what();
      } catch (const out_of_memory&) {
      } catch (const std::exception& e) {
        ADD_FAILURE() << "an untyped error: " << e.what();
      }
    }
  }
}

class BadInputWalkSizes : public ::testing::TestWithParam<resource_factory> {};

// Sizes at the edges with ordinary and large alignments, on every resource of the
// contract suite: served (and usable) or out_of_memory, and the resource serves a
// plain request afterwards.
TEST_P(BadInputWalkSizes, EdgeSizesAreServedOrOutOfMemory) {
  auto mr = GetParam().make(0);
  stream s(0);
  for (std::size_t bytes : {std::size_t{1}, std::size_t{255}, std::size_t{4097}, 2 * MiB - 1, 2 * MiB + 1,
                            std::size_t{1} << 62, size_max - 4096, size_max - 255, size_max}) {
    for (std::size_t alignment : {std::size_t{256}, std::size_t{4096}, std::size_t{1} << 21, std::size_t{1} << 40}) {
      SCOPED_TRACE(std::to_string(bytes) + " bytes, alignment " + std::to_string(alignment));
      try {
        void* p = mr->allocate(bytes, s, alignment);
        EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % alignment, 0U);
        device_fill(p, std::min<std::size_t>(bytes, 4096), 0x2F, s);
        mr->deallocate(p, bytes, s, alignment);
      } catch (const out_of_memory&) {
      } catch (const std::exception& e) {
        ADD_FAILURE() << "an untyped error: " << e.what();
      }
    }
  }
  void* p = mr->allocate(4096, s);
  device_fill(p, 4096, 0x4B, s);
  EXPECT_EQ(device_count_mismatches(p, 4096, 0x4B, s), 0U);
  mr->deallocate(p, 4096, s);
  s.synchronize();
}

std::string walk_name(const ::testing::TestParamInfo<resource_factory>& param) { return param.param.name; }

INSTANTIATE_TEST_SUITE_P(AllResources, BadInputWalkSizes, ::testing::ValuesIn(all_resources()), walk_name);

}  // namespace
}  // namespace gpumem::test
