// Random pool programs under GoogleTest, so every build (not only the libFuzzer
// one) checks the pools' invariants over thousands of operations.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "fuzz/pool_program.hpp"
#include "fuzz/vmm_pool_program.hpp"
#include "gpumem/vmm/virtual_memory.hpp"

namespace gpumem::test {
namespace {

TEST(PoolPrograms, RandomProgramsKeepEveryInvariant) {
  std::mt19937 rng(20261121);
  for (int program = 0; program < 60; ++program) {
    std::vector<std::uint8_t> bytes(2000);
    for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
    const std::string failure = run_pool_program(bytes.data(), bytes.size());
    ASSERT_TRUE(failure.empty()) << "program " << program << ": " << failure;
  }
}

TEST(PoolPrograms, RandomVmmPoolProgramsKeepEveryInvariant) {
  if (!vmm::supported(0)) GTEST_SKIP() << "no virtual memory management on device 0";
  std::mt19937 rng(20261122);
  for (int program = 0; program < (getenv("PROGRAMS") ? atoi(getenv("PROGRAMS")) : 40); ++program) {
    std::vector<std::uint8_t> bytes(1500);
    for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
    const std::string failure = run_vmm_pool_program(bytes.data(), bytes.size());
    ASSERT_TRUE(failure.empty()) << "program " << program << ": " << failure;
  }
}

}  // namespace
}  // namespace gpumem::test
