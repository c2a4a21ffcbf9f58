// Helpers for the simulator's own tests: the driver table, a current device for
// the scope, host functions from lambdas, and gates that host functions wait on.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "driver/driver.hpp"
#include "gpumem/backend.hpp"
#include "gpumem/error.hpp"
#include "gpumem/sim.hpp"

namespace gpumem::sim_test {

using namespace std::chrono_literals;

// Long enough never to fire on a loaded machine, short enough that a broken
// ordering fails the test instead of hanging it.
inline constexpr auto generous_timeout = 10s;
// How long a test watches for something that must NOT happen.
inline constexpr auto settle_time = 100ms;

inline const detail::driver_api& cu() { return detail::driver(); }

inline CUcontext primary_context_of(int device) {
  CUdevice dev{};
  CUcontext ctx = nullptr;
  EXPECT_EQ(cu().cuDeviceGet(&dev, device), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
  return ctx;
}

// Makes `device`'s primary context current on this thread for the scope.
class current_device {
 public:
  explicit current_device(int device) {
    EXPECT_EQ(cu().cuCtxGetCurrent(&previous_), CUDA_SUCCESS);
    EXPECT_EQ(cu().cuCtxSetCurrent(primary_context_of(device)), CUDA_SUCCESS);
  }
  ~current_device() { EXPECT_EQ(cu().cuCtxSetCurrent(previous_), CUDA_SUCCESS); }
  current_device(const current_device&) = delete;
  current_device& operator=(const current_device&) = delete;

 private:
  CUcontext previous_ = nullptr;
};

// Queues a lambda as a host function (cuLaunchHostFunc).
inline CUresult launch(CUstream stream, std::function<void()> fn) {
  auto* heap = new std::function<void()>(std::move(fn));
  CUresult r = cu().cuLaunchHostFunc(
      stream,
      [](void* p) {
        auto* f = static_cast<std::function<void()>*>(p);
        (*f)();
        delete f;
      },
      heap);
  if (r != CUDA_SUCCESS) delete heap;
  return r;
}

// Something host functions wait on, so a test controls when a stream proceeds.
// Waits are bounded: a stream that never opens fails the test, not the run.
// Get gates from sim_test::new_gate(), which outlive the streams' work.
class gate {
 public:
  gate() = default;
  gate(const gate&) = delete;
  gate& operator=(const gate&) = delete;
  ~gate() {
    open();
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return waiters_ == 0; });
  }
  void open() {
    {
      std::lock_guard lock(mutex_);
      open_ = true;
    }
    changed_.notify_all();
  }
  bool wait() {
    std::unique_lock lock(mutex_);
    ++waiters_;
    const bool opened = changed_.wait_for(lock, generous_timeout, [&] { return open_; });
    --waiters_;
    changed_.notify_all();
    return opened;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool open_ = false;
  int waiters_ = 0;
};

// Polls `condition` until it holds or the generous timeout passes.
inline bool eventually(const std::function<bool()>& condition) {
  const auto deadline = std::chrono::steady_clock::now() + generous_timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// Every simulator test: the simulator is the backend, device 0 is current, and
// afterwards every gate is open, every device's work is done and fault
// injection is off again.
class sim_test : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cu().kind, backend_kind::sim) << "gpumem_sim_tests must run with GPUMEM_BACKEND=sim";
    device0_.emplace(0);
  }
  void TearDown() override {
    sim::fail_nth_allocation(0);
    sim::fail_allocations_at_random(0.0, 1);
    for (gate& g : gates_) g.open();
    int devices = 0;
    ASSERT_EQ(cu().cuDeviceGetCount(&devices), CUDA_SUCCESS);
    for (int d = 0; d < devices; ++d) {
      current_device current(d);
      EXPECT_EQ(cu().cuCtxSynchronize(), CUDA_SUCCESS);
    }
    device0_.reset();
  }

  // A gate that lives until the test's work is done.
  gate& new_gate() { return gates_.emplace_back(); }

  // Device allocations are page-granular.
  static constexpr std::size_t page = 4096;

 private:
  std::optional<current_device> device0_;
  std::deque<gate> gates_;
};

}  // namespace gpumem::sim_test
