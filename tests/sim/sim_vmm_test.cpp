// Simulator: virtual memory management (cuMemAddressReserve/Free, cuMemCreate/
// Release, cuMemMap/Unmap, cuMemSetAccess/GetAccess, cuMemRetainAllocationHandle,
// cuMemGetAllocationGranularity): argument checks, capacity accounting, the same
// physical memory at two addresses, access, and faults after unmap and release.
#include <csignal>
#include <cstring>
#include <thread>
#include <vector>

#include "sim_test_support.hpp"
#include "support/sanitizers.hpp"

namespace gpumem::sim_test {
namespace {

constexpr std::size_t granule = std::size_t{2} << 20;

CUmemAllocationProp device_prop(int device, CUmemAllocationHandleType handle_type = CU_MEM_HANDLE_TYPE_NONE) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = handle_type;
  return prop;
}

CUmemAccessDesc read_write(int device) {
  CUmemAccessDesc d{};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = device;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return d;
}

std::size_t free_bytes() {
  std::size_t free = 0, total = 0;
  EXPECT_EQ(cu().cuMemGetInfo(&free, &total), CUDA_SUCCESS);
  return free;
}

class sim_vmm_test : public sim_test {
 protected:
  CUmemGenericAllocationHandle create(std::size_t bytes, int device = 0) {
    CUmemGenericAllocationHandle h = 0;
    const CUmemAllocationProp prop = device_prop(device);
    EXPECT_EQ(cu().cuMemCreate(&h, bytes, &prop, 0), CUDA_SUCCESS);
    return h;
  }
  CUdeviceptr reserve(std::size_t bytes, CUdeviceptr hint = 0) {
    CUdeviceptr p = 0;
    EXPECT_EQ(cu().cuMemAddressReserve(&p, bytes, 0, hint, 0), CUDA_SUCCESS);
    return p;
  }
  // Maps h at p with read/write access for device 0.
  void map_rw(CUdeviceptr p, std::size_t bytes, CUmemGenericAllocationHandle h) {
    ASSERT_EQ(cu().cuMemMap(p, bytes, 0, h, 0), CUDA_SUCCESS);
    const CUmemAccessDesc d = read_write(0);
    ASSERT_EQ(cu().cuMemSetAccess(p, bytes, &d, 1), CUDA_SUCCESS);
  }
};

TEST_F(sim_vmm_test, granularity_is_two_mib) {
  const CUmemAllocationProp prop = device_prop(0);
  std::size_t g = 0;
  EXPECT_EQ(cu().cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
  EXPECT_EQ(g, granule);
  EXPECT_EQ(cu().cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), CUDA_SUCCESS);
  EXPECT_EQ(g, granule);
  const CUmemAllocationProp bad = device_prop(7);
  EXPECT_EQ(cu().cuMemGetAllocationGranularity(&g, &bad, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(cu().cuMemGetAllocationGranularity(nullptr, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_ERROR_INVALID_VALUE);
}

TEST_F(sim_vmm_test, reserve_checks_and_honours_a_free_hint) {
  CUdeviceptr p = 0;
  EXPECT_EQ(cu().cuMemAddressReserve(&p, 0, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemAddressReserve(&p, granule + 1, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemAddressReserve(&p, granule, 3, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemAddressReserve(nullptr, granule, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);

  const CUdeviceptr a = reserve(4 * granule);
  EXPECT_EQ(a % granule, 0U);
  // The range right after a is free: the hint is honoured, so a range extends in place.
  const CUdeviceptr b = reserve(2 * granule, a + 4 * granule);
  EXPECT_EQ(b, a + 4 * granule);
  // A hint inside a taken range is only a hint: somewhere else.
  const CUdeviceptr c = reserve(granule, a);
  EXPECT_NE(c, a);
  // Large alignments are honoured.
  CUdeviceptr d = 0;
  ASSERT_EQ(cu().cuMemAddressReserve(&d, granule, std::size_t{1} << 30, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(d % (std::size_t{1} << 30), 0U);

  EXPECT_EQ(cu().cuMemAddressFree(a, 2 * granule), CUDA_ERROR_INVALID_VALUE);  // not the range reserved
  EXPECT_EQ(cu().cuMemAddressFree(a + granule, 3 * granule), CUDA_ERROR_INVALID_VALUE);
  for (auto [ptr, size] : {std::pair{a, 4 * granule}, {b, 2 * granule}, {c, granule}, {d, granule}}) {
    EXPECT_EQ(cu().cuMemAddressFree(ptr, size), CUDA_SUCCESS);
  }
  EXPECT_EQ(cu().cuMemAddressFree(a, 4 * granule), CUDA_ERROR_INVALID_VALUE);  // twice
}

TEST_F(sim_vmm_test, create_counts_against_capacity_until_released_and_unmapped) {
  const std::size_t before = free_bytes();
  const CUmemGenericAllocationHandle h = create(3 * granule);
  EXPECT_EQ(free_bytes(), before - 3 * granule);
  const CUdeviceptr p = reserve(3 * granule);
  map_rw(p, 3 * granule, h);
  // Released while mapped: the memory stays, and stays usable.
  EXPECT_EQ(cu().cuMemRelease(h), CUDA_SUCCESS);
  EXPECT_EQ(free_bytes(), before - 3 * granule);
  reinterpret_cast<volatile char*>(p)[0] = 1;
  EXPECT_EQ(cu().cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);  // no reference left
  // Unmapped too: back to the device.
  EXPECT_EQ(cu().cuMemUnmap(p, 3 * granule), CUDA_SUCCESS);
  EXPECT_EQ(free_bytes(), before);
  EXPECT_EQ(cu().cuMemAddressFree(p, 3 * granule), CUDA_SUCCESS);
}

TEST_F(sim_vmm_test, create_checks_its_arguments) {
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp prop = device_prop(0);
  EXPECT_EQ(cu().cuMemCreate(&h, granule / 2, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemCreate(&h, 0, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemCreate(&h, granule, nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemCreate(&h, granule, &prop, 1), CUDA_ERROR_INVALID_VALUE);
  prop.location.id = 9;
  EXPECT_EQ(cu().cuMemCreate(&h, granule, &prop, 0), CUDA_ERROR_INVALID_DEVICE);
  prop = device_prop(0, CU_MEM_HANDLE_TYPE_WIN32);
  EXPECT_EQ(cu().cuMemCreate(&h, granule, &prop, 0), CUDA_ERROR_NOT_SUPPORTED);
  // POSIX file descriptors (for IPC later) are accepted.
  prop = device_prop(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  ASSERT_EQ(cu().cuMemCreate(&h, granule, &prop, 0), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemRelease(h), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemRelease(12345), CUDA_ERROR_INVALID_VALUE);  // made up
}

TEST_F(sim_vmm_test, create_fails_at_capacity_and_under_fault_injection) {
  std::size_t free = 0, total = 0;
  ASSERT_EQ(cu().cuMemGetInfo(&free, &total), CUDA_SUCCESS);
  CUmemGenericAllocationHandle h = 0;
  const CUmemAllocationProp prop = device_prop(0);
  EXPECT_EQ(cu().cuMemCreate(&h, (free / granule + 1) * granule, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  sim::fail_nth_allocation(1);
  EXPECT_EQ(cu().cuMemCreate(&h, granule, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_EQ(cu().cuMemCreate(&h, granule, &prop, 0), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemRelease(h), CUDA_SUCCESS);
}

TEST_F(sim_vmm_test, map_checks_bounds_overlap_and_reservation) {
  const CUmemGenericAllocationHandle h = create(2 * granule);
  const CUdeviceptr p = reserve(4 * granule);
  EXPECT_EQ(cu().cuMemMap(p, 3 * granule, 0, h, 0), CUDA_ERROR_INVALID_VALUE);        // larger than h
  EXPECT_EQ(cu().cuMemMap(p, granule, 2 * granule, h, 0), CUDA_ERROR_INVALID_VALUE);  // offset past h
  EXPECT_EQ(cu().cuMemMap(p + 1, granule, 0, h, 0), CUDA_ERROR_INVALID_VALUE);        // unaligned
  EXPECT_EQ(cu().cuMemMap(p + 3 * granule, 2 * granule, 0, h, 0), CUDA_ERROR_INVALID_VALUE);  // past the range
  EXPECT_EQ(cu().cuMemMap(p, granule, 0, 777, 0), CUDA_ERROR_INVALID_VALUE);          // made-up handle
  int on_stack = 0;
  EXPECT_EQ(cu().cuMemMap(reinterpret_cast<CUdeviceptr>(&on_stack) & ~(granule - 1), granule, 0, h, 0),
            CUDA_ERROR_INVALID_VALUE);  // not reserved
  ASSERT_EQ(cu().cuMemMap(p, 2 * granule, 0, h, 0), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemMap(p + granule, granule, 0, h, 0), CUDA_ERROR_INVALID_VALUE);  // already mapped
  EXPECT_EQ(cu().cuMemAddressFree(p, 4 * granule), CUDA_ERROR_INVALID_VALUE);         // still mapped
  // Unmap takes whole mappings only.
  EXPECT_EQ(cu().cuMemUnmap(p, granule), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemUnmap(p, 3 * granule), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemUnmap(p, 2 * granule), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemUnmap(p, 2 * granule), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemRelease(h), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemAddressFree(p, 4 * granule), CUDA_SUCCESS);
}

TEST_F(sim_vmm_test, one_unmap_may_take_several_adjacent_mappings) {
  const CUmemGenericAllocationHandle a = create(granule);
  const CUmemGenericAllocationHandle b = create(granule);
  const CUdeviceptr p = reserve(2 * granule);
  ASSERT_EQ(cu().cuMemMap(p, granule, 0, a, 0), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemMap(p + granule, granule, 0, b, 0), CUDA_SUCCESS);
  // Access is set once for the whole range of both handles.
  const CUmemAccessDesc d = read_write(0);
  ASSERT_EQ(cu().cuMemSetAccess(p, 2 * granule, &d, 1), CUDA_SUCCESS);
  std::memset(reinterpret_cast<void*>(p), 7, 2 * granule);
  EXPECT_EQ(cu().cuMemUnmap(p, 2 * granule), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemRelease(a), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemRelease(b), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemAddressFree(p, 2 * granule), CUDA_SUCCESS);
}

TEST_F(sim_vmm_test, the_same_physical_memory_at_two_addresses) {
  const CUmemGenericAllocationHandle h = create(granule);
  const CUdeviceptr p = reserve(granule);
  const CUdeviceptr q = reserve(granule);
  map_rw(p, granule, h);
  map_rw(q, granule, h);
  auto* at_p = reinterpret_cast<unsigned char*>(p);
  auto* at_q = reinterpret_cast<unsigned char*>(q);
  at_p[100] = 0x5A;
  EXPECT_EQ(at_q[100], 0x5A);
  // Remap: unmap at p, the bytes survive at q, and map again elsewhere: no copy.
  ASSERT_EQ(cu().cuMemUnmap(p, granule), CUDA_SUCCESS);
  EXPECT_EQ(at_q[100], 0x5A);
  const CUdeviceptr r = reserve(granule);
  map_rw(r, granule, h);
  EXPECT_EQ(reinterpret_cast<unsigned char*>(r)[100], 0x5A);
  EXPECT_EQ(cu().cuMemUnmap(q, granule), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemUnmap(r, granule), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemRelease(h), CUDA_SUCCESS);
  for (CUdeviceptr x : {p, q, r}) EXPECT_EQ(cu().cuMemAddressFree(x, granule), CUDA_SUCCESS);
}

TEST_F(sim_vmm_test, access_per_device_and_copies_need_it) {
  const CUmemGenericAllocationHandle h = create(granule);
  const CUdeviceptr p = reserve(granule);
  ASSERT_EQ(cu().cuMemMap(p, granule, 0, h, 0), CUDA_SUCCESS);
  unsigned long long flags = 99;
  CUmemLocation loc{CU_MEM_LOCATION_TYPE_DEVICE, 0};
  ASSERT_EQ(cu().cuMemGetAccess(&flags, &loc, p), CUDA_SUCCESS);
  EXPECT_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_NONE);
  // A copy into mapped memory without access is refused, as the device would fault.
  EXPECT_EQ(cu().cuMemsetD8(p, 1, 64), CUDA_ERROR_INVALID_VALUE);
  // Peer access without cuCtxEnablePeerAccess: both devices in one call.
  CUmemAccessDesc both[2] = {read_write(0), read_write(1)};
  both[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
  ASSERT_EQ(cu().cuMemSetAccess(p, granule, both, 2), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemGetAccess(&flags, &loc, p + 4096), CUDA_SUCCESS);
  EXPECT_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  loc.id = 1;
  ASSERT_EQ(cu().cuMemGetAccess(&flags, &loc, p), CUDA_SUCCESS);
  EXPECT_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_READ);
  loc.id = 5;
  EXPECT_EQ(cu().cuMemGetAccess(&flags, &loc, p), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(cu().cuMemsetD8(p, 1, 64), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemsetD8(p + granule - 32, 1, 64), CUDA_ERROR_INVALID_VALUE);  // runs past the mapping
  CUmemAccessDesc bad = read_write(4);
  EXPECT_EQ(cu().cuMemSetAccess(p, granule, &bad, 1), CUDA_ERROR_INVALID_DEVICE);
  bad = read_write(0);
  bad.flags = static_cast<CUmemAccess_flags>(7);
  EXPECT_EQ(cu().cuMemSetAccess(p, granule, &bad, 1), CUDA_ERROR_INVALID_VALUE);
  const CUdeviceptr unmapped = reserve(granule);
  const CUmemAccessDesc d = read_write(0);
  EXPECT_EQ(cu().cuMemSetAccess(unmapped, granule, &d, 1), CUDA_ERROR_INVALID_VALUE);
  // Pointer queries know mapped memory.
  int ordinal = -1;
  EXPECT_EQ(cu().cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p + 10), CUDA_SUCCESS);
  EXPECT_EQ(ordinal, 0);
  EXPECT_EQ(cu().cuMemUnmap(p, granule), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemRelease(h), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemAddressFree(p, granule), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemAddressFree(unmapped, granule), CUDA_SUCCESS);
}

TEST_F(sim_vmm_test, memory_of_the_second_device) {
  current_device one(1);
  const std::size_t before = free_bytes();
  const CUmemGenericAllocationHandle h = create(granule, 1);
  EXPECT_EQ(free_bytes(), before - granule);
  const CUdeviceptr p = reserve(granule);
  ASSERT_EQ(cu().cuMemMap(p, granule, 0, h, 0), CUDA_SUCCESS);
  int ordinal = -1;
  EXPECT_EQ(cu().cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p), CUDA_SUCCESS);
  EXPECT_EQ(ordinal, 1);
  EXPECT_EQ(cu().cuMemUnmap(p, granule), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemRelease(h), CUDA_SUCCESS);
  EXPECT_EQ(free_bytes(), before);
  EXPECT_EQ(cu().cuMemAddressFree(p, granule), CUDA_SUCCESS);
}

TEST_F(sim_vmm_test, retain_gives_the_handle_and_one_more_reference) {
  const std::size_t before = free_bytes();
  const CUmemGenericAllocationHandle h = create(granule);
  const CUdeviceptr p = reserve(granule);
  map_rw(p, granule, h);
  CUmemGenericAllocationHandle again = 0;
  ASSERT_EQ(cu().cuMemRetainAllocationHandle(&again, reinterpret_cast<void*>(p + 100)), CUDA_SUCCESS);
  EXPECT_EQ(again, h);
  EXPECT_EQ(cu().cuMemRetainAllocationHandle(&again, reinterpret_cast<void*>(p + granule)), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemRelease(h), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemUnmap(p, granule), CUDA_SUCCESS);
  EXPECT_LT(free_bytes(), before);  // the retained reference keeps it
  EXPECT_EQ(cu().cuMemRelease(h), CUDA_SUCCESS);
  EXPECT_EQ(free_bytes(), before);
  EXPECT_EQ(cu().cuMemAddressFree(p, granule), CUDA_SUCCESS);
}

TEST_F(sim_vmm_test, released_memory_reads_zero_when_reused) {
  const CUmemGenericAllocationHandle h = create(granule);
  const CUdeviceptr p = reserve(granule);
  map_rw(p, granule, h);
  std::memset(reinterpret_cast<void*>(p), 0xEE, granule);
  ASSERT_EQ(cu().cuMemUnmap(p, granule), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemRelease(h), CUDA_SUCCESS);
  const CUmemGenericAllocationHandle g = create(granule);
  map_rw(p, granule, g);
  EXPECT_EQ(reinterpret_cast<unsigned char*>(p)[0], 0);  // pages were given back to the host
  ASSERT_EQ(cu().cuMemUnmap(p, granule), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemRelease(g), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemAddressFree(p, granule), CUDA_SUCCESS);
}

TEST_F(sim_vmm_test, concurrent_create_map_unmap_release_keeps_exact_accounting) {
  const std::size_t before = free_bytes();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([] {
      for (int i = 0; i < 50; ++i) {
        CUmemGenericAllocationHandle h = 0;
        const CUmemAllocationProp prop = device_prop(0);
        ASSERT_EQ(cu().cuMemCreate(&h, granule, &prop, 0), CUDA_SUCCESS);
        CUdeviceptr p = 0;
        ASSERT_EQ(cu().cuMemAddressReserve(&p, granule, 0, 0, 0), CUDA_SUCCESS);
        ASSERT_EQ(cu().cuMemMap(p, granule, 0, h, 0), CUDA_SUCCESS);
        const CUmemAccessDesc d = read_write(0);
        ASSERT_EQ(cu().cuMemSetAccess(p, granule, &d, 1), CUDA_SUCCESS);
        reinterpret_cast<volatile char*>(p)[i] = 1;
        ASSERT_EQ(cu().cuMemUnmap(p, granule), CUDA_SUCCESS);
        ASSERT_EQ(cu().cuMemRelease(h), CUDA_SUCCESS);
        ASSERT_EQ(cu().cuMemAddressFree(p, granule), CUDA_SUCCESS);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(free_bytes(), before);
}

using sim_vmm_DeathTest = sim_vmm_test;

#if GPUMEM_TEST_SANITIZED
#define GPUMEM_EXPECT_SEGV(statement) EXPECT_DEATH(statement, "SEGV")
#else
#define GPUMEM_EXPECT_SEGV(statement) EXPECT_EXIT(statement, ::testing::KilledBySignal(SIGSEGV), "")
#endif

TEST_F(sim_vmm_DeathTest, mapped_memory_faults_until_access_is_set) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const CUmemGenericAllocationHandle h = create(granule);
  const CUdeviceptr p = reserve(granule);
  ASSERT_EQ(cu().cuMemMap(p, granule, 0, h, 0), CUDA_SUCCESS);
  auto* bytes = reinterpret_cast<volatile unsigned char*>(p);
  GPUMEM_EXPECT_SEGV(bytes[0] = 1);
  cu().cuMemUnmap(p, granule);
  cu().cuMemRelease(h);
  cu().cuMemAddressFree(p, granule);
}

TEST_F(sim_vmm_DeathTest, touching_an_unmapped_and_released_range_faults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const CUmemGenericAllocationHandle h = create(granule);
  const CUdeviceptr p = reserve(granule);
  map_rw(p, granule, h);
  auto* bytes = reinterpret_cast<volatile unsigned char*>(p);
  bytes[0] = 1;  // fine while mapped
  ASSERT_EQ(cu().cuMemUnmap(p, granule), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemRelease(h), CUDA_SUCCESS);
  GPUMEM_EXPECT_SEGV(bytes[0] = 2);
  ASSERT_EQ(cu().cuMemAddressFree(p, granule), CUDA_SUCCESS);
  GPUMEM_EXPECT_SEGV(bytes[0] = 3);  // and after its addresses are freed
}

}  // namespace
}  // namespace gpumem::sim_test
