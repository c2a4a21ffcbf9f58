// The simulator's process-wide state (see sim_state.hpp).
#include "sim/sim_state.hpp"

namespace gpumem::detail::simulator {
namespace {

std::atomic<sim_state*> the_state{nullptr};
std::mutex start_mutex;
thread_local bool is_worker_thread = false;

}  // namespace

sim_state::sim_state(const sim_config& configuration) : config(configuration), peer_access(configuration.peer_access) {
  faults.fail_nth(config.fail_nth_allocation);
  faults.fail_at_random(config.fail_probability, config.seed);
}

CUresult sim_state::initialize() {
  std::lock_guard lock(init_mutex_);
  if (initialized()) return CUDA_SUCCESS;
  try {
    std::vector<std::unique_ptr<sim_device>> devices;
    for (int ordinal = 0; ordinal < config.device_count; ++ordinal) {
      devices.push_back(std::make_unique<sim_device>(ordinal, config.memory_per_device, config.device_count));
    }
    std::vector<device_address_space*> memories;
    for (const auto& d : devices) memories.push_back(&d->memory);
    auto space = std::make_unique<vmm_space>(std::move(memories));
    devices_ = std::move(devices);
    vmm = std::move(space);
    for (const auto& d : devices_) pools.add(&d->default_pool);
  } catch (const host_reservation_failed&) {
    return CUDA_ERROR_OUT_OF_MEMORY;  // nothing kept: a later cuInit may try again
  } catch (const std::bad_alloc&) {
    return CUDA_ERROR_OUT_OF_MEMORY;  // the host's own memory, for the devices' bookkeeping
  }
  initialized_.store(true, std::memory_order_release);
  return CUDA_SUCCESS;
}

sim_device* sim_state::device(int ordinal) const {
  if (ordinal < 0 || ordinal >= device_count()) return nullptr;
  return devices_[static_cast<std::size_t>(ordinal)].get();
}

sim_context* sim_state::find_context(CUcontext handle) const {
  for (const auto& d : devices_) {
    if (to_handle(&d->context) == handle) return &d->context;
  }
  return nullptr;
}

sim_state& start_simulator(const sim_config& config) {
  std::lock_guard lock(start_mutex);
  sim_state* state = the_state.load(std::memory_order_acquire);
  if (state == nullptr) {
    state = new sim_state(config);  // never deleted: see sim_state.hpp
    the_state.store(state, std::memory_order_release);
  }
  return *state;
}

sim_state* simulator_state() noexcept { return the_state.load(std::memory_order_acquire); }

void mark_worker_thread() noexcept { is_worker_thread = true; }
bool on_worker_thread() noexcept { return is_worker_thread; }

}  // namespace gpumem::detail::simulator
