// libgpumem-bench-rmm.so: RMM's resources for gpumem-bench (plugin_api.hpp,
// rmm_peer.hpp). RMM's logger is turned off: W4's bisection makes RMM fail on
// purpose dozens of times, and each failure would print a line.
#include <cuda_runtime_api.h>

#include <rmm/logger.hpp>
#include <rmm/version_config.hpp>

#include <stdexcept>
#include <string>
#include <string_view>

#include "peers/rmm_peer.hpp"

namespace gpumem::bench::rmm_peers {

void use_device(int device) {
  const cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("cudaSetDevice: ") + cudaGetErrorName(e) + ": " +
                             cudaGetErrorString(e));
  }
}

namespace {

class rmm_library final : public plugin::library {
 public:
  rmm_library() { rmm::default_logger().set_level(rapids_logger::level_enum::off); }

  const char* version() const noexcept override { return "RMM " RMM_VERSION; }

  bool has(const char* peer) const noexcept override {
    for (std::string_view row : {plugin::rmm_pool, plugin::rmm_arena, plugin::rmm_arena_free,
                                 plugin::rmm_binning, plugin::rmm_cuda_async}) {
      if (row == peer) return true;
    }
    return false;
  }

  plugin::allocator* create(const char* peer, int device) override {
    const std::string_view row = peer;
    if (row == plugin::rmm_pool) return make_pool(device);
    if (row == plugin::rmm_arena) return make_arena(device, false);
    if (row == plugin::rmm_arena_free) return make_arena(device, true);
    if (row == plugin::rmm_binning) return make_binning(device);
    if (row == plugin::rmm_cuda_async) return make_cuda_async(device);
    return nullptr;
  }
};

}  // namespace
}  // namespace gpumem::bench::rmm_peers

extern "C" __attribute__((visibility("default"))) gpumem::bench::plugin::library* gpumem_bench_plugin(
    int api_version) {
  if (api_version != gpumem::bench::plugin::api_version) return nullptr;
  static gpumem::bench::rmm_peers::rmm_library library;
  return &library;
}
