// Per-device current resource.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "gpumem/cuda_resource.hpp"
#include "gpumem/current_resource.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/vmm_pool_resource.hpp"
#include "support/touch.hpp"

namespace gpumem::test {
namespace {

TEST(CurrentResource, DefaultIsThePagedPoolOfTheDevice) {
  auto r = get_current_resource(0);
  ASSERT_NE(r, nullptr);
  EXPECT_NE(dynamic_cast<vmm_pool_resource*>(r.get()), nullptr) << "make_default_resource: the frugal pool";
  EXPECT_EQ(r->properties().device, 0);
  EXPECT_EQ(get_current_resource(0), r) << "made once";
  stream s(0);
  void* p = r->allocate(1000, s);
  device_fill(p, 1000, 9, s);
  EXPECT_EQ(device_count_mismatches(p, 1000, 9, s), 0U);
  r->deallocate(p, 1000, s);
}

TEST(CurrentResource, SetReturnsThePreviousAndNullRestoresTheDefault) {
  auto before = get_current_resource(0);  // made now if this is the first use
  auto mine = std::make_shared<cuda_resource>(0);
  EXPECT_EQ(set_current_resource(0, mine), before);
  EXPECT_EQ(get_current_resource(0), mine);
  auto back = set_current_resource(0, before);
  EXPECT_EQ(back, mine);
  EXPECT_EQ(get_current_resource(0), before);
  set_current_resource(0, nullptr);
  auto fresh = get_current_resource(0);
  EXPECT_NE(fresh, nullptr);
  EXPECT_NE(fresh, mine);
}

TEST(CurrentResource, PerDeviceAndChecked) {
  EXPECT_THROW(get_current_resource(device_count()), logic_error);
  EXPECT_THROW(set_current_resource(-5, nullptr), logic_error);
  if (device_count() < 2) GTEST_SKIP() << "needs two devices";
  EXPECT_THROW(set_current_resource(1, std::make_shared<cuda_resource>(0)), logic_error);
  EXPECT_EQ(get_current_resource(1)->properties().device, 1);
  EXPECT_NE(get_current_resource(1), get_current_resource(0));
}

// Each thread remembers its last answer; a set on any thread makes it stale, and
// a remembered resource that was replaced is not kept alive by the memory.
TEST(CurrentResource, ASetOnAnotherThreadIsSeenAtTheNextGet) {
  auto first = std::make_shared<cuda_resource>(0);
  auto second = std::make_shared<cuda_resource>(0);
  set_current_resource(0, first);
  EXPECT_EQ(get_current_resource(0), first);  // remembered here
  std::thread([&] { set_current_resource(0, second); }).join();
  EXPECT_EQ(get_current_resource(0), second);
  std::weak_ptr<memory_resource> gone = second;
  std::thread([&] { set_current_resource(0, first); }).join();
  second.reset();
  EXPECT_TRUE(gone.expired());
  EXPECT_EQ(get_current_resource(0), first);
  set_current_resource(0, nullptr);
}

TEST(CurrentResource, ConcurrentGetAndSet) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([t] {
      stream s(0);
      for (int i = 0; i < 200; ++i) {
        if (t == 0 && i % 20 == 0) set_current_resource(0, std::make_shared<cuda_resource>(0));
        auto r = get_current_resource(0);
        void* p = r->allocate(512, s);
        r->deallocate(p, 512, s);
      }
      s.synchronize();
    });
  }
  for (auto& th : threads) th.join();
  set_current_resource(0, nullptr);
}

}  // namespace
}  // namespace gpumem::test
