// Simulator: events (record, query, synchronize, elapsed time) and
// cuStreamWaitEvent ordering across streams.
#include <atomic>

#include "sim_test_support.hpp"

namespace gpumem::sim_test {
namespace {

class sim_event_test : public sim_test {
 protected:
  void SetUp() override {
    sim_test::SetUp();
    ASSERT_EQ(cu().cuStreamCreate(&a_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    ASSERT_EQ(cu().cuStreamCreate(&b_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  }
  void TearDown() override {
    EXPECT_EQ(cu().cuStreamDestroy(a_), CUDA_SUCCESS);
    EXPECT_EQ(cu().cuStreamDestroy(b_), CUDA_SUCCESS);
    sim_test::TearDown();
  }
  static CUevent make_event(unsigned int flags = CU_EVENT_DEFAULT) {
    CUevent e = nullptr;
    EXPECT_EQ(cu().cuEventCreate(&e, flags), CUDA_SUCCESS);
    return e;
  }

  CUstream a_ = nullptr;
  CUstream b_ = nullptr;
};

TEST_F(sim_event_test, create_flags) {
  CUevent e = nullptr;
  EXPECT_EQ(cu().cuEventCreate(&e, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuEventCreate(&e, 0x80), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuEventCreate(nullptr, CU_EVENT_DEFAULT), CUDA_ERROR_INVALID_VALUE);
  for (unsigned int flags : {0u, 1u * CU_EVENT_BLOCKING_SYNC, 1u * CU_EVENT_DISABLE_TIMING,
                             1u * (CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING)}) {
    ASSERT_EQ(cu().cuEventCreate(&e, flags), CUDA_SUCCESS) << flags;
    EXPECT_EQ(cu().cuEventDestroy(e), CUDA_SUCCESS);
  }
}

TEST_F(sim_event_test, query_and_synchronize_follow_the_recorded_work) {
  CUevent e = make_event();
  EXPECT_EQ(cu().cuEventQuery(e), CUDA_SUCCESS);        // never recorded: complete
  EXPECT_EQ(cu().cuEventSynchronize(e), CUDA_SUCCESS);  // and does not block
  gate& g = new_gate();
  std::atomic<bool> ran{false};
  ASSERT_EQ(launch(a_, [&] { g.wait(); ran = true; }), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuEventRecord(e, a_), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuEventQuery(e), CUDA_ERROR_NOT_READY);
  g.open();
  ASSERT_EQ(cu().cuEventSynchronize(e), CUDA_SUCCESS);
  EXPECT_TRUE(ran);
  EXPECT_EQ(cu().cuEventQuery(e), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuEventDestroy(e), CUDA_SUCCESS);
}

TEST_F(sim_event_test, record_captures_only_work_queued_before_it) {
  CUevent e = make_event();
  gate& g = new_gate();
  ASSERT_EQ(cu().cuEventRecord(e, a_), CUDA_SUCCESS);
  ASSERT_EQ(launch(a_, [&] { g.wait(); }), CUDA_SUCCESS);  // after the record
  ASSERT_EQ(cu().cuEventSynchronize(e), CUDA_SUCCESS);     // does not wait for the gate
  EXPECT_EQ(cu().cuStreamQuery(a_), CUDA_ERROR_NOT_READY);
  g.open();
  EXPECT_EQ(cu().cuEventDestroy(e), CUDA_SUCCESS);
}

TEST_F(sim_event_test, elapsed_time_measures_the_work_between_records) {
  CUevent start = make_event();
  CUevent end = make_event();
  ASSERT_EQ(cu().cuEventRecord(start, a_), CUDA_SUCCESS);
  ASSERT_EQ(launch(a_, [] { std::this_thread::sleep_for(30ms); }), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuEventRecord(end, a_), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuEventSynchronize(end), CUDA_SUCCESS);
  float ms = -1.0f;
  ASSERT_EQ(cu().cuEventElapsedTime(&ms, start, end), CUDA_SUCCESS);
  EXPECT_GE(ms, 29.0f);
  EXPECT_LT(ms, 10000.0f);
  EXPECT_EQ(cu().cuEventDestroy(start), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuEventDestroy(end), CUDA_SUCCESS);
}

TEST_F(sim_event_test, elapsed_time_errors) {
  CUevent recorded = make_event();
  CUevent never_recorded = make_event();
  CUevent untimed = make_event(CU_EVENT_DISABLE_TIMING);
  CUevent pending = make_event();
  ASSERT_EQ(cu().cuEventRecord(recorded, a_), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuEventRecord(untimed, a_), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamSynchronize(a_), CUDA_SUCCESS);
  gate& g = new_gate();
  ASSERT_EQ(launch(b_, [&] { g.wait(); }), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuEventRecord(pending, b_), CUDA_SUCCESS);

  float ms = 0;
  EXPECT_EQ(cu().cuEventElapsedTime(&ms, recorded, never_recorded), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu().cuEventElapsedTime(&ms, never_recorded, recorded), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu().cuEventElapsedTime(&ms, recorded, untimed), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu().cuEventElapsedTime(&ms, recorded, pending), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(cu().cuEventElapsedTime(nullptr, recorded, recorded), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuEventElapsedTime(&ms, recorded, recorded), CUDA_SUCCESS);
  EXPECT_EQ(ms, 0.0f);
  g.open();
  ASSERT_EQ(cu().cuEventSynchronize(pending), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuEventElapsedTime(&ms, recorded, pending), CUDA_SUCCESS);
  for (CUevent e : {recorded, never_recorded, untimed, pending}) EXPECT_EQ(cu().cuEventDestroy(e), CUDA_SUCCESS);
}

TEST_F(sim_event_test, stream_wait_event_orders_work_across_streams) {
  CUevent e = make_event(CU_EVENT_DISABLE_TIMING);
  int written = 0;
  int seen = -1;
  ASSERT_EQ(launch(a_, [&] { std::this_thread::sleep_for(50ms); written = 1; }), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuEventRecord(e, a_), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamWaitEvent(b_, e, 0), CUDA_SUCCESS);  // returns without waiting
  ASSERT_EQ(launch(b_, [&] { seen = written; }), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamSynchronize(b_), CUDA_SUCCESS);
  EXPECT_EQ(seen, 1);
  EXPECT_EQ(cu().cuEventDestroy(e), CUDA_SUCCESS);
}

TEST_F(sim_event_test, stream_wait_event_does_not_block_the_host) {
  CUevent e = make_event();
  gate& g = new_gate();
  ASSERT_EQ(launch(a_, [&] { g.wait(); }), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuEventRecord(e, a_), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamWaitEvent(b_, e, 0), CUDA_SUCCESS);
  std::atomic<bool> b_ran{false};
  ASSERT_EQ(launch(b_, [&] { b_ran = true; }), CUDA_SUCCESS);
  std::this_thread::sleep_for(settle_time);
  EXPECT_FALSE(b_ran);
  EXPECT_EQ(cu().cuStreamQuery(b_), CUDA_ERROR_NOT_READY);
  g.open();
  ASSERT_EQ(cu().cuStreamSynchronize(b_), CUDA_SUCCESS);
  EXPECT_TRUE(b_ran);
  EXPECT_EQ(cu().cuEventDestroy(e), CUDA_SUCCESS);
}

TEST_F(sim_event_test, stream_wait_event_uses_the_record_at_the_time_of_the_call) {
  CUevent e = make_event();
  gate& g = new_gate();
  ASSERT_EQ(cu().cuEventRecord(e, a_), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamSynchronize(a_), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamWaitEvent(b_, e, 0), CUDA_SUCCESS);  // waits for a completed record
  ASSERT_EQ(launch(a_, [&] { g.wait(); }), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuEventRecord(e, a_), CUDA_SUCCESS);  // a later record does not move the wait
  std::atomic<bool> b_ran{false};
  ASSERT_EQ(launch(b_, [&] { b_ran = true; }), CUDA_SUCCESS);
  EXPECT_TRUE(eventually([&] { return b_ran.load(); }));
  g.open();
  EXPECT_EQ(cu().cuEventDestroy(e), CUDA_SUCCESS);
}

TEST_F(sim_event_test, waiting_on_a_never_recorded_event_is_a_no_op) {
  CUevent e = make_event();
  ASSERT_EQ(cu().cuStreamWaitEvent(b_, e, 0), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuStreamQuery(b_), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuStreamWaitEvent(b_, e, CU_EVENT_WAIT_EXTERNAL), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuEventDestroy(e), CUDA_SUCCESS);
}

TEST_F(sim_event_test, destroying_an_event_with_a_pending_record) {
  CUevent e = make_event();
  gate& g = new_gate();
  ASSERT_EQ(launch(a_, [&] { g.wait(); }), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuEventRecord(e, a_), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuEventDestroy(e), CUDA_SUCCESS);  // the record still completes
  EXPECT_EQ(cu().cuEventQuery(e), CUDA_ERROR_INVALID_HANDLE);
  g.open();
  EXPECT_EQ(cu().cuStreamSynchronize(a_), CUDA_SUCCESS);
}

TEST_F(sim_event_test, invalid_handles) {
  int not_an_event = 0;
  auto bogus = reinterpret_cast<CUevent>(&not_an_event);
  float ms = 0;
  CUevent good = make_event();
  EXPECT_EQ(cu().cuEventQuery(bogus), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu().cuEventSynchronize(bogus), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu().cuEventRecord(bogus, a_), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu().cuEventDestroy(bogus), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu().cuEventDestroy(nullptr), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu().cuEventElapsedTime(&ms, bogus, good), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu().cuStreamWaitEvent(a_, bogus, 0), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu().cuStreamWaitEvent(a_, nullptr, 0), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu().cuEventRecord(good, reinterpret_cast<CUstream>(&not_an_event)), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu().cuEventDestroy(good), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuEventDestroy(good), CUDA_ERROR_INVALID_HANDLE);
}

TEST_F(sim_event_test, event_and_stream_of_different_devices) {
  CUevent on_device1 = nullptr;
  {
    current_device d1(1);
    on_device1 = make_event();
  }
  EXPECT_EQ(cu().cuEventRecord(on_device1, a_), CUDA_ERROR_INVALID_HANDLE);
  // Waiting on an event of another device is allowed, as in CUDA.
  {
    current_device d1(1);
    ASSERT_EQ(cu().cuEventRecord(on_device1, nullptr), CUDA_SUCCESS);
  }
  EXPECT_EQ(cu().cuStreamWaitEvent(a_, on_device1, 0), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuStreamSynchronize(a_), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuEventDestroy(on_device1), CUDA_SUCCESS);
}

TEST_F(sim_event_test, record_on_the_legacy_stream_captures_blocking_streams) {
  CUstream blocking = nullptr;
  ASSERT_EQ(cu().cuStreamCreate(&blocking, CU_STREAM_DEFAULT), CUDA_SUCCESS);
  CUevent e = make_event();
  gate& g = new_gate();
  ASSERT_EQ(launch(blocking, [&] { g.wait(); }), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuEventRecord(e, nullptr), CUDA_SUCCESS);
  std::this_thread::sleep_for(settle_time);
  EXPECT_EQ(cu().cuEventQuery(e), CUDA_ERROR_NOT_READY);
  g.open();
  EXPECT_EQ(cu().cuEventSynchronize(e), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuEventDestroy(e), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuStreamDestroy(blocking), CUDA_SUCCESS);
}

}  // namespace
}  // namespace gpumem::sim_test
