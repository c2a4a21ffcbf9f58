// Simulator: device allocation, capacity accounting, frees, pointer queries,
// multiple devices, and concurrent allocation.
#include <atomic>
#include <csignal>
#include <cstring>
#include <random>
#include <vector>

#include "sim_test_support.hpp"
#include "support/sanitizers.hpp"

namespace gpumem::sim_test {
namespace {

using sim_memory_test = sim_test;

std::size_t free_bytes() {
  std::size_t free = 0, total = 0;
  EXPECT_EQ(cu().cuMemGetInfo(&free, &total), CUDA_SUCCESS);
  return free;
}

TEST_F(sim_memory_test, allocation_is_counted_in_pages_and_page_aligned) {
  const std::size_t used_before = sim::used_bytes(0);
  const std::size_t live_before = sim::live_allocations(0);
  CUdeviceptr a = 0, b = 0;
  ASSERT_EQ(cu().cuMemAlloc(&a, 1000), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemAlloc(&b, 3 * page + 1), CUDA_SUCCESS);
  EXPECT_EQ(a % page, 0u);
  EXPECT_EQ(b % page, 0u);
  EXPECT_EQ(sim::used_bytes(0), used_before + page + 4 * page);
  EXPECT_EQ(sim::live_allocations(0), live_before + 2);

  // The memory is usable from the host (unified addressing).
  std::memset(reinterpret_cast<void*>(a), 0xab, 1000);
  std::memset(reinterpret_cast<void*>(b), 0xcd, 3 * page + 1);

  ASSERT_EQ(cu().cuMemFree(a), CUDA_SUCCESS);
  EXPECT_EQ(sim::used_bytes(0), used_before + 4 * page);
  ASSERT_EQ(cu().cuMemFree(b), CUDA_SUCCESS);
  EXPECT_EQ(sim::used_bytes(0), used_before);
  EXPECT_EQ(sim::live_allocations(0), live_before);
}

TEST_F(sim_memory_test, mem_get_info_matches_the_accounting) {
  std::size_t free = 0, total = 0;
  ASSERT_EQ(cu().cuMemGetInfo(&free, &total), CUDA_SUCCESS);
  EXPECT_EQ(total, std::size_t{8} << 30);
  EXPECT_EQ(free, total - sim::used_bytes(0));
  CUdeviceptr p = 0;
  ASSERT_EQ(cu().cuMemAlloc(&p, std::size_t{1} << 30), CUDA_SUCCESS);
  EXPECT_EQ(free_bytes(), free - (std::size_t{1} << 30));
  ASSERT_EQ(cu().cuMemFree(p), CUDA_SUCCESS);
  EXPECT_EQ(free_bytes(), free);
  EXPECT_EQ(cu().cuMemGetInfo(nullptr, &total), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(sim_memory_test, out_of_memory_at_capacity_and_success_after_a_free) {
  const std::size_t remaining = free_bytes();
  CUdeviceptr too_big = 0;
  EXPECT_EQ(cu().cuMemAlloc(&too_big, remaining + 1), CUDA_ERROR_OUT_OF_MEMORY);

  CUdeviceptr everything = 0;
  ASSERT_EQ(cu().cuMemAlloc(&everything, remaining), CUDA_SUCCESS);
  EXPECT_EQ(free_bytes(), 0u);
  CUdeviceptr one_more = 0;
  EXPECT_EQ(cu().cuMemAlloc(&one_more, 1), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(cu().cuMemAlloc(&one_more, ~std::size_t{0}), CUDA_ERROR_OUT_OF_MEMORY);

  ASSERT_EQ(cu().cuMemFree(everything), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemAlloc(&one_more, 1), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemFree(one_more), CUDA_SUCCESS);
}

TEST_F(sim_memory_test, freed_space_is_reused_and_coalesced) {
  // Fill the device with 8 equal blocks, free them all, then one block of the
  // whole capacity must fit again: the address space does not fragment.
  const std::size_t block = free_bytes() / 8 / page * page;
  std::vector<CUdeviceptr> blocks(8);
  for (auto& p : blocks) ASSERT_EQ(cu().cuMemAlloc(&p, block), CUDA_SUCCESS);
  for (std::size_t i = 0; i < blocks.size(); i += 2) ASSERT_EQ(cu().cuMemFree(blocks[i]), CUDA_SUCCESS);
  for (std::size_t i = 1; i < blocks.size(); i += 2) ASSERT_EQ(cu().cuMemFree(blocks[i]), CUDA_SUCCESS);
  CUdeviceptr all = 0;
  ASSERT_EQ(cu().cuMemAlloc(&all, free_bytes()), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemFree(all), CUDA_SUCCESS);
}

TEST_F(sim_memory_test, zero_size_and_invalid_frees) {
  CUdeviceptr p = 0;
  EXPECT_EQ(cu().cuMemAlloc(&p, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemAlloc(nullptr, 16), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemFree(0), CUDA_ERROR_INVALID_VALUE);
  int host = 0;
  EXPECT_EQ(cu().cuMemFree(reinterpret_cast<CUdeviceptr>(&host)), CUDA_ERROR_INVALID_VALUE);

  ASSERT_EQ(cu().cuMemAlloc(&p, 2 * page), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemFree(p + 1), CUDA_ERROR_INVALID_VALUE);     // inside, not at the start
  EXPECT_EQ(cu().cuMemFree(p + page), CUDA_ERROR_INVALID_VALUE);  // a page boundary inside
  ASSERT_EQ(cu().cuMemFree(p), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemFree(p), CUDA_ERROR_INVALID_VALUE);  // double free
}

TEST_F(sim_memory_test, pointer_attributes) {
  CUdeviceptr p = 0;
  ASSERT_EQ(cu().cuMemAlloc(&p, 10000), CUDA_SUCCESS);
  const CUdeviceptr inside = p + 1234;

  int ordinal = -1;
  unsigned int type = 0;
  CUdeviceptr start = 0, device_pointer = 0;
  std::size_t size = 0;
  CUcontext ctx = nullptr;
  EXPECT_EQ(cu().cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, inside), CUDA_SUCCESS);
  EXPECT_EQ(ordinal, 0);
  EXPECT_EQ(cu().cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, inside), CUDA_SUCCESS);
  EXPECT_EQ(type, static_cast<unsigned int>(CU_MEMORYTYPE_DEVICE));
  EXPECT_EQ(cu().cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, inside), CUDA_SUCCESS);
  EXPECT_EQ(start, p);
  EXPECT_EQ(cu().cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, inside), CUDA_SUCCESS);
  EXPECT_EQ(size, 10000u);
  EXPECT_EQ(cu().cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, inside), CUDA_SUCCESS);
  EXPECT_EQ(ctx, primary_context_of(0));
  EXPECT_EQ(cu().cuPointerGetAttribute(&device_pointer, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, inside),
            CUDA_SUCCESS);
  EXPECT_EQ(device_pointer, inside);

  // Memory the simulator does not know: host memory, past the end, freed.
  int host = 0;
  EXPECT_EQ(cu().cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                       reinterpret_cast<CUdeviceptr>(&host)),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p + 10000),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, 0),
            CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cu().cuMemFree(p), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p),
            CUDA_ERROR_INVALID_VALUE);
}

TEST_F(sim_memory_test, address_range_of_any_pointer_inside) {
  CUdeviceptr p = 0;
  ASSERT_EQ(cu().cuMemAlloc(&p, 3 * page), CUDA_SUCCESS);
  for (CUdeviceptr q : {p, p + 1, p + 2 * page + 7, p + 3 * page - 1}) {
    CUdeviceptr base = 0;
    std::size_t size = 0;
    ASSERT_EQ(cu().cuMemGetAddressRange(&base, &size, q), CUDA_SUCCESS);
    EXPECT_EQ(base, p);
    EXPECT_EQ(size, 3 * page);
  }
  CUdeviceptr base = 0;
  EXPECT_EQ(cu().cuMemGetAddressRange(&base, nullptr, p + 5), CUDA_SUCCESS);  // outputs are optional
  EXPECT_EQ(base, p);
  std::size_t size = 0;
  EXPECT_EQ(cu().cuMemGetAddressRange(&base, &size, p + 3 * page), CUDA_ERROR_NOT_FOUND);
  int host = 0;
  EXPECT_EQ(cu().cuMemGetAddressRange(&base, &size, reinterpret_cast<CUdeviceptr>(&host)), CUDA_ERROR_NOT_FOUND);
  ASSERT_EQ(cu().cuMemFree(p), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemGetAddressRange(&base, &size, p), CUDA_ERROR_NOT_FOUND);
}

TEST_F(sim_memory_test, free_waits_for_work_in_flight_on_the_device) {
  CUdeviceptr p = 0;
  ASSERT_EQ(cu().cuMemAlloc(&p, page), CUDA_SUCCESS);
  CUstream s = nullptr;
  ASSERT_EQ(cu().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  std::atomic<bool> finished{false};
  ASSERT_EQ(launch(s,
                   [&] {
                     std::this_thread::sleep_for(100ms);
                     std::memset(reinterpret_cast<void*>(p), 1, page);  // would fault after the free
                     finished = true;
                   }),
            CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemFree(p), CUDA_SUCCESS);
  EXPECT_TRUE(finished);
  EXPECT_EQ(cu().cuStreamDestroy(s), CUDA_SUCCESS);
}

using sim_memory_DeathTest = sim_test;

TEST_F(sim_memory_DeathTest, use_after_free_faults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // stream workers exist; re-execute, don't fork
  CUdeviceptr p = 0;
  ASSERT_EQ(cu().cuMemAlloc(&p, page), CUDA_SUCCESS);
  auto* bytes = reinterpret_cast<volatile unsigned char*>(p);
  bytes[0] = 1;  // fine while allocated
  ASSERT_EQ(cu().cuMemFree(p), CUDA_SUCCESS);
#if GPUMEM_TEST_SANITIZED
  EXPECT_DEATH(bytes[0] = 2, "SEGV");  // the sanitizer reports the fault and exits
#else
  EXPECT_EXIT(bytes[0] = 2, ::testing::KilledBySignal(SIGSEGV), "");
#endif
}

TEST_F(sim_memory_test, devices_have_separate_memory) {
  const std::size_t used1 = sim::used_bytes(1);
  CUdeviceptr on0 = 0;
  ASSERT_EQ(cu().cuMemAlloc(&on0, std::size_t{1} << 20), CUDA_SUCCESS);
  EXPECT_EQ(sim::used_bytes(1), used1);  // device 0's allocation does not count on device 1

  // Exhaust device 0; device 1 can still allocate.
  CUdeviceptr rest0 = 0;
  ASSERT_EQ(cu().cuMemAlloc(&rest0, free_bytes()), CUDA_SUCCESS);
  CUdeviceptr on1 = 0;
  {
    current_device d1(1);
    EXPECT_EQ(free_bytes(), (std::size_t{8} << 30) - used1);
    ASSERT_EQ(cu().cuMemAlloc(&on1, std::size_t{1} << 20), CUDA_SUCCESS);
    int ordinal = -1;
    ASSERT_EQ(cu().cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, on1), CUDA_SUCCESS);
    EXPECT_EQ(ordinal, 1);
  }
  EXPECT_EQ(sim::used_bytes(1), used1 + (std::size_t{1} << 20));
  // Devices sit at distinct addresses: one device's pointer is not inside the other's allocations.
  CUdeviceptr base = 0;
  std::size_t size = 0;
  ASSERT_EQ(cu().cuMemGetAddressRange(&base, &size, on1), CUDA_SUCCESS);
  EXPECT_EQ(base, on1);

  ASSERT_EQ(cu().cuMemFree(on1), CUDA_SUCCESS);  // freeing another device's memory works (UVA)
  ASSERT_EQ(cu().cuMemFree(rest0), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemFree(on0), CUDA_SUCCESS);
  EXPECT_EQ(sim::used_bytes(1), used1);
}

TEST_F(sim_memory_test, controls_reject_bad_devices) {
  EXPECT_THROW(sim::used_bytes(2), logic_error);
  EXPECT_THROW(sim::used_bytes(-1), logic_error);
  EXPECT_THROW(sim::live_allocations(64), logic_error);
}

TEST_F(sim_memory_test, concurrent_allocation_keeps_exact_accounting) {
  const std::size_t used_before[2] = {sim::used_bytes(0), sim::used_bytes(1)};
  const std::size_t live_before[2] = {sim::live_allocations(0), sim::live_allocations(1)};
  constexpr int threads = 8;
  constexpr int rounds = 400;
  std::atomic<int> failures{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      current_device d(t % 2);
      std::mt19937 random(static_cast<unsigned>(t));
      std::vector<CUdeviceptr> held;
      for (int i = 0; i < rounds; ++i) {
        if (held.empty() || random() % 3 != 0) {
          CUdeviceptr p = 0;
          const std::size_t bytes = 1 + random() % (64 * page);
          if (cu().cuMemAlloc(&p, bytes) != CUDA_SUCCESS) {
            ++failures;
            continue;
          }
          reinterpret_cast<volatile char*>(p)[bytes - 1] = 1;  // last byte is usable
          held.push_back(p);
        } else {
          const std::size_t k = random() % held.size();
          if (cu().cuMemFree(held[k]) != CUDA_SUCCESS) ++failures;
          held.erase(held.begin() + static_cast<std::ptrdiff_t>(k));
        }
      }
      for (CUdeviceptr p : held) {
        if (cu().cuMemFree(p) != CUDA_SUCCESS) ++failures;
      }
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(sim::used_bytes(0), used_before[0]);
  EXPECT_EQ(sim::used_bytes(1), used_before[1]);
  EXPECT_EQ(sim::live_allocations(0), live_before[0]);
  EXPECT_EQ(sim::live_allocations(1), live_before[1]);
}

}  // namespace
}  // namespace gpumem::sim_test
