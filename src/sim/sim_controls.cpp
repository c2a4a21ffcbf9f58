// The public simulator controls (include/gpumem/sim.hpp): fault injection and
// accounting queries, for tests and tools. They refuse to work unless the
// simulator is the selected backend.
#include "gpumem/sim.hpp"

#include <string>

#include "driver/driver.hpp"
#include "gpumem/error.hpp"
#include "sim/sim_driver.hpp"
#include "sim/sim_state.hpp"

namespace gpumem::sim {
namespace {

using detail::simulator::sim_device;
using detail::simulator::sim_state;

// driver() selects the backend from the environment on first use.
sim_state& simulator(const char* where) {
  if (detail::driver().kind != backend_kind::sim) {
    throw logic_error(std::string("gpumem::sim::") + where +
                      ": the simulator is not the selected backend (set GPUMEM_BACKEND=sim or "
                      "select_backend(backend_choice::sim))");
  }
  return *detail::simulator::simulator_state();
}

sim_device& device_of(const char* where, int device) {
  sim_state& state = simulator(where);
  sim_device* d = state.device(device);
  if (d == nullptr) {
    throw logic_error(std::string("gpumem::sim::") + where + ": device " + std::to_string(device) +
                      " does not exist (" + std::to_string(state.device_count()) +
                      " simulated device(s))");
  }
  return *d;
}

}  // namespace

void fail_nth_allocation(std::uint64_t n) { simulator("fail_nth_allocation").faults.fail_nth(n); }

void fail_nth_mapping(std::uint64_t n) { simulator("fail_nth_mapping").faults.fail_nth_mapping(n); }

void fail_allocations_at_random(double probability, std::uint64_t seed) {
  sim_state& state = simulator("fail_allocations_at_random");
  if (!(probability >= 0.0 && probability <= 1.0)) {
    throw logic_error("gpumem::sim::fail_allocations_at_random: probability " +
                      std::to_string(probability) + " is not in [0, 1]");
  }
  state.faults.fail_at_random(probability, seed);
}

std::uint64_t injected_failures() { return simulator("injected_failures").faults.injected_failures(); }

void set_peer_access(bool enabled) {
  simulator("set_peer_access").peer_access.store(enabled, std::memory_order_relaxed);
}

void set_capture_watch_available(bool available) {
  simulator("set_capture_watch_available").capture_watch_available.store(available, std::memory_order_relaxed);
}

std::size_t used_bytes(int device) { return device_of("used_bytes", device).memory.used_bytes(); }

std::uint64_t driver_calls(std::string_view entry_point) {
  simulator("driver_calls");
  if (const std::optional<std::uint64_t> n = detail::sim_driver_calls(entry_point)) return *n;
  throw logic_error("gpumem::sim::driver_calls: '" + std::string(entry_point) +
                    "' is not a driver entry point gpumem calls (src/driver/entry_points.hpp)");
}

std::size_t live_allocations(int device) {
  return device_of("live_allocations", device).memory.live_allocations();
}

}  // namespace gpumem::sim
