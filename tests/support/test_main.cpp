// Shared GoogleTest main: selects the backend and says which one the tests run on.
// gpumem_sim_tests is built with GPUMEM_TEST_FORCE_SIM: the simulator's own tests
// always run on the simulator; every other suite runs on the GPU when one is usable.
#include <cstdio>
#include <cstdlib>

#include <gtest/gtest.h>

#include "gpumem/backend.hpp"
#include "gpumem/device.hpp"
#include "support/touch.hpp"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
#ifdef GPUMEM_TEST_FORCE_SIM
  const auto kind = gpumem::select_backend(gpumem::backend_choice::sim);
#else
  const bool from_env = std::getenv("GPUMEM_BACKEND") != nullptr;
  const auto kind = gpumem::select_backend(gpumem::backend_choice::cuda_or_sim);
  if (kind == gpumem::backend_kind::sim && !from_env) {
    std::printf("gpumem tests: no usable CUDA driver or GPU here; running on the host simulator "
                "(GPUMEM_BACKEND=sim)\n");
  }
#endif
  std::printf("gpumem tests: backend %s, %d device(s), device 0: %s\n",
              std::string(gpumem::to_string(kind)).c_str(), gpumem::device_count(),
              gpumem::device_name(0).c_str());
  gpumem::test::reserve_check_memory();
  return RUN_ALL_TESTS();
}
