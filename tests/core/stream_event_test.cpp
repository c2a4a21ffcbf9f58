// Streams and events through gpumem's RAII types, on the selected backend.
#include <gtest/gtest.h>

#include <chrono>

#include "gpumem/cuda_resource.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/event.hpp"
#include "gpumem/stream.hpp"
#include "support/touch.hpp"

namespace gpumem::test {
namespace {

TEST(Stream, BelongsToItsDevice) {
  for (int d = 0; d < device_count(); ++d) {
    stream s(d);
    EXPECT_EQ(s.device(), d);
    EXPECT_EQ(s.view().device(), d);
    EXPECT_TRUE(s.ready());
  }
}

TEST(Stream, BadDeviceIsALogicError) {
  EXPECT_THROW(stream{device_count()}, logic_error);
  EXPECT_THROW(stream{-2}, logic_error);  // -1 means the current device; -2 is nothing
  EXPECT_THROW(event{device_count()}, logic_error);
}

TEST(Stream, MovedFromStreamOwnsNothing) {
  stream a(0);
  CUstream h = a.handle();
  stream b(std::move(a));
  EXPECT_EQ(b.handle(), h);
  EXPECT_EQ(a.handle(), nullptr);  // NOLINT(bugprone-use-after-move): checking the moved-from state
  stream c(0);
  c = std::move(b);
  EXPECT_EQ(c.handle(), h);
  c.synchronize();
}

TEST(Stream, WorkIsNotDoneUntilItIs) {
  cuda_resource mr(0);
  stream s(0);
  void* p = mr.allocate(1 << 20, s);
  held_check check(p, 1 << 20, 0x11, std::chrono::milliseconds(100), s);
  EXPECT_FALSE(s.ready());  // the device is busy for 100 ms
  s.synchronize();
  EXPECT_TRUE(s.ready());
  EXPECT_EQ(check.mismatches(), 0U);
  mr.deallocate(p, 1 << 20, s);
}

TEST(Event, OrdersWorkAcrossStreams) {
  // A writes 0xAA after a delay and records an event; B waits on the event and
  // then checks for 0xAA: without the wait B would run first and see 0x00.
  cuda_resource mr(0);
  stream a(0);
  stream b(0);
  constexpr std::size_t bytes = 1 << 16;
  void* p = mr.allocate(bytes, a);
  device_fill(p, bytes, 0x00, a);
  a.synchronize();
  held_check writer(p, bytes, 0xAA, std::chrono::milliseconds(100), a);
  event done(0);
  done.record(a);
  EXPECT_FALSE(done.ready());
  b.wait(done);
  EXPECT_EQ(device_count_mismatches(p, bytes, 0xAA, b), 0U);
  EXPECT_TRUE(done.ready());
  EXPECT_EQ(writer.mismatches(), 0U);
  mr.deallocate(p, bytes, a);
}

TEST(Event, NeverRecordedIsReady) {
  event e(0);
  EXPECT_TRUE(e.ready());
  e.synchronize();
}

TEST(Event, ElapsedTimeNeedsTimingAndCompletion) {
  cuda_resource mr(0);
  stream s(0);
  event start(0, true);
  event end(0, true);
  void* p = mr.allocate(4096, s);
  start.record(s);
  held_check busy(p, 4096, 0x01, std::chrono::milliseconds(50), s);
  end.record(s);
  end.synchronize();
  const float ms = event::elapsed_ms(start, end);
  EXPECT_GE(ms, 45.0F);
  EXPECT_LT(ms, 5000.0F);
  event untimed(0, false);
  untimed.record(s);
  untimed.synchronize();
  EXPECT_THROW(event::elapsed_ms(start, untimed), cuda_error);
  EXPECT_EQ(busy.mismatches(), 0U);
  mr.deallocate(p, 4096, s);
}

TEST(Device, CurrentDeviceFollowsSetCurrentDevice) {
  const int before = current_device();
  for (int d = 0; d < device_count(); ++d) {
    set_current_device(d);
    EXPECT_EQ(current_device(), d);
  }
  EXPECT_THROW(set_current_device(device_count()), logic_error);
  set_current_device(before);
}

TEST(Device, MemoryInfoIsConsistent) {
  const memory_info info = device_memory_info(0);
  EXPECT_GT(info.total_bytes, 0U);
  EXPECT_LE(info.free_bytes, info.total_bytes);
  EXPECT_FALSE(device_name(0).empty());
  EXPECT_GE(driver_version(), 12080);
  EXPECT_THROW(device_memory_info(-1), logic_error);
}

}  // namespace
}  // namespace gpumem::test
