// Touching memory from the device, in stream order: CUDA kernels on a GPU (when
// the tests were built with nvcc), host functions on the simulator, and the
// driver's memset/memcpy on a GPU build without kernels. Tests use these to
// prove memory is usable by device work and that frees are stream-ordered.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "gpumem/stream.hpp"

namespace gpumem::test {

// How device work is issued in this run: "kernels", "host functions" or "driver copies".
const char* touch_method();

// Takes, while the devices are still empty, what device_count_mismatches needs
// on the device, so that a check still runs after a test has filled a device
// through the pool under test. The tests' main calls it once.
void reserve_check_memory();

// Every byte of [ptr, ptr + bytes) := value, queued on `s`.
void device_fill(void* ptr, std::size_t bytes, std::uint8_t value, stream_view s);

// Bytes of [ptr, ptr + bytes) that differ from `value`, counted by work queued
// on `s`; waits for the stream.
std::size_t device_count_mismatches(const void* ptr, std::size_t bytes, std::uint8_t value,
                                    stream_view s);

// For death tests of faults on a GPU: a fault is sticky for the faulting
// device's context, so the work runs in the test's child process, which exits
// with `device_work_failed` if `work` threw (printing what() to stderr, for the
// test's regex) and with 0 if it returned.
inline constexpr int device_work_failed = 3;
[[noreturn]] void exit_with_outcome_of(const std::function<void()>& work);

// Queued on `s`: fill with `value`, keep the device busy for `hold`, then count
// the bytes no longer equal to `value`. If the allocator handed the memory to
// other work before this finished, the count is non-zero.
class held_check {
 public:
  held_check(void* ptr, std::size_t bytes, std::uint8_t value, std::chrono::milliseconds hold,
             stream_view s);
  ~held_check();
  held_check(const held_check&) = delete;
  held_check& operator=(const held_check&) = delete;
  // Waits for the check's stream and returns the mismatch count.
  std::size_t mismatches();

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace gpumem::test
