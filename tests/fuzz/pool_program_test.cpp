// Random pool programs under GoogleTest, so every build (not only the libFuzzer
// one) checks the pools' invariants over thousands of operations. A longer
// campaign: GPUMEM_PROGRAMS=n programs of each kind, GPUMEM_PROGRAMS_SEED=s
// for other programs than CI's (docs/gpu-testing.md).
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "fuzz/capture_program.hpp"
#include "fuzz/pool_program.hpp"
#include "fuzz/vmm_pool_program.hpp"
#include "fuzz/vmm_pool_threads_program.hpp"
#include "gpumem/vmm/virtual_memory.hpp"

namespace gpumem::test {
namespace {

unsigned long setting(const char* name, unsigned long otherwise) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::stoul(v) : otherwise;
}

// Runs `programs` random programs of `bytes` bytes each through `run`.
template <class Run>
void run_programs(Run run, unsigned long seed, unsigned long programs, std::size_t bytes) {
  std::mt19937 rng(static_cast<std::mt19937::result_type>(setting("GPUMEM_PROGRAMS_SEED", seed)));
  const unsigned long n = setting("GPUMEM_PROGRAMS", programs);
  std::vector<std::uint8_t> program(bytes);
  for (unsigned long k = 0; k < n; ++k) {
    for (auto& b : program) b = static_cast<std::uint8_t>(rng());
    const std::string failure = run(program.data(), program.size());
    ASSERT_TRUE(failure.empty()) << "program " << k << ": " << failure;
  }
}

TEST(PoolPrograms, RandomProgramsKeepEveryInvariant) {
  run_programs(run_pool_program, 20261121, 60, 2000);
}

TEST(PoolPrograms, RandomVmmPoolProgramsKeepEveryInvariant) {
  if (!vmm::supported(0)) GTEST_SKIP() << "no virtual memory management on device 0";
  run_programs(run_vmm_pool_program, 20261122, 40, 1500);
}

TEST(PoolPrograms, RandomVmmPoolProgramsOnThreadsKeepEveryInvariant) {
  if (!vmm::supported(0)) GTEST_SKIP() << "no virtual memory management on device 0";
  run_programs(run_vmm_pool_threads_program, 20261130, 20, 2400);
}

TEST(PoolPrograms, RandomProgramsBesideCapturesKeepEveryInvariant) {
  if (!vmm::supported(0)) GTEST_SKIP() << "no virtual memory management on device 0";
  run_programs(run_capture_program, 20261202, 100, 1000);
}

}  // namespace
}  // namespace gpumem::test
