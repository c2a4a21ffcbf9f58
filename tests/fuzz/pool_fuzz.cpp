// libFuzzer targets: pool programs on the simulator; any broken invariant
// aborts. Built twice by scripts/fuzz with clang: gpumem_pool_fuzz runs
// pool_resource's programs (pool_program.hpp), gpumem_vmm_pool_fuzz the default
// pool's, vmm_pool_resource (vmm_pool_program.hpp; GPUMEM_FUZZ_VMM_POOL), and
// gpumem_capture_fuzz either pool beside CUDA graph captures (capture_program.hpp;
// GPUMEM_FUZZ_CAPTURE).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "gpumem/backend.hpp"

#if defined(GPUMEM_FUZZ_VMM_POOL)
#include "fuzz/vmm_pool_program.hpp"
#define GPUMEM_FUZZ_PROGRAM run_vmm_pool_program
#elif defined(GPUMEM_FUZZ_CAPTURE)
#include "fuzz/capture_program.hpp"
#define GPUMEM_FUZZ_PROGRAM run_capture_program
#else
#include "fuzz/pool_program.hpp"
#define GPUMEM_FUZZ_PROGRAM run_pool_program
#endif

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("GPUMEM_SIM_MEMORY", "256MiB", 1);  // small: out-of-memory paths run often
  gpumem::select_backend(gpumem::backend_choice::sim);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  const std::string failure = gpumem::test::GPUMEM_FUZZ_PROGRAM(data, size);
  if (!failure.empty()) {
    std::fprintf(stderr, "pool invariant broken: %s\n", failure.c_str());
    std::abort();
  }
  return 0;
}
