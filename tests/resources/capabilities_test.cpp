// Capabilities (memory_resource.hpp): what a resource declares beyond the contract
// is answered by a whole stack, adaptors forwarding it, so that callers (IPC
// export, Python's memory_info, describing a stack) never switch on types.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "gpumem/adaptors/limiting.hpp"
#include "gpumem/adaptors/logging.hpp"
#include "gpumem/adaptors/statistics.hpp"
#include "gpumem/async_resource.hpp"
#include "gpumem/config.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/ipc.hpp"
#include "gpumem/managed_resource.hpp"
#include "gpumem/pinned_host_resource.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/stream.hpp"
#include "gpumem/vmm/virtual_memory.hpp"
#include "gpumem/vmm_pool_resource.hpp"

namespace gpumem::test {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

std::vector<std::string> layers_of(const memory_resource& top) {
  std::vector<std::string> out;
  for (const memory_resource* r = &top; r != nullptr; r = r->next_layer()) out.emplace_back(r->layer_name());
  return out;
}

TEST(Capabilities, TheLayersOfAStackAreNamedAsGpumemConfNamesThem) {
  const auto mr = make_resource_from_config("pool,stats,limit=1GiB", 0);
  EXPECT_EQ(layers_of(*mr), (std::vector<std::string>{"stats", "limit", "pool", "cuda"}))
      << describe_config("pool,stats,limit=1GiB");
  const pinned_host_resource host;
  EXPECT_EQ(layers_of(host), std::vector<std::string>{"pinned_host"});
}

TEST(Capabilities, AvailableBytesComeThroughAdaptorsAndALimitCapsThem) {
  auto pool = std::make_shared<pool_resource>(std::make_shared<cuda_resource>(0));
  stream s(0);
  void* p = pool->allocate(8 * MiB, s);
  pool->deallocate(p, 8 * MiB, s);
  s.synchronize();
  // The pool holds its free memory: the device's free memory plus that.
  const std::optional<std::size_t> from_pool = pool->available_bytes();
  ASSERT_TRUE(from_pool.has_value());
  EXPECT_GE(*from_pool, device_memory_info(0).free_bytes + pool->statistics().free_bytes - 64 * MiB);
  statistics_adaptor stats(pool);
  ASSERT_TRUE(stats.available_bytes().has_value());
  const auto limited = std::make_shared<limiting_adaptor>(pool, 4 * MiB);
  statistics_adaptor over_limit(limited);
  void* q = over_limit.allocate(MiB, s);
  EXPECT_EQ(over_limit.available_bytes(), std::optional<std::size_t>{3 * MiB});
  over_limit.deallocate(q, MiB, s);
  s.synchronize();
}

TEST(Capabilities, AResourceThatCannotSaySaysSoThroughTheStack) {
  auto managed = std::make_shared<managed_resource>(0);
  EXPECT_EQ(managed->available_bytes(), std::nullopt);
  limiting_adaptor limited(managed, 4 * MiB);
  EXPECT_EQ(limited.available_bytes(), std::nullopt) << "the device may have less than the limit leaves";
}

TEST(Capabilities, ReleasingFreeMemoryReachesThePoolUnderAdaptors) {
  auto pool = std::make_shared<pool_resource>(std::make_shared<cuda_resource>(0));
  statistics_adaptor stats(pool);
  stream s(0);
  void* p = stats.allocate(32 * MiB, s);
  stats.deallocate(p, 32 * MiB, s);
  s.synchronize();
  ASSERT_GT(pool->statistics().reserved_bytes, 0U);
  EXPECT_EQ(stats.release_free_memory(), 32 * MiB);
  EXPECT_EQ(pool->statistics().reserved_bytes, 0U);
  cuda_resource plain(0);
  EXPECT_EQ(plain.release_free_memory(), 0U) << "holds nothing free";
}

TEST(Capabilities, TheWayToExportIsTheBaseResourcesThroughAdaptors) {
  stream s(0);
  auto managed = std::make_shared<managed_resource>(0);
  statistics_adaptor over_managed(managed);
  EXPECT_EQ(over_managed.ipc_route(nullptr, 1).how, ipc_export_route::way::refused);
  void* m = over_managed.allocate(MiB, s);
  try {
    (void)export_allocation(over_managed, m, MiB);
    ADD_FAILURE() << "managed memory exported";
  } catch (const ipc_error& e) {
    EXPECT_NE(std::string(e.what()).find("managed"), std::string::npos) << e.what();
  }
  over_managed.deallocate(m, MiB, s);

  auto cuda = std::make_shared<cuda_resource>(0);
  statistics_adaptor over_cuda(cuda);
  EXPECT_EQ(over_cuda.ipc_route(nullptr, 1).how, ipc_export_route::way::ask_the_driver);

  if (vmm::supported(0)) {
    auto vmm_pool = std::make_shared<vmm_pool_resource>(0);  // shareable by default
    statistics_adaptor over_vmm(vmm_pool);
    void* p = over_vmm.allocate(3 * MiB, s);
    const ipc_export_route route = over_vmm.ipc_route(p, 3 * MiB);
    EXPECT_EQ(route.how, ipc_export_route::way::pages);
    EXPECT_EQ(route.device, 0);
    std::size_t covered = 0;
    for (const auto& piece : route.pieces) covered += piece.second;
    EXPECT_GE(covered, 3 * MiB);
    const ipc_handle h = export_allocation(over_vmm, p, 3 * MiB);
    EXPECT_EQ(h.kind(), ipc_kind::vmm);
    over_vmm.deallocate(p, 3 * MiB, s);
    vmm_pool_options unshared;
    unshared.posix_fd_shareable = false;
    auto private_pool = std::make_shared<vmm_pool_resource>(0, unshared);
    statistics_adaptor over_private(private_pool);
    EXPECT_EQ(over_private.ipc_route(nullptr, 1).how, ipc_export_route::way::refused);
  }
  s.synchronize();
}

}  // namespace
}  // namespace gpumem::test
