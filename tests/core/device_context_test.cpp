// The calling thread's context: current_context_device and adopt_primary_context
// (include/gpumem/device.hpp). Threads start with no current context, on the real
// driver and on the simulator alike.
#include <gtest/gtest.h>

#include <optional>
#include <thread>

#include "driver/driver.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"

namespace gpumem::test {
namespace {

TEST(DeviceContext, ANewThreadHasNoneAndAdoptsThePrimaryContextOnce) {
  const int last = device_count() - 1;
  std::thread([&] {
    EXPECT_EQ(current_context_device(), std::nullopt);
    EXPECT_TRUE(adopt_primary_context(last));
    EXPECT_EQ(current_context_device(), std::optional<int>(last));
    EXPECT_EQ(current_device(), last);
    // A thread with a current context keeps it, whichever device is asked for.
    EXPECT_FALSE(adopt_primary_context(0));
    EXPECT_EQ(current_context_device(), std::optional<int>(last));
  }).join();
}

TEST(DeviceContext, SetCurrentDeviceIsWhatCurrentContextDeviceReports) {
  std::thread([] {
    set_current_device(0);
    EXPECT_EQ(current_context_device(), std::optional<int>(0));
  }).join();
}

// current_device names a primary context's device without asking the driver when
// gpumem retained it, and asks otherwise: the same answer either way.
TEST(DeviceContext, CurrentDeviceOfEveryPrimaryContext) {
  for (int d = 0; d < device_count(); ++d) {
    std::thread([d] {
      CUdevice dev{};
      ASSERT_EQ(detail::driver().cuDeviceGet(&dev, d), CUDA_SUCCESS);
      CUcontext ctx = nullptr;
      // Retained for the process, as gpumem retains them (the table has no release).
      ASSERT_EQ(detail::driver().cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
      ASSERT_EQ(detail::driver().cuCtxSetCurrent(ctx), CUDA_SUCCESS);
      EXPECT_EQ(current_device(), d);
      EXPECT_EQ(current_context_device(), std::optional<int>(d));
      set_current_device(d);  // through gpumem's retained handle
      EXPECT_EQ(current_device(), d);
      ASSERT_EQ(detail::driver().cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
    }).join();
  }
}

TEST(DeviceContext, AnUnknownDeviceIsRefusedAndNothingChanges) {
  std::thread([] {
    EXPECT_THROW(adopt_primary_context(device_count()), logic_error);
    EXPECT_THROW(adopt_primary_context(-1), logic_error);
    EXPECT_EQ(current_context_device(), std::nullopt);
  }).join();
}

}  // namespace
}  // namespace gpumem::test
