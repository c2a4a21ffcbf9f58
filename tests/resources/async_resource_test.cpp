// async_resource beyond the shared contract: the pool it owns or wraps and its
// options, reuse in stream order (at once on the freeing stream, across
// streams only as the reuse policies allow), the release threshold, trim giving
// memory back to the device, statistics read from the pool's attributes,
// maximum size, IPC handle type and access from other devices.
#include <gtest/gtest.h>

#include <chrono>
#include <limits>
#include <string>
#include <vector>

#include "driver/driver.hpp"
#include "gpumem/async_resource.hpp"
#include "gpumem/backend.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/event.hpp"
#include "support/touch.hpp"

namespace gpumem::test {
namespace {

using namespace std::chrono_literals;
constexpr std::size_t MiB = std::size_t{1} << 20;

cuuint64_t attribute(CUmemoryPool pool, CUmemPool_attribute a) {
  cuuint64_t v = 0;
  GPUMEM_CU(cuMemPoolGetAttribute, pool, a, &v);
  return v;
}

// A pool with room for one `block` and not two, which reuses frees of other
// streams only as `policy` allows: whether a second block can be had says
// whether the first one's memory was reused. The driver reserves in steps
// (32 MiB on an H200) and rounds a small maximum up to its step, so the pool's
// maximum and the block are well above it.
constexpr std::size_t block = 40 * MiB;
async_options one_block(async_reuse_policy policy) {
  async_options o;
  o.maximum_bytes = 64 * MiB;
  o.reuse = policy;
  return o;
}

TEST(AsyncResource, OwnsANewPoolWithTheOptionsAsked) {
  async_options o;
  o.release_threshold_bytes = 64 * MiB;
  o.reuse = {.follow_event_dependencies = true, .allow_opportunistic = false, .allow_internal_dependencies = true};
  async_resource mr(0, o);
  EXPECT_TRUE(mr.owns_pool());
  EXPECT_EQ(mr.device(), 0);
  EXPECT_EQ(mr.ipc_handle(), async_ipc_handle::none);
  CUmemoryPool default_pool = nullptr;
  GPUMEM_CU(cuDeviceGetDefaultMemPool, &default_pool, 0);
  EXPECT_NE(mr.pool_handle(), default_pool);
  EXPECT_EQ(mr.release_threshold(), 64 * MiB);
  EXPECT_EQ(attribute(mr.pool_handle(), CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), 64 * MiB);
  EXPECT_EQ(mr.reuse_policy(), o.reuse);
  mr.set_release_threshold(0);
  EXPECT_EQ(mr.release_threshold(), 0U);
  const async_reuse_policy none{false, false, false};
  mr.set_reuse_policy(none);
  EXPECT_EQ(mr.reuse_policy(), none);
  int value = 1;
  GPUMEM_CU(cuMemPoolGetAttribute, mr.pool_handle(), CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &value);
  EXPECT_EQ(value, 0);
  const resource_properties p = mr.properties();
  EXPECT_EQ(p.device, 0);
  EXPECT_TRUE(p.device_accessible);
  EXPECT_FALSE(p.host_accessible);
  EXPECT_TRUE(p.thread_safe);
}

TEST(AsyncResource, DefaultOptionsKeepEverythingAcrossSynchronisation) {
  async_resource mr(0);
  EXPECT_EQ(mr.release_threshold(), std::numeric_limits<std::size_t>::max());
  EXPECT_EQ(mr.reuse_policy(), async_reuse_policy{});
}

TEST(AsyncResource, ATightLoopOnABusyStreamRunsInConstantMemory) {
  // The stream is kept busy, so none of its frees has been reached; the
  // allocator still hands the freed block to the next allocation on the same
  // stream at once, as stream order makes that safe.
  async_resource mr(0);
  stream s(0);
  // The driver reserves in steps of its own (32 MiB on an H200): what is checked
  // is that the loop's memory does not grow with its length.
  void* busy = mr.allocate(4096, s);
  held_check hold(busy, 4096, 0x11, 200ms, s);
  std::size_t high_early = 0;
  for (int i = 0; i < 2000; ++i) {
    void* p = mr.allocate(MiB, s);
    mr.deallocate(p, MiB, s);
    if (i + 1 == 200) high_early = mr.statistics().reserved_high_bytes;
  }
  const std::size_t high = mr.statistics().reserved_high_bytes;
  EXPECT_EQ(high, high_early) << "the pool grew with the number of iterations";
  EXPECT_LE(high, 64 * MiB);
  EXPECT_EQ(hold.mismatches(), 0U);
  mr.deallocate(busy, 4096, s);
}

TEST(AsyncResource, AnotherStreamGetsAPendingFreeOnlyOnceItIsComplete) {
  // No reuse across streams, no room to grow: b's request can only be served
  // by a's block, which a's work still uses for 200 ms. The resource's last
  // resort (wait for the device, trim, retry) serves it once a's free is done.
  async_resource mr(0, one_block({false, false, false}));
  stream a(0);
  stream b(0);
  void* p = mr.allocate(block, a);
  held_check hold(p, block, 0xA1, 200ms, a);
  mr.deallocate(p, block, a);
  void* q = mr.allocate(block, b);  // a's block, or fresh memory in its place after the trim
  device_fill(q, block, 0x5B, b);
  EXPECT_EQ(hold.mismatches(), 0U) << "b reused memory a was still using";
  mr.deallocate(q, block, b);
  // Two blocks do not fit: out of memory, with the pool's figures.
  void* r = mr.allocate(block, b);
  try {
    mr.allocate(block, b);
    ADD_FAILURE() << "the pool grew past maximum_bytes";
  } catch (const out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find("maximum_bytes"), std::string::npos) << e.what();
  }
  mr.deallocate(r, block, b);
}

TEST(AsyncResource, AnEventDependencyLetsAnotherStreamReuseAPendingFree) {
  async_resource mr(0, one_block({.follow_event_dependencies = true, .allow_opportunistic = false,
                                  .allow_internal_dependencies = false}));
  stream a(0);
  stream b(0);
  void* p = mr.allocate(block, a);
  held_check hold(p, block, 0xA1, 200ms, a);
  mr.deallocate(p, block, a);
  event freed(0);
  freed.record(a);
  b.wait(freed);
  void* q = mr.allocate(block, b);  // b's work runs after a's free
  EXPECT_EQ(q, p);
  device_fill(q, block, 0x5B, b);
  EXPECT_EQ(hold.mismatches(), 0U);
  EXPECT_EQ(device_count_mismatches(q, block, 0x5B, b), 0U);
  mr.deallocate(q, block, b);
}

TEST(AsyncResource, InternalDependenciesMakeTheAllocatingStreamWait) {
  async_resource mr(0, one_block({.follow_event_dependencies = false, .allow_opportunistic = false,
                                  .allow_internal_dependencies = true}));
  stream a(0);
  stream b(0);
  void* p = mr.allocate(block, a);
  held_check hold(p, block, 0xA1, 200ms, a);
  mr.deallocate(p, block, a);
  // No room to grow (the driver would rather grow where it can): it hands b the
  // pending block and makes b wait for a's free.
  void* q = mr.allocate(block, b);
  EXPECT_EQ(q, p);
  device_fill(q, block, 0x5B, b);
  EXPECT_EQ(hold.mismatches(), 0U) << "b's work ran before a's free";
  mr.deallocate(q, block, b);
}

TEST(AsyncResource, TrimGivesMemoryBackToTheDevice) {
  async_resource mr(0);  // keeps everything across synchronisation
  stream s(0);
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(mr.allocate(32 * MiB, s));
  for (void* p : blocks) mr.deallocate(p, 32 * MiB, s);
  s.synchronize();  // trim returns only frees the host has seen complete
  EXPECT_GE(mr.statistics().reserved_bytes, 256 * MiB);
  const std::size_t free_before = device_memory_info(0).free_bytes;

  mr.trim_to(64 * MiB);
  const std::size_t kept = mr.statistics().reserved_bytes;
  EXPECT_GE(kept, 64 * MiB) << "trim_to keeps at least what it is asked to";
  EXPECT_LT(kept, 256 * MiB);
  mr.trim_to(0);
  EXPECT_EQ(mr.statistics().reserved_bytes, 0U);
  const std::size_t free_after = device_memory_info(0).free_bytes;
  EXPECT_GE(free_after, free_before + 192 * MiB) << "the device's free memory rises by what the pool gave back";
}

TEST(AsyncResource, TheReleaseThresholdDecidesWhatASynchronisationKeeps) {
  stream s(0);
  {
    async_options o;
    o.release_threshold_bytes = 0;
    async_resource mr(0, o);
    void* p = mr.allocate(64 * MiB, s);
    mr.deallocate(p, 64 * MiB, s);
    s.synchronize();
    EXPECT_LT(mr.statistics().reserved_bytes, 64 * MiB) << "threshold 0: freed memory goes back at a synchronisation";
  }
  {
    async_options o;
    o.release_threshold_bytes = 32 * MiB;
    async_resource mr(0, o);
    std::vector<void*> blocks;
    for (int i = 0; i < 4; ++i) blocks.push_back(mr.allocate(16 * MiB, s));
    for (void* p : blocks) mr.deallocate(p, 16 * MiB, s);
    s.synchronize();
    const std::size_t reserved = mr.statistics().reserved_bytes;
    EXPECT_GE(reserved, 32 * MiB) << "the threshold's worth stays";
    EXPECT_LE(reserved, 64 * MiB);
  }
}

TEST(AsyncResource, StatisticsAreWhatThePoolAttributesSay) {
  async_resource mr(0);
  stream s(0);
  void* big = mr.allocate(3 * MiB, s);
  void* small = mr.allocate(1, s);
  const async_statistics st = mr.statistics();
  const CUmemoryPool pool = mr.pool_handle();
  EXPECT_EQ(st.used_bytes, attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT));
  EXPECT_EQ(st.reserved_bytes, attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT));
  EXPECT_EQ(st.used_high_bytes, attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH));
  EXPECT_EQ(st.reserved_high_bytes, attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH));
  EXPECT_GE(st.used_bytes, 3 * MiB + 1);
  EXPECT_GE(st.reserved_bytes, st.used_bytes);
  EXPECT_GE(st.used_high_bytes, st.used_bytes);
  EXPECT_GE(st.reserved_high_bytes, st.reserved_bytes);
  EXPECT_EQ(mr.allocated_bytes(), 3 * MiB + 1);
  EXPECT_EQ(mr.allocation_count(), 2U);

  mr.deallocate(big, 3 * MiB, s);
  mr.deallocate(small, 1, s);
  s.synchronize();
  async_statistics after = mr.statistics();
  EXPECT_EQ(after.used_bytes, 0U);
  EXPECT_GE(after.used_high_bytes, 3 * MiB + 1) << "the high watermark remembers";
  mr.reset_high_watermarks();
  after = mr.statistics();
  EXPECT_EQ(after.used_high_bytes, after.used_bytes);
  EXPECT_EQ(after.reserved_high_bytes, after.reserved_bytes);
  EXPECT_EQ(mr.allocation_count(), 0U);
}

TEST(AsyncResource, InitialBytesAreReservedUpFront) {
  async_options o;
  o.initial_bytes = 32 * MiB;
  async_resource mr(0, o);
  const async_statistics st = mr.statistics();
  EXPECT_GE(st.reserved_bytes, 32 * MiB);
  EXPECT_EQ(st.used_bytes, 0U);
  stream s(0);
  void* p = mr.allocate(16 * MiB, s);
  EXPECT_EQ(mr.statistics().reserved_bytes, st.reserved_bytes) << "served from the primed memory";
  mr.deallocate(p, 16 * MiB, s);
}

TEST(AsyncResource, MaximumBytesCapsThePoolWithAClearError) {
  async_options o;
  o.maximum_bytes = 64 * MiB;
  async_resource mr(0, o);
  stream s(0);
  void* p = mr.allocate(48 * MiB, s);
  try {
    mr.allocate(32 * MiB, s);
    ADD_FAILURE() << "the pool grew past maximum_bytes";
  } catch (const out_of_memory& e) {
    EXPECT_EQ(e.requested_bytes(), 32 * MiB);
    EXPECT_EQ(e.info().device, 0);
    EXPECT_NE(std::string(e.what()).find("maximum_bytes"), std::string::npos) << e.what();
  }
  try {
    mr.allocate(128 * MiB, s);
    ADD_FAILURE() << "a request above maximum_bytes succeeded";
  } catch (const out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find("maximum_bytes"), std::string::npos) << e.what();
  }
  mr.deallocate(p, 48 * MiB, s);
  void* again = mr.allocate(32 * MiB, s);  // still usable
  mr.deallocate(again, 32 * MiB, s);
}

TEST(AsyncResource, WrapsTheDefaultPoolWithoutOwningIt) {
  CUmemoryPool default_pool = nullptr;
  GPUMEM_CU(cuDeviceGetDefaultMemPool, &default_pool, 0);
  const std::size_t threshold = [&] {
    async_resource wrapper(existing_pool::device_default, 0);
    EXPECT_EQ(wrapper.pool_handle(), default_pool);
    EXPECT_FALSE(wrapper.owns_pool());
    stream s(0);
    void* p = wrapper.allocate(MiB, s);
    device_fill(p, MiB, 0x3D, s);
    EXPECT_EQ(device_count_mismatches(p, MiB, 0x3D, s), 0U);
    wrapper.deallocate(p, MiB, s);
    return wrapper.release_threshold();
  }();
  // The pool outlives the wrapper.
  EXPECT_EQ(attribute(default_pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), threshold);
  async_resource again(existing_pool::device_default, 0);
  stream s(0);
  void* p = again.allocate(MiB, s);
  again.deallocate(p, MiB, s);
}

TEST(AsyncResource, WrapsTheDevicesCurrentPool) {
  async_resource owner(0);
  CUmemoryPool previous = nullptr;
  GPUMEM_CU(cuDeviceGetMemPool, &previous, 0);
  GPUMEM_CU(cuDeviceSetMemPool, 0, owner.pool_handle());
  {
    async_resource current(existing_pool::device_current, 0);
    EXPECT_EQ(current.pool_handle(), owner.pool_handle());
    EXPECT_FALSE(current.owns_pool());
    stream s(0);
    void* p = current.allocate(MiB, s);
    EXPECT_GE(owner.statistics().used_bytes, MiB);
    current.deallocate(p, MiB, s);
    s.synchronize();
  }
  GPUMEM_CU(cuDeviceSetMemPool, 0, previous);
}

TEST(AsyncResource, TheIpcHandleTypeIsChosenAtCreation) {
  int supported = 0;
  GPUMEM_CU(cuDeviceGetAttribute, &supported, CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, 0);
  async_options o;
  o.ipc = async_ipc_handle::posix_file_descriptor;
  if ((supported & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
    try {
      async_resource mr(0, o);
      ADD_FAILURE() << "an IPC pool on a device without POSIX handle support";
    } catch (const cuda_error& e) {
      EXPECT_EQ(e.result(), CUDA_ERROR_NOT_SUPPORTED);
    }
    return;
  }
  async_resource mr(0, o);
  EXPECT_EQ(mr.ipc_handle(), async_ipc_handle::posix_file_descriptor);
  stream s(0);
  void* p = mr.allocate(MiB, s);
  mr.deallocate(p, MiB, s);
}

TEST(AsyncResource, AccessFromOtherDevices) {
  async_options owner_only;
  owner_only.access_for_every_peer = false;
  async_resource mr(0, owner_only);
  EXPECT_EQ(mr.access_from(0), pool_access::read_write);
  EXPECT_THROW(mr.set_access(0, pool_access::none), logic_error) << "the owner's access cannot change";
  EXPECT_THROW(mr.set_access(device_count(), pool_access::read_write), logic_error);
  EXPECT_THROW(mr.set_access(-1, pool_access::read_write), logic_error);
  EXPECT_THROW(mr.access_from(device_count()), logic_error);
  if (device_count() < 2) GTEST_SKIP() << "peer access needs two devices";
  try {
    mr.set_access(1, pool_access::read_write);
  } catch (const cuda_error& e) {
    GTEST_SKIP() << "devices 0 and 1 cannot access each other's memory: " << e.what();
  }
  EXPECT_EQ(mr.access_from(1), pool_access::read_write);
  // Device 1's work reads and writes the pool's memory.
  stream s0(0);
  stream s1(1);
  void* p = mr.allocate(MiB, s0);
  device_fill(p, MiB, 0x42, s0);
  s0.synchronize();
  EXPECT_EQ(device_count_mismatches(p, MiB, 0x42, s1), 0U);
  device_fill(p, MiB, 0x24, s1);
  s1.synchronize();
  EXPECT_EQ(device_count_mismatches(p, MiB, 0x24, s0), 0U);
  mr.deallocate(p, MiB, s0);
  mr.set_access(1, pool_access::none);
  EXPECT_EQ(mr.access_from(1), pool_access::none);
}

TEST(AsyncResource, EveryPeerGetsAccessUnlessTheOptionsSayNo) {
  if (device_count() < 2 || peers_of(0).empty()) GTEST_SKIP() << "needs two devices with peer access";
  EXPECT_EQ(async_resource(0).access_from(1), pool_access::read_write);
  async_options o;
  o.access_for_every_peer = false;
  EXPECT_EQ(async_resource(0, o).access_from(1), pool_access::none);
}

TEST(AsyncResource, BadOptionsAreLogicErrors) {
  async_options o;
  o.initial_bytes = 64 * MiB;
  o.maximum_bytes = 32 * MiB;
  EXPECT_THROW((async_resource{0, o}), logic_error);
  o.maximum_bytes = 0;
  o.release_threshold_bytes = 16 * MiB;
  EXPECT_THROW((async_resource{0, o}), logic_error) << "primed memory would go back at once";
  EXPECT_THROW(async_resource{device_count()}, logic_error);
  EXPECT_THROW(async_resource{-2}, logic_error);
  EXPECT_THROW((async_resource{existing_pool::device_default, device_count()}), logic_error);
}

TEST(AsyncResource, LiveAllocationsAreReportedAndFreedAtDestruction) {
  stream s(0);
  testing::internal::CaptureStderr();
  {
    async_resource mr(0);
    mr.allocate(MiB, s);
    mr.allocate(3 * MiB, s);
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("2 live allocation(s), 4194304 bytes"), std::string::npos) << err;
}

}  // namespace
}  // namespace gpumem::test
