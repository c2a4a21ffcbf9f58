// oom_retry_adaptor: callbacks on out-of-memory, retries as they ask, limits.
#include <gtest/gtest.h>

#include <vector>

#include "adaptors/adaptor_test_support.hpp"
#include "gpumem/adaptors/limiting.hpp"
#include "gpumem/adaptors/oom_retry.hpp"

namespace gpumem::test {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

// A cache of blocks a program keeps around and can give up when memory is short.
struct block_cache {
  memory_resource& mr;
  std::vector<void*> blocks;
  int spilled = 0;
  bool spill_one() {
    if (blocks.empty()) return false;
    mr.deallocate(blocks.back(), MiB, stream_view{});
    blocks.pop_back();
    ++spilled;
    return true;
  }
};

TEST(OomRetryAdaptor, CallbacksFreeMemoryAndTheAllocationSucceeds) {
  oom_retry_adaptor mr(std::make_shared<limiting_adaptor>(std::make_shared<cuda_resource>(0), 4 * MiB));
  block_cache cache{mr, {}};
  for (int i = 0; i < 4; ++i) cache.blocks.push_back(mr.allocate(MiB, stream_view{}));
  std::vector<int> attempts;
  mr.add_callback([&](const oom_event& e) {
    attempts.push_back(e.attempt);
    EXPECT_EQ(e.bytes, 2 * MiB + 5);
    EXPECT_EQ(e.error.requested_bytes(), 2 * MiB + 5);
    return cache.spill_one();  // one block per call: the first retry still fails
  });
  void* p = mr.allocate(2 * MiB + 5, stream_view{});
  EXPECT_EQ(attempts, (std::vector<int>{1, 2, 3})) << "retried until enough was spilled";
  EXPECT_EQ(cache.spilled, 3);
  mr.deallocate(p, 2 * MiB + 5, stream_view{});
  while (cache.spill_one()) {
  }
}

TEST(OomRetryAdaptor, CallbacksAreAskedInOrderUntilOneWantsARetry) {
  oom_retry_adaptor mr(std::make_shared<limiting_adaptor>(std::make_shared<cuda_resource>(0), MiB));
  std::vector<std::string> calls;
  mr.add_callback([&](const oom_event&) { calls.push_back("first"); return false; });
  const auto second = mr.add_callback([&](const oom_event& e) { calls.push_back("second"); return e.attempt < 3; });
  mr.add_callback([&](const oom_event&) { calls.push_back("third"); return false; });
  EXPECT_THROW(mr.allocate(2 * MiB, stream_view{}), out_of_memory);
  EXPECT_EQ(calls, (std::vector<std::string>{"first", "second", "first", "second", "first", "second", "third"}));
  calls.clear();
  EXPECT_TRUE(mr.remove_callback(second));
  EXPECT_FALSE(mr.remove_callback(second));
  EXPECT_THROW(mr.allocate(2 * MiB, stream_view{}), out_of_memory);
  EXPECT_EQ(calls, (std::vector<std::string>{"first", "third"}));
  EXPECT_THROW(mr.add_callback(nullptr), logic_error);
}

TEST(OomRetryAdaptor, RetriesStopAtTheLimit) {
  oom_retry_adaptor mr(std::make_shared<limiting_adaptor>(std::make_shared<cuda_resource>(0), MiB), 5);
  int calls = 0;
  mr.add_callback([&](const oom_event&) { ++calls; return true; });  // always asks again
  EXPECT_THROW(mr.allocate(2 * MiB, stream_view{}), out_of_memory);
  EXPECT_EQ(calls, 5);
  EXPECT_EQ(mr.max_retries(), 5);
  EXPECT_THROW(oom_retry_adaptor(std::make_shared<cuda_resource>(0), -1), logic_error);
}

TEST(OomRetryAdaptor, OtherErrorsAreNotRetried) {
  auto up = std::make_shared<scripted_resource>(0);
  oom_retry_adaptor mr(up);
  int calls = 0;
  mr.add_callback([&](const oom_event&) { ++calls; return true; });
  up->allocations_throw_cuda_error = true;
  EXPECT_THROW(mr.allocate(MiB, stream_view{}), cuda_error);
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(up->allocations.load(), 1);
}

TEST(OomRetryAdaptor, ACallbackMayAllocateThroughTheSameAdaptor) {
  oom_retry_adaptor mr(std::make_shared<limiting_adaptor>(std::make_shared<cuda_resource>(0), 2 * MiB));
  void* hog = mr.allocate(2 * MiB, stream_view{});
  mr.add_callback([&](const oom_event& e) {
    if (hog == nullptr || e.bytes != MiB) return false;
    mr.deallocate(hog, 2 * MiB, stream_view{});
    hog = nullptr;
    void* small = mr.allocate(256, stream_view{});  // no lock of the adaptor is held here
    mr.deallocate(small, 256, stream_view{});
    return true;
  });
  void* p = mr.allocate(MiB, stream_view{});
  EXPECT_EQ(hog, nullptr);
  mr.deallocate(p, MiB, stream_view{});
}

}  // namespace
}  // namespace gpumem::test
