// Simulator: sim::driver_calls counts the calls made through each entry point,
// so that tests can assert which driver calls a path makes.
#include <string>
#include <thread>

#include "sim_test_support.hpp"

namespace gpumem::sim_test {
namespace {

using sim_driver_calls_test = sim_test;

TEST_F(sim_driver_calls_test, counts_each_entry_point_apart) {
  const std::uint64_t gets = sim::driver_calls("cuCtxGetCurrent");
  const std::uint64_t queries = sim::driver_calls("cuStreamQuery");
  CUcontext ctx = nullptr;
  for (int i = 0; i < 3; ++i) ASSERT_EQ(cu().cuCtxGetCurrent(&ctx), CUDA_SUCCESS);
  EXPECT_EQ(sim::driver_calls("cuCtxGetCurrent") - gets, 3U);
  EXPECT_EQ(sim::driver_calls("cuStreamQuery"), queries);
}

TEST_F(sim_driver_calls_test, counts_failed_calls_and_calls_of_every_thread) {
  const std::uint64_t before = sim::driver_calls("cuMemFree");
  std::thread other([] { EXPECT_NE(cu().cuMemFree(0), CUDA_SUCCESS); });
  other.join();
  EXPECT_NE(cu().cuMemFree(0), CUDA_SUCCESS);
  EXPECT_EQ(sim::driver_calls("cuMemFree") - before, 2U);
}

TEST_F(sim_driver_calls_test, versioned_entry_points_go_by_their_plain_name) {
  const std::uint64_t before = sim::driver_calls("cuMemAlloc");  // cuMemAlloc_v2 in cuda.h
  CUdeviceptr p = 0;
  ASSERT_EQ(cu().cuMemAlloc(&p, 256), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemFree(p), CUDA_SUCCESS);
  EXPECT_EQ(sim::driver_calls("cuMemAlloc") - before, 1U);
}

TEST_F(sim_driver_calls_test, a_name_that_is_no_entry_point_is_refused) {
  for (const char* name : {"", "cuNoSuchCall", "cuMemAlloc_v2", "custreamwaitevent"}) {
    try {
      (void)sim::driver_calls(name);
      ADD_FAILURE() << "'" << name << "' was accepted";
    } catch (const logic_error& e) {
      EXPECT_NE(std::string(e.what()).find("not a driver entry point"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace gpumem::sim_test
