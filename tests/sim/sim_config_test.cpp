// Simulator: the GPUMEM_SIM_* environment variables. The simulator reads them
// once per process, so each case runs in a fresh process: a "threadsafe" death
// test re-executes this binary for the one test, with the variables set here.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "sim_test_support.hpp"
#include "support/sanitizers.hpp"

namespace gpumem::sim_test {
namespace {

using environment = std::vector<std::pair<const char*, const char*>>;

// Sets environment variables for the scope (the re-executed child inherits them).
// GPUMEM_BACKEND=sim too, so the child runs on the simulator whatever the machine.
class scoped_environment {
 public:
  explicit scoped_environment(environment variables) {
    variables.insert(variables.begin(), {"GPUMEM_BACKEND", "sim"});
    for (const auto& [name, value] : variables) {
      const char* old = std::getenv(name);
      saved_.push_back({name, old != nullptr, old != nullptr ? old : ""});
      ::setenv(name, value, 1);
    }
  }
  ~scoped_environment() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->was_set) {
        ::setenv(it->name, it->value.c_str(), 1);
      } else {
        ::unsetenv(it->name);
      }
    }
  }
  scoped_environment(const scoped_environment&) = delete;
  scoped_environment& operator=(const scoped_environment&) = delete;

 private:
  struct saved {
    const char* name;
    bool was_set;
    std::string value;
  };
  std::vector<saved> saved_;
};

class sim_config_DeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// The simulator must refuse to start, naming the variable and its value. (The
// test main may select the backend before this statement runs; either way the
// child dies with the message.)
void expect_rejected(const char* variable, const char* value, const std::string& pattern) {
  scoped_environment env(environment{{variable, value}});
  EXPECT_DEATH(
      {
        try {
          (void)detail::driver();
        } catch (const std::exception& e) {
          std::fprintf(stderr, "%s\n", e.what());
          std::abort();
        }
      },
      pattern)
      << variable << "=" << value;
}

TEST_F(sim_config_DeathTest, malformed_values_are_rejected_with_a_message) {
  expect_rejected("GPUMEM_SIM_DEVICES", "0", "GPUMEM_SIM_DEVICES='0'");
  expect_rejected("GPUMEM_SIM_DEVICES", "65", "GPUMEM_SIM_DEVICES='65'");
  expect_rejected("GPUMEM_SIM_DEVICES", "two", "GPUMEM_SIM_DEVICES='two'");
  expect_rejected("GPUMEM_SIM_MEMORY", "12 bananas", "GPUMEM_SIM_MEMORY='12 bananas'");
  expect_rejected("GPUMEM_SIM_MEMORY", "0", "GPUMEM_SIM_MEMORY='0'");
  expect_rejected("GPUMEM_SIM_MEMORY", "-5G", "GPUMEM_SIM_MEMORY='-5G'");
  expect_rejected("GPUMEM_SIM_MEMORY", "99999999999T", "GPUMEM_SIM_MEMORY='99999999999T'");
  expect_rejected("GPUMEM_SIM_FAIL_ALLOC", "x", "GPUMEM_SIM_FAIL_ALLOC='x'");
  expect_rejected("GPUMEM_SIM_FAIL_RANDOM", "2", "GPUMEM_SIM_FAIL_RANDOM='2'");
  expect_rejected("GPUMEM_SIM_SEED", "seed", "GPUMEM_SIM_SEED='seed'");
}

// Runs `check` in a fresh simulator configured by `variables`; it must return true.
void expect_in_fresh_process(environment variables, bool (*check)()) {
  scoped_environment env(std::move(variables));
  EXPECT_EXIT(std::_Exit(check() ? 0 : 1), ::testing::ExitedWithCode(0), "");
}

std::size_t total_memory(int device) {
  std::size_t total = 0;
  return cu().cuDeviceTotalMem(&total, device) == CUDA_SUCCESS ? total : 0;
}

TEST_F(sim_config_DeathTest, memory_sizes_accept_suffixes) {
  expect_in_fresh_process({{"GPUMEM_SIM_MEMORY", "1GiB"}}, [] { return total_memory(0) == std::size_t{1} << 30; });
  expect_in_fresh_process({{"GPUMEM_SIM_MEMORY", "512m"}}, [] { return total_memory(1) == std::size_t{512} << 20; });
  expect_in_fresh_process({{"GPUMEM_SIM_MEMORY", "64 K"}}, [] { return total_memory(0) == std::size_t{64} << 10; });
#if !GPUMEM_TEST_TSAN
  // Reserving 4 TiB per device is more address space than ThreadSanitizer's layout allows.
  expect_in_fresh_process({{"GPUMEM_SIM_MEMORY", "1tib"}}, [] { return total_memory(0) == std::size_t{1} << 40; });
  // The same units as GPUMEM_CONF (one parser): KB/MB/GB/TB are powers of 1024 too.
  expect_in_fresh_process({{"GPUMEM_SIM_MEMORY", "2GB"}}, [] { return total_memory(0) == std::size_t{2} << 30; });
#endif
  expect_in_fresh_process({{"GPUMEM_SIM_MEMORY", "1000000"}}, [] { return total_memory(0) == 1000000; });
}

TEST_F(sim_config_DeathTest, device_count) {
  expect_in_fresh_process({{"GPUMEM_SIM_DEVICES", "1"}}, [] {
    int count = 0;
    CUdevice dev = 0;
    return cu().cuDeviceGetCount(&count) == CUDA_SUCCESS && count == 1 &&
           cu().cuDeviceGet(&dev, 1) == CUDA_ERROR_INVALID_DEVICE;
  });
  expect_in_fresh_process({{"GPUMEM_SIM_DEVICES", "64"}, {"GPUMEM_SIM_MEMORY", "1G"}}, [] {
    int count = 0;
    return cu().cuDeviceGetCount(&count) == CUDA_SUCCESS && count == 64 &&
           total_memory(63) == std::size_t{1} << 30;
  });
}

// A small capacity really limits allocation.
TEST_F(sim_config_DeathTest, small_memory_runs_out) {
  expect_in_fresh_process({{"GPUMEM_SIM_MEMORY", "1M"}}, [] {
    current_device d(0);
    CUdeviceptr p = 0, q = 0;
    return cu().cuMemAlloc(&p, std::size_t{1} << 20) == CUDA_SUCCESS &&
           cu().cuMemAlloc(&q, 1) == CUDA_ERROR_OUT_OF_MEMORY && cu().cuMemFree(p) == CUDA_SUCCESS;
  });
}

TEST_F(sim_config_DeathTest, fault_injection_from_the_environment) {
  expect_in_fresh_process({{"GPUMEM_SIM_FAIL_ALLOC", "2"}}, [] {
    current_device d(0);
    const std::uint64_t before = sim::injected_failures();
    CUdeviceptr p = 0, q = 0, r = 0;
    return cu().cuMemAlloc(&p, 64) == CUDA_SUCCESS && cu().cuMemAlloc(&q, 64) == CUDA_ERROR_OUT_OF_MEMORY &&
           cu().cuMemAlloc(&r, 64) == CUDA_SUCCESS && sim::injected_failures() == before + 1;
  });
  expect_in_fresh_process({{"GPUMEM_SIM_FAIL_RANDOM", "1"}, {"GPUMEM_SIM_SEED", "9"}}, [] {
    current_device d(0);
    CUdeviceptr p = 0;
    return cu().cuMemAlloc(&p, 64) == CUDA_ERROR_OUT_OF_MEMORY;
  });
}

}  // namespace
}  // namespace gpumem::sim_test
