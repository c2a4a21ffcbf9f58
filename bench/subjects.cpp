// The rows of every table: gpumem's resources first, then the peers they are
// measured against, then the reference rows (never a best peer). Adding a row
// is one line here (a peer also gets a file in peers/). A resource built on an
// upstream needs a factory that owns both.
#include <memory>

#include "bench.hpp"
#include "gpumem/async_resource.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/current_resource.hpp"
#include "gpumem/managed_resource.hpp"
#include "gpumem/pinned_host_resource.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/vmm_pool_resource.hpp"
#include "peers/peers.hpp"
#include "peers/plugin_peers.hpp"

namespace gpumem::bench {
namespace {

// A gpumem resource whose constructor takes just the device.
template <class Resource>
std::shared_ptr<memory_resource> on_device(int device) {
  return std::make_unique<Resource>(device);
}

std::shared_ptr<memory_resource> pool_over_cuda(int device) {
  return std::make_unique<pool_resource>(std::make_shared<cuda_resource>(device));
}

// The same pool without the per-call capture query (pool_options::check_capture):
// what the check costs, for programs that never capture a stream the pool serves.
std::shared_ptr<memory_resource> pool_without_capture_check(int device) {
  pool_options o;
  o.check_capture = false;
  return std::make_unique<pool_resource>(std::make_shared<cuda_resource>(device), o);
}

// The same pool learning of captures from the capture watch (capture_watch.hpp):
// the check is one load while no capture is in progress. Where the watch cannot
// start (no libcupti, a profiler holding CUPTI), this row is the default pool.
std::shared_ptr<memory_resource> pool_watching_captures(int device) {
  pool_options o;
  o.watch_captures = true;
  return std::make_unique<pool_resource>(std::make_shared<cuda_resource>(device), o);
}

// Exactly what a program gets when GPUMEM_CONF is unset (current_resource.hpp).
std::shared_ptr<memory_resource> default_stack(int device) { return make_default_resource(device); }

// The paged pool learning of captures from the capture watch, as the pool row above.
std::shared_ptr<memory_resource> vmm_pool_watching_captures(int device) {
  vmm_pool_options o;
  o.watch_captures = true;
  return std::make_shared<vmm_pool_resource>(device, o);
}

// Page-locked host memory, device-mapped (the default options): a host row,
// skipped where a workload fills device memory (W4), like the malloc reference.
std::shared_ptr<memory_resource> pinned_host(int device) {
  return std::make_unique<pinned_host_resource>(pinned_options{}, device);
}

constexpr subject subjects[] = {
    {default_subject_name, subject_kind::gpumem, &default_stack},
    {"gpumem vmm_pool_resource (capture watch)", subject_kind::gpumem, &vmm_pool_watching_captures, nullptr, true},
    {pool_subject_name, subject_kind::gpumem, &pool_over_cuda},
    {"gpumem pool_resource (check_capture off)", subject_kind::gpumem, &pool_without_capture_check, nullptr, true},
    {"gpumem pool_resource (capture watch)", subject_kind::gpumem, &pool_watching_captures, nullptr, true},
    {"gpumem cuda_resource", subject_kind::gpumem, &on_device<cuda_resource>},
    {vmm_pool_subject_name, subject_kind::gpumem, &on_device<vmm_pool_resource>},
    {async_subject_name, subject_kind::gpumem, &on_device<async_resource>},
    {"gpumem managed_resource", subject_kind::gpumem, &on_device<managed_resource>},
    {"gpumem pinned_host_resource", subject_kind::gpumem, &pinned_host},
    {cumemalloc_subject_name, subject_kind::peer, &peers::make_raw_cumemalloc},
    {"cuMemAllocAsync", subject_kind::peer, &peers::make_raw_cumemallocasync},
    // Peers from plugins (peers/plugin_peers.hpp): present where their plugin was built.
    peers::plugin_subject<plugin::rmm_library, plugin::rmm_pool>(),
    peers::plugin_subject<plugin::rmm_library, plugin::rmm_arena>(),
    peers::plugin_subject<plugin::rmm_library, plugin::rmm_arena_free>(),
    peers::plugin_subject<plugin::rmm_library, plugin::rmm_binning>(),
    peers::plugin_subject<plugin::rmm_library, plugin::rmm_cuda_async>(),
    peers::plugin_subject<plugin::torch_library, plugin::torch_caching>(),
    peers::plugin_subject<plugin::torch_library, plugin::torch_expandable>(),
    {malloc_subject_name, subject_kind::reference, &peers::make_malloc_reference},
};

}  // namespace

std::span<const subject> all_subjects() { return subjects; }

}  // namespace gpumem::bench
