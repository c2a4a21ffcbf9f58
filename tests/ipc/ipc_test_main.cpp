// Main of gpumem_ipc_tests: the GoogleTest suite, or (with --gpumem-ipc-child) the
// importing process the tests start.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "gpumem/backend.hpp"
#include "gpumem/device.hpp"
#include "ipc/ipc_child.hpp"

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "--gpumem-ipc-child") == 0) {
    gpumem::select_backend(gpumem::backend_choice::cuda_or_sim);
    return gpumem_test::run_ipc_child(argc - 2, argv + 2);
  }
  ::testing::InitGoogleTest(&argc, argv);
  const auto kind = gpumem::select_backend(gpumem::backend_choice::cuda_or_sim);
  std::printf("gpumem IPC tests: backend %s, %d device(s)\n", std::string(gpumem::to_string(kind)).c_str(),
              gpumem::device_count());
  return RUN_ALL_TESTS();
}
