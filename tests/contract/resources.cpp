// The resources the contract suite checks.
#include "contract/resources.hpp"

#include "gpumem/adaptors/deferred_free.hpp"
#include "gpumem/adaptors/limiting.hpp"
#include "gpumem/adaptors/logging.hpp"
#include "gpumem/adaptors/oom_retry.hpp"
#include "gpumem/adaptors/statistics.hpp"
#include "gpumem/adaptors/thread_safe.hpp"
#include "gpumem/adaptors/tracking.hpp"
#include "gpumem/async_resource.hpp"
#include "gpumem/config.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/current_resource.hpp"
#include "gpumem/device.hpp"
#include "gpumem/vmm/virtual_memory.hpp"
#include "gpumem/managed_resource.hpp"
#include "gpumem/pinned_host_resource.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/vmm_pool_resource.hpp"

namespace gpumem::test {

const std::vector<resource_factory>& all_resources() {
  static const std::vector<resource_factory> list = {
      {"cuda_resource", [](int device) { return std::make_shared<cuda_resource>(device); }},
      {"pool_resource", [](int device) {
         return std::make_shared<pool_resource>(std::make_shared<cuda_resource>(device));
       }},
      {"pool_resource_small_chunks", [](int device) {
         // Many small chunks and frequent fences: exercises growth, stealing and merging.
         pool_options o;
         o.min_chunk_bytes = 1 << 20;
         o.max_chunk_bytes = 4 << 20;
         o.fence_interval = 1;
         return std::make_shared<pool_resource>(std::make_shared<cuda_resource>(device), o);
       }},
      {"pool_resource_watching_captures", [](int device) {
         pool_options o;
         o.watch_captures = true;  // the capture watch instead of a query per call
         return std::make_shared<pool_resource>(std::make_shared<cuda_resource>(device), o);
       }},
      // Adaptors (docs/observability.md), over a pool and over cuda_resource.
      {"statistics_over_pool", [](int device) {
         return std::make_shared<statistics_adaptor>(std::make_shared<pool_resource>(std::make_shared<cuda_resource>(device)));
       }},
      {"statistics_over_cuda", [](int device) {
         return std::make_shared<statistics_adaptor>(std::make_shared<cuda_resource>(device));
       }},
      {"tracking_over_pool", [](int device) {
         tracking_options o;
         o.capture_stacks = true;
         o.report_at_exit = false;  // the contract tests leave nothing live; keep stderr quiet anyway
         return std::make_shared<tracking_adaptor>(std::make_shared<pool_resource>(std::make_shared<cuda_resource>(device)), o);
       }},
      {"logging_over_cuda", [](int device) {
         return std::make_shared<logging_adaptor>(std::make_shared<cuda_resource>(device), "/dev/null");
       }},
      {"logging_over_pool", [](int device) {
         return std::make_shared<logging_adaptor>(std::make_shared<pool_resource>(std::make_shared<cuda_resource>(device)),
                                                  "/dev/null", logging_options{"app", true});
       }},
      {"limiting_over_pool", [](int device) {
         return std::make_shared<limiting_adaptor>(std::make_shared<pool_resource>(std::make_shared<cuda_resource>(device)),
                                                   std::size_t{1} << 30);
       }},
      {"oom_retry_over_pool", [](int device) {
         auto r = std::make_shared<oom_retry_adaptor>(std::make_shared<pool_resource>(std::make_shared<cuda_resource>(device)));
         r->add_callback([](const oom_event& e) { return e.attempt < 2; });  // one harmless retry
         return r;
       }},
      {"deferred_free_over_pool", [](int device) {
         return std::make_shared<deferred_free_adaptor>(std::make_shared<pool_resource>(std::make_shared<cuda_resource>(device)),
                                                        deferred_free_options{});
       }},
      {"deferred_free_over_cuda", [](int device) {
         deferred_free_options o;
         o.max_pending_count = 3;
         return std::make_shared<deferred_free_adaptor>(std::make_shared<cuda_resource>(device), o);
       }},
      {"thread_safe_over_pool", [](int device) {
         return std::make_shared<thread_safe_adaptor>(std::make_shared<pool_resource>(std::make_shared<cuda_resource>(device)));
       }},
      {"every_adaptor_stacked", [](int device) {
         // What GPUMEM_CONF builds with every option: log(stats(track(defer(limit(pool(log(cuda))))))).
         return make_resource_from_config("pool,limit=90%,defer,track,stats,log=/dev/null", device);
       }},
      // Basic resources (docs/resources.md): the driver's pools, managed and pinned host memory.
      {"async_resource", [](int device) { return std::make_shared<async_resource>(device); }},
      {"async_resource_default_pool", [](int device) {
         return std::make_shared<async_resource>(existing_pool::device_default, device);
       }},
      {"async_resource_no_cross_stream_reuse", [](int device) {
         async_options o;
         o.reuse = {.follow_event_dependencies = false, .allow_opportunistic = false,
                    .allow_internal_dependencies = false};
         o.release_threshold_bytes = 0;
         return std::make_shared<async_resource>(device, o);
       }},
      {"managed_resource", [](int device) { return std::make_shared<managed_resource>(device); }},
      {"managed_resource_host_attach", [](int device) {
         return std::make_shared<managed_resource>(device, managed_attach::host);
       }},
      // Host memory: device -1; the suite reaches it from the device through its device pointer.
      {"pinned_host_resource", [](int device) { return std::make_shared<pinned_host_resource>(pinned_options{}, device); }},
      {"pinned_host_resource_portable_write_combined", [](int device) {
         return std::make_shared<pinned_host_resource>(
             pinned_options{.portable = true, .device_mapped = true, .write_combined = true}, device);
       }},
      // Virtual memory (docs/vmm.md): the paged pool, gpumem's default.
      {"vmm_pool_resource", [](int device) { return std::make_shared<vmm_pool_resource>(device); }},
      {"default_resource", [](int device) { return make_default_resource(device); }},
      // Pages of four granules, segments of 64 MiB (a stream reserves several), a budget.
      {"vmm_pool_resource_large_pages_small_segments", [](int device) {
         vmm_pool_options o;
         o.page_bytes = 4 * vmm::granularity(device);
         o.segment_bytes = std::size_t{64} << 20;
         o.maximum_bytes = device_memory_info(device).total_bytes / 2;
         return std::make_shared<vmm_pool_resource>(device, o);
       }},
      // No quick cache, no reuse across streams, everything given back above nothing.
      {"vmm_pool_resource_no_cache_no_sharing_no_threshold", [](int device) {
         vmm_pool_options o;
         o.quick_cache = false;
         o.reuse_across_streams = false;
         o.release_threshold_bytes = 0;
         return std::make_shared<vmm_pool_resource>(device, o);
       }},
      {"vmm_pool_resource_watching_captures", [](int device) {
         vmm_pool_options o;
         o.watch_captures = true;
         return std::make_shared<vmm_pool_resource>(device, o);
       }},
      {"vmm_pool_resource_fence_every_free", [](int device) {
         vmm_pool_options o;
         o.fence_interval = 1;
         return std::make_shared<vmm_pool_resource>(device, o);
       }},
  };
  return list;
}

}  // namespace gpumem::test
