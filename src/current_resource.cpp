// Per-device current resource (include/gpumem/current_resource.hpp).
#include "gpumem/current_resource.hpp"

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>

#include "driver/driver.hpp"
#include "gpumem/config.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/vmm/virtual_memory.hpp"
#include "gpumem/vmm_pool_resource.hpp"

namespace gpumem {
namespace {

constexpr int max_devices = 64;

struct registry {
  std::mutex mutex;
  std::array<std::shared_ptr<memory_resource>, max_devices> current;
  // Raised by every set_current_resource (under the mutex): a thread's cached
  // answer (below) of an older generation is stale.
  std::atomic<std::uint64_t> generation{1};
};

// The last answer of get_current_resource on this thread. Most callers ask for
// the same device's resource at every allocation (DeviceBuffer, the framework
// hooks), and the registry's mutex costs as much as the pool's hot path. A weak
// reference: a thread that stops asking keeps no replaced resource alive.
struct cached_answer {
  std::uint64_t generation = 0;
  int device = -1;
  std::weak_ptr<memory_resource> resource;
};
thread_local cached_answer last_answer;

// Leaked on purpose: resources may be released by other static destructors
// (Python's interpreter teardown, say) after this would have been destroyed.
registry& the_registry() {
  static auto* r = new registry;
  return *r;
}

int resolve(int device, const char* where) {
  const int d = device == -1 ? current_device() : device;
  detail::validate_device(d, where);
  return d;
}

// GPUMEM_CONF, when set, describes the default (docs/configuration.md); a bad
// string is a logic_error from the first get_current_resource, naming the token.
std::shared_ptr<memory_resource> make_default(int device) {
  const char* conf = std::getenv("GPUMEM_CONF");
  if (conf != nullptr && *conf != '\0') return make_resource_from_config(conf, device);
  return make_default_resource(device);
}

}  // namespace

std::shared_ptr<memory_resource> make_default_resource(int device) {
  const int d = resolve(device, "gpumem::make_default_resource");
  if (vmm::supported(d)) return std::make_shared<vmm_pool_resource>(d);
  return std::make_shared<pool_resource>(std::make_shared<cuda_resource>(d));
}

std::shared_ptr<memory_resource> get_current_resource(int device) {
  const int d = resolve(device, "gpumem::get_current_resource");
  registry& r = the_registry();
  cached_answer& last = last_answer;
  if (last.device == d && last.generation == r.generation.load(std::memory_order_acquire)) {
    // A set_current_resource racing with this call may or may not be seen, as
    // with the mutex; a resource it replaced is returned only while still alive.
    if (std::shared_ptr<memory_resource> known = last.resource.lock()) return known;
  }
  std::lock_guard lock(r.mutex);
  if (!r.current[d]) r.current[d] = make_default(d);
  last = {r.generation.load(std::memory_order_relaxed), d, r.current[d]};
  return r.current[d];
}

std::shared_ptr<memory_resource> set_current_resource(int device,
                                                      std::shared_ptr<memory_resource> resource) {
  const int d = resolve(device, "gpumem::set_current_resource");
  if (resource && resource->properties().device != d) {
    throw logic_error("gpumem::set_current_resource: the resource hands out memory of device " +
                      std::to_string(resource->properties().device) + ", not of device " +
                      std::to_string(d));
  }
  registry& r = the_registry();
  std::lock_guard lock(r.mutex);
  std::shared_ptr<memory_resource> previous = std::move(r.current[d]);
  r.current[d] = std::move(resource);  // null: the default is made again on next use
  r.generation.fetch_add(1, std::memory_order_release);
  return previous;
}

}  // namespace gpumem
