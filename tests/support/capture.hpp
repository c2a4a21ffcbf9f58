// Stream capture for the pools' capture tests (Note [Pools and stream capture] in
// src/stream_device.hpp): beginning and ending one, and what a pool must do while
// one is in progress.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "driver/driver.hpp"
#include "gpumem/error.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/stream.hpp"

namespace gpumem::test {

inline void begin_capture(stream_view s) {
  // Relaxed: the test thread may still make other driver calls (cuMemAlloc) meanwhile.
  GPUMEM_CU(cuStreamBeginCapture, s.handle(), CU_STREAM_CAPTURE_MODE_RELAXED);
}

// Throws if the capture was invalidated.
inline void end_capture(stream_view s) {
  CUgraph g = nullptr;
  GPUMEM_CU(cuStreamEndCapture, s.handle(), &g);
  GPUMEM_CU(cuGraphDestroy, g);
}

// A capture for a scope, or until end().
struct capture_on {
  explicit capture_on(stream_view st) : s(st.handle()) { begin_capture(s); }
  ~capture_on() { end(); }
  void end() {
    if (s == nullptr) return;
    end_capture(s);
    s = nullptr;
  }
  CUstream s;
};

// While `s` is captured, `pool` refuses allocate and deallocate on it with a clear
// error, serves another stream, and is intact afterwards.
inline void expect_capture_refused(pool_resource& pool, stream& s) {
  stream other(0);
  void* before = pool.allocate(1000, s);
  {
    capture_on capture(s);
    try {
      (void)pool.allocate(1000, s);
      ADD_FAILURE() << "allocate on a capturing stream did not throw";
    } catch (const logic_error& e) {
      EXPECT_NE(std::string(e.what()).find("captured into a CUDA graph"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("async_resource"), std::string::npos) << e.what();
    }
    EXPECT_THROW(pool.deallocate(before, 1000, s), logic_error);
    // Another stream, not captured, is served meanwhile (asked, for a watching pool).
    void* elsewhere = pool.allocate(4096, other);
    pool.deallocate(elsewhere, 4096, other);
    capture.end();
  }
  EXPECT_EQ(pool.statistics().allocations, 1U) << "the refused free left the block allocated";
  pool.deallocate(before, 1000, s);
  void* after = pool.allocate(1000, s);
  pool.deallocate(after, 1000, s);
  s.synchronize();
  other.synchronize();
  EXPECT_EQ(pool.statistics().allocations, 0U);
}

}  // namespace gpumem::test
