// The simulator's process-wide state (configuration, devices, live handles, fault
// injection) and the guard every entry point runs through.
//
// The state is created once and deliberately never destroyed: stream workers
// may still run at process exit, and must never meet destroyed statics.
#pragma once

#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <system_error>
#include <vector>

#include <cuda.h>

#include "sim/sim_config.hpp"
#include "sim/sim_device.hpp"
#include "sim/sim_fault_injection.hpp"
#include "sim/sim_handles.hpp"
#include "sim/sim_host_memory.hpp"
#include "sim/sim_pool.hpp"
#include "sim/sim_vmm.hpp"

namespace gpumem::detail::simulator {

class sim_stream;
class sim_event;

class sim_state {
 public:
  explicit sim_state(const sim_config& config);

  const sim_config config;
  fault_injector faults;
  handle_registry<sim_stream> streams;
  handle_registry<sim_event> events;
  pool_registry pools;
  host_memory host;
  std::unique_ptr<vmm_space> vmm;  // set by initialize()
  // What cuDeviceCanAccessPeer answers for two different devices (GPUMEM_SIM_PEER_ACCESS,
  // gpumem::sim::set_peer_access).
  std::atomic<bool> peer_access;
  // Whether a capture watch can start (gpumem::sim::set_capture_watch_available):
  // false stands for a process whose CUPTI subscription a profiler holds.
  std::atomic<bool> capture_watch_available{true};

  // cuInit: builds the devices (reserving their address space) the first time.
  // CUDA_ERROR_OUT_OF_MEMORY if the host cannot reserve it.
  CUresult initialize();
  bool initialized() const { return initialized_.load(std::memory_order_acquire); }

  // Valid once initialized; the device list never changes after that.
  int device_count() const { return static_cast<int>(devices_.size()); }
  sim_device* device(int ordinal) const;  // null when out of range
  sim_context* find_context(CUcontext handle) const;

 private:
  std::mutex init_mutex_;
  std::atomic<bool> initialized_{false};
  std::vector<std::unique_ptr<sim_device>> devices_;
};

// Creates the state on the first call (later calls ignore `config`).
sim_state& start_simulator(const sim_config& config);
// The state, or null before start_simulator.
sim_state* simulator_state() noexcept;

// Stream workers mark their thread: host functions run there and must not call the driver.
void mark_worker_thread() noexcept;
bool on_worker_thread() noexcept;

// Runs an entry point's body: refuses calls from host functions
// (CUDA_ERROR_NOT_PERMITTED) and before cuInit (CUDA_ERROR_NOT_INITIALIZED),
// and turns exceptions into CUresults so none crosses the C interface.
template <class Body>
CUresult entry_point(Body&& body) noexcept {
  if (on_worker_thread()) return CUDA_ERROR_NOT_PERMITTED;
  sim_state* state = simulator_state();
  if (state == nullptr || !state->initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  try {
    return body(*state);
  } catch (const std::bad_alloc&) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  } catch (const std::system_error&) {
    return CUDA_ERROR_OUT_OF_MEMORY;  // no thread for a worker: out of host resources
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

// For entry points that need a current context: CUDA_ERROR_INVALID_CONTEXT without one.
inline CUresult require_current_context(sim_context*& context) {
  context = current_context();
  return context != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

}  // namespace gpumem::detail::simulator
