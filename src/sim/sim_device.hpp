// Simulated devices and their primary contexts, and the calling thread's
// current context.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include <cuda.h>

#include "sim/sim_address_space.hpp"
#include "sim/sim_pool.hpp"

namespace gpumem::detail::simulator {

class sim_stream;

// A device's primary context (CUcontext is its address). It owns the device's
// legacy default stream and knows every stream of the device that still has a
// worker, for cuCtxSynchronize, cuMemFree and the legacy-stream rules.
class sim_context {
 public:
  explicit sim_context(int device) : device_(device) {}
  int device() const { return device_; }

  // cuDevicePrimaryCtxRetain: counted, but primary contexts are never destroyed.
  void retain() { retain_count_.fetch_add(1, std::memory_order_relaxed); }

  // The legacy default stream (handle 0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD);
  // its worker starts on first use, so unused devices cost no thread.
  std::shared_ptr<sim_stream> legacy_stream();
  // The legacy default stream if its worker has started, else null.
  std::shared_ptr<sim_stream> started_legacy_stream() const;

  // Streams register themselves while they have a worker (destroyed streams
  // stay until their queued work is done).
  void add_stream(std::shared_ptr<sim_stream> stream);
  void remove_stream(const sim_stream* stream);
  std::vector<std::shared_ptr<sim_stream>> streams() const;

  // Waits for all work queued so far on every stream of the context.
  void synchronize();

  // cuCtxEnablePeerAccess / cuCtxDisablePeerAccess towards `device`'s context:
  // false when it already was enabled / was not. Recorded only: the simulator's
  // device work is host code, which reaches every device's memory.
  bool enable_peer(int device);
  bool disable_peer(int device);

 private:
  const int device_;
  std::atomic<std::uint64_t> retain_count_{0};
  mutable std::mutex streams_mutex_;
  std::shared_ptr<sim_stream> legacy_;
  std::vector<std::shared_ptr<sim_stream>> streams_;
  std::mutex peers_mutex_;
  std::vector<int> peers_;  // devices whose context this one has peer access to
};

struct sim_device {
  sim_device(int device_ordinal, std::size_t memory_bytes, int device_count)
      : ordinal(device_ordinal),
        memory(device_ordinal, memory_bytes),
        context(device_ordinal),
        default_pool(memory, device_count, /*is_default=*/true, CU_MEM_HANDLE_TYPE_NONE, 0),
        current_pool(&default_pool) {}

  const int ordinal;
  device_address_space memory;
  sim_context context;
  sim_pool default_pool;
  std::atomic<sim_pool*> current_pool;  // cuDeviceGetMemPool / cuDeviceSetMemPool
};

inline CUcontext to_handle(sim_context* context) { return reinterpret_cast<CUcontext>(context); }

// The calling thread's current context (cuCtxGetCurrent/SetCurrent); null if none.
sim_context* current_context();
void set_current_context(sim_context* context);

}  // namespace gpumem::detail::simulator
