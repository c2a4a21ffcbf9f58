// libFuzzer target: pool programs (pool_program.hpp) on the simulator; any
// broken invariant aborts. Built by scripts/fuzz with clang.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz/pool_program.hpp"
#include "gpumem/backend.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("GPUMEM_SIM_MEMORY", "256MiB", 1);  // small: out-of-memory paths run often
  gpumem::select_backend(gpumem::backend_choice::sim);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  const std::string failure = gpumem::test::run_pool_program(data, size);
  if (!failure.empty()) {
    std::fprintf(stderr, "pool invariant broken: %s\n", failure.c_str());
    std::abort();
  }
  return 0;
}
