// Which devices reach a vmm_pool_resource's memory: the owner, every device that
// can reach the owner's memory (by default), the devices in
// vmm_pool_options::peer_devices, and no other (docs/vmm.md, "Access").
// The pool maps its pages with one access descriptor per such device; a device
// left out has no mapping, so its kernels fault and its copies fail (checked in
// a child process: support/touch.hpp, exit_with_outcome_of).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "driver/driver.hpp"
#include "gpumem/backend.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/device.hpp"
#include "gpumem/sim.hpp"
#include "gpumem/vmm/virtual_memory.hpp"
#include "gpumem/vmm_pool_resource.hpp"
#include "support/touch.hpp"

namespace gpumem::test {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

unsigned long long access_of(int device, void* p) {
  detail::device_context_guard g(0);
  unsigned long long flags = 0;
  CUmemLocation loc{CU_MEM_LOCATION_TYPE_DEVICE, device};
  GPUMEM_CU(cuMemGetAccess, &flags, &loc, reinterpret_cast<CUdeviceptr>(p));
  return flags;
}

class VmmPeerAccess : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device_count() < 2) GTEST_SKIP() << "needs two devices";
    if (!vmm::supported(0)) GTEST_SKIP() << "no virtual memory management on device 0";
  }
};

TEST_F(VmmPeerAccess, EveryDeviceThatCanReachTheOwnerGetsAccessByDefault) {
  ASSERT_EQ(peers_of(0), std::vector<int>{1});
  vmm_pool_resource pool(0);
  stream s(0);
  for (std::size_t bytes : {std::size_t{4096}, 3 * MiB, 40 * MiB}) {
    void* p = pool.allocate(bytes, s);
    EXPECT_EQ(access_of(1, p), CU_MEM_ACCESS_FLAGS_PROT_READWRITE) << bytes;
    pool.deallocate(p, bytes, s);
  }
}

TEST_F(VmmPeerAccess, WithoutPeerAccessTheDefaultMapsForTheOwnerAlone) {
  if (current_backend() != backend_kind::sim) GTEST_SKIP() << "needs the simulator's set_peer_access";
  sim::set_peer_access(false);
  EXPECT_TRUE(peers_of(0).empty());
  vmm_pool_resource pool(0);
  sim::set_peer_access(true);
  stream s(0);
  void* p = pool.allocate(3 * MiB, s);
  EXPECT_EQ(access_of(1, p), CU_MEM_ACCESS_FLAGS_PROT_NONE);
  pool.deallocate(p, 3 * MiB, s);
}

vmm_pool_options owner_only() {
  vmm_pool_options o;
  o.access_for_every_peer = false;
  return o;
}

TEST_F(VmmPeerAccess, ADeviceNotNamedGetsNoAccess) {
  vmm_pool_resource pool(0, owner_only());
  stream s(0);
  // Small and large requests: the small come from slot pages, the large from their own pages.
  for (std::size_t bytes : {std::size_t{4096}, 3 * MiB, 40 * MiB}) {
    void* p = pool.allocate(bytes, s);
    EXPECT_EQ(access_of(0, p), CU_MEM_ACCESS_FLAGS_PROT_READWRITE) << bytes;
    EXPECT_EQ(access_of(1, p), CU_MEM_ACCESS_FLAGS_PROT_NONE) << bytes;
    pool.deallocate(p, bytes, s);
  }
}

TEST_F(VmmPeerAccess, EveryPageOfANamedPeerIsMapped) {
  vmm_pool_options o = owner_only();
  o.peer_devices = {1};
  vmm_pool_resource pool(0, o);
  stream s(0);
  stream s1(1);
  for (std::size_t bytes : {std::size_t{4096}, 3 * MiB, 40 * MiB}) {
    void* p = pool.allocate(bytes, s);
    // The first and the last byte: a block spans several pages.
    EXPECT_EQ(access_of(1, p), CU_MEM_ACCESS_FLAGS_PROT_READWRITE) << bytes;
    EXPECT_EQ(access_of(1, static_cast<char*>(p) + bytes - 1), CU_MEM_ACCESS_FLAGS_PROT_READWRITE) << bytes;
    s.synchronize();
    device_fill(p, bytes, 0x2b, s1);
    s1.synchronize();
    EXPECT_EQ(device_count_mismatches(p, bytes, 0x2b, s), 0U) << bytes;
    pool.deallocate(p, bytes, s);
  }
}

class VmmPeerAccessDeathTest : public VmmPeerAccess {
 protected:
  void SetUp() override {
    VmmPeerAccess::SetUp();
    if (IsSkipped()) return;
    if (current_backend() == backend_kind::sim) {
      GTEST_SKIP() << "the simulator's device work is host code: it does not model a device's page tables";
    }
    if (std::string(touch_method()) != "CUDA kernels") GTEST_SKIP() << "needs the CUDA test kernels";
    GTEST_FLAG_SET(death_test_style, "threadsafe");  // the driver's threads exist: re-execute, don't fork
  }
};

// Device 1 fills a block mapped for device 0 only, with a kernel.
void kernel_without_access() {
  vmm_pool_resource pool(0, owner_only());
  stream s(0);
  stream s1(1);
  void* p = pool.allocate(3 * MiB, s);
  s.synchronize();
  device_fill(p, 3 * MiB, 0x11, s1);
  s1.synchronize();
}

// Device 1's stream copies a block mapped for device 0 only into device 1's memory.
void copy_without_access() {
  vmm_pool_resource pool(0, owner_only());
  cuda_resource peer_memory(1);
  stream s(0);
  stream s1(1);
  void* p = pool.allocate(3 * MiB, s);
  void* q = peer_memory.allocate(3 * MiB, s1);
  s.synchronize();
  detail::device_context_guard g(1);
  GPUMEM_CU(cuMemcpyAsync, reinterpret_cast<CUdeviceptr>(q), reinterpret_cast<CUdeviceptr>(p), 3 * MiB, s1.handle());
  s1.synchronize();
}

TEST_F(VmmPeerAccessDeathTest, AKernelOfADeviceWithoutAccessFaults) {
  EXPECT_EXIT(exit_with_outcome_of(kernel_without_access), ::testing::ExitedWithCode(device_work_failed),
              "CUDA_ERROR_ILLEGAL_ADDRESS|illegal memory access");
}

TEST_F(VmmPeerAccessDeathTest, ACopyOnADeviceWithoutAccessFails) {
  EXPECT_EXIT(exit_with_outcome_of(copy_without_access), ::testing::ExitedWithCode(device_work_failed),
              "CUDA_ERROR_");
}

}  // namespace
}  // namespace gpumem::test
