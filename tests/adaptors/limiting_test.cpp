// limiting_adaptor: a hard cap with a clear error, rounding, rollback, threads.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "adaptors/adaptor_test_support.hpp"
#include "gpumem/adaptors/limiting.hpp"
#include "gpumem/backend.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/sim.hpp"

namespace gpumem::test {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

TEST(LimitingAdaptor, TheCapIsHardAndTheErrorSaysSo) {
  auto up = std::make_shared<scripted_resource>(0);
  limiting_adaptor mr(up, 4 * MiB);
  stream s(0);
  void* a = mr.allocate(3 * MiB, s);
  const int upstream_calls = up->allocations;
  try {
    mr.allocate(MiB + 1, s);
    ADD_FAILURE() << "allocated past the limit";
  } catch (const out_of_memory& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.requested_bytes(), MiB + 1);
    EXPECT_EQ(e.info().resource, "limiting_adaptor");
    EXPECT_EQ(e.info().resource_held_bytes, 3 * MiB);
    EXPECT_NE(what.find("limit of 4194304 bytes"), std::string::npos) << what;
    EXPECT_NE(what.find("3145728 bytes are in use"), std::string::npos) << what;
  }
  EXPECT_EQ(up->allocations.load(), upstream_calls) << "the upstream is not asked";
  void* b = mr.allocate(MiB, s);  // exactly to the limit
  EXPECT_EQ(mr.used_bytes(), 4 * MiB);
  EXPECT_THROW(mr.allocate(1, s), out_of_memory);
  mr.deallocate(a, 3 * MiB, s);
  EXPECT_EQ(mr.used_bytes(), MiB);
  void* c = mr.allocate(3 * MiB, s);
  mr.deallocate(b, MiB, s);
  mr.deallocate(c, 3 * MiB, s);
  EXPECT_EQ(mr.used_bytes(), 0U);
  EXPECT_THROW(mr.allocate(5 * MiB, s), out_of_memory) << "larger than the limit itself";
}

TEST(LimitingAdaptor, CountsRequestsRoundedTo256Bytes) {
  limiting_adaptor mr(std::make_shared<cuda_resource>(0), 1024);
  void* a = mr.allocate(1, stream_view{});
  EXPECT_EQ(mr.used_bytes(), 256U);
  void* b = mr.allocate(513, stream_view{});
  EXPECT_EQ(mr.used_bytes(), 256U + 768U);
  EXPECT_THROW(mr.allocate(1, stream_view{}), out_of_memory);
  mr.deallocate(a, 1, stream_view{});
  mr.deallocate(b, 513, stream_view{});
  EXPECT_EQ(mr.used_bytes(), 0U);
}

TEST(LimitingAdaptor, UpstreamFailuresAndRejectedFreesLeaveTheCountAlone) {
  auto up = std::make_shared<scripted_resource>(0);
  limiting_adaptor mr(up, 8 * MiB);
  up->allocations_throw_cuda_error = true;
  EXPECT_THROW(mr.allocate(MiB, stream_view{}), cuda_error);
  EXPECT_EQ(mr.used_bytes(), 0U);
  up->allocations_throw_cuda_error = false;
  if (current_backend() == backend_kind::sim) {
    sim::fail_nth_allocation(1);
    EXPECT_THROW(mr.allocate(MiB, stream_view{}), out_of_memory);
    EXPECT_EQ(mr.used_bytes(), 0U);
  }
  void* p = mr.allocate(MiB, stream_view{});
  int on_stack = 0;
  EXPECT_THROW(mr.deallocate(&on_stack, 256, stream_view{}), logic_error);
  EXPECT_THROW(mr.deallocate(p, MiB - 1, stream_view{}), logic_error);
  EXPECT_EQ(mr.used_bytes(), MiB);
  mr.deallocate(p, MiB, stream_view{});
  EXPECT_EQ(mr.used_bytes(), 0U);
  EXPECT_THROW(limiting_adaptor(up, 0), logic_error);
  EXPECT_THROW(limiting_adaptor(std::shared_ptr<memory_resource>{}, 1), logic_error);
}

TEST(LimitingAdaptor, ThreadsNeverPassTheCap) {
  constexpr std::size_t limit = 8 * MiB;
  auto counting = std::make_shared<pool_resource>(std::make_shared<cuda_resource>(0));
  limiting_adaptor mr(counting, limit);
  std::atomic<std::size_t> live{0};
  std::atomic<std::size_t> most{0};
  std::atomic<int> refusals{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < 6; ++t) {
    workers.emplace_back([&, t] {
      stream mine(0);
      for (int i = 0; i < 300; ++i) {
        const std::size_t n = 256 * static_cast<std::size_t>(1 + (i * 31 + t * 7) % 8192);  // up to 2 MiB
        try {
          void* p = mr.allocate(n, mine);
          const std::size_t now = live += n;
          std::size_t m = most.load();
          while (now > m && !most.compare_exchange_weak(m, now)) {
          }
          live -= n;
          mr.deallocate(p, n, mine);
        } catch (const out_of_memory&) {
          ++refusals;
        }
      }
      mine.synchronize();
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_LE(most.load(), limit);
  EXPECT_EQ(mr.used_bytes(), 0U);
  EXPECT_EQ(counting->statistics().used_bytes, 0U);
}

}  // namespace
}  // namespace gpumem::test
