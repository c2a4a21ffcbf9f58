// thread_safe_adaptor: a resource that is not thread-safe sees one call at a time.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "adaptors/adaptor_test_support.hpp"
#include "gpumem/adaptors/thread_safe.hpp"

namespace gpumem::test {
namespace {

void hammer(memory_resource& mr, int threads) {
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      for (int i = 0; i < 40; ++i) {
        void* p = mr.allocate(512, stream_view{});
        mr.deallocate(p, 512, stream_view{});
      }
    });
  }
  for (auto& w : workers) w.join();
}

TEST(ThreadSafeAdaptor, TheUpstreamSeesOneCallAtATime) {
  auto up = std::make_shared<scripted_resource>(0);
  up->dwell = std::chrono::microseconds(50);
  // Without the adaptor, the detector does see overlapping calls.
  hammer(*up, 4);
  EXPECT_GT(up->overlapping_calls.load(), 0) << "the detector works";
  up->overlapping_calls = 0;
  thread_safe_adaptor mr(up);
  EXPECT_FALSE(up->properties().thread_safe);
  EXPECT_TRUE(mr.properties().thread_safe);
  EXPECT_EQ(mr.properties().device, 0);
  hammer(mr, 4);
  EXPECT_EQ(up->overlapping_calls.load(), 0);
  EXPECT_EQ(up->live_count(), 0U);
  EXPECT_THROW(thread_safe_adaptor(std::shared_ptr<memory_resource>{}), logic_error);
}

}  // namespace
}  // namespace gpumem::test
