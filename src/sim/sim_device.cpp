// Simulated devices and primary contexts: cuInit, device queries (with the
// documented attribute table), primary-context retain, current context and
// context synchronization.
#include "sim/sim_device.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

#include "sim/sim_capture_rules.hpp"
#include "sim/sim_entry_points.hpp"
#include "sim/sim_state.hpp"
#include "sim/sim_stream.hpp"

namespace gpumem::detail::simulator {
namespace {

thread_local sim_context* current = nullptr;

// What cuDeviceGetAttribute reports: an H100-like device (compute capability 9.0,
// 132 SMs). Facts about features the simulator does not model (VMM, IPC handles
// of memory, peer access...) say "not supported"; mapped, registered and managed
// host memory and IPC-capable pools (POSIX file descriptors) are modelled. Any attribute not listed
// here gives CUDA_ERROR_INVALID_VALUE. PCI bus id = the device ordinal.
constexpr std::pair<CUdevice_attribute, int> attribute_table[] = {
    {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 64},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, 2147483647},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 65535},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, 65535},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 49152},
    {CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, 65536},
    {CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32},
    {CU_DEVICE_ATTRIBUTE_MAX_PITCH, 2147483647},
    {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, 65536},
    {CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 1980000},
    {CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, 512},
    {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132},
    {CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT, 0},
    {CU_DEVICE_ATTRIBUTE_INTEGRATED, 0},
    {CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, CU_COMPUTEMODE_DEFAULT},
    {CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, 1},
    {CU_DEVICE_ATTRIBUTE_ECC_ENABLED, 0},
    {CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, 0},
    {CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, 0},
    {CU_DEVICE_ATTRIBUTE_TCC_DRIVER, 0},
    {CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, 2619000},
    {CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, 5120},
    {CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 52428800},
    {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 2048},
    {CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, 2},
    {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
    {CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, 233472},
    {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, 65536},
    {CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 1},
    {CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD, 0},
    {CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, 0},
    {CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 1},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, 1},
    {CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, 1},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 232448},
    {CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, 32},
    {CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR},
    {CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, 0},
};

// cuDeviceGet hands out CUdevice = ordinal; anything else is not a device.
sim_device* find_device(sim_state& state, CUdevice device) { return state.device(device); }

}  // namespace

// ---- sim_context ----

std::shared_ptr<sim_stream> sim_context::legacy_stream() {
  std::lock_guard lock(streams_mutex_);
  if (legacy_ == nullptr) {
    legacy_ = sim_stream::start(*this, stream_kind::legacy_default);
    streams_.push_back(legacy_);
  }
  return legacy_;
}

std::shared_ptr<sim_stream> sim_context::started_legacy_stream() const {
  std::lock_guard lock(streams_mutex_);
  return legacy_;
}

void sim_context::add_stream(std::shared_ptr<sim_stream> stream) {
  std::lock_guard lock(streams_mutex_);
  streams_.push_back(std::move(stream));
}

void sim_context::remove_stream(const sim_stream* stream) {
  std::lock_guard lock(streams_mutex_);
  std::erase_if(streams_, [&](const auto& s) { return s.get() == stream; });
}

std::vector<std::shared_ptr<sim_stream>> sim_context::streams() const {
  std::lock_guard lock(streams_mutex_);
  return streams_;
}

void sim_context::synchronize() {
  // A snapshot: waiting must not hold the list's lock, which finishing workers take.
  for (const auto& stream : streams()) stream->synchronize();
}

sim_context* current_context() { return current; }
void set_current_context(sim_context* context) { current = context; }

// ---- entry points ----

CUresult init(unsigned int flags) {
  if (on_worker_thread()) return CUDA_ERROR_NOT_PERMITTED;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  sim_state* state = simulator_state();
  if (state == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return state->initialize();
}

CUresult driver_get_version(int* version) {
  // Like the real driver, answers before cuInit.
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = CUDA_VERSION;
  return CUDA_SUCCESS;
}

CUresult device_get_count(int* count) {
  return entry_point([&](sim_state& state) {
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *count = state.device_count();
    return CUDA_SUCCESS;
  });
}

CUresult device_get(CUdevice* device, int ordinal) {
  return entry_point([&](sim_state& state) {
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (state.device(ordinal) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
  });
}

CUresult device_get_name(char* name, int length, CUdevice device) {
  return entry_point([&](sim_state& state) {
    if (name == nullptr || length <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (find_device(state, device) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    // Truncated to fit, always terminated, as the driver does.
    std::snprintf(name, static_cast<std::size_t>(length), "gpumem simulated device %d", device);
    return CUDA_SUCCESS;
  });
}

CUresult device_get_uuid(CUuuid* uuid, CUdevice device) {
  return entry_point([&](sim_state& state) {
    if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (find_device(state, device) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    // The same in every process (the simulated machine's devices): "gpumem-sim-dev" + ordinal.
    static constexpr char prefix[] = "gpumem-sim-dev";
    static_assert(sizeof(prefix) - 1 + 2 == sizeof(uuid->bytes));
    std::memcpy(uuid->bytes, prefix, sizeof(prefix) - 1);
    uuid->bytes[14] = static_cast<char>((device >> 8) & 0xff);
    uuid->bytes[15] = static_cast<char>(device & 0xff);
    return CUDA_SUCCESS;
  });
}

CUresult device_can_access_peer(int* can_access, CUdevice device, CUdevice peer) {
  return entry_point([&](sim_state& state) {
    if (can_access == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (find_device(state, device) == nullptr || find_device(state, peer) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    // Every device's memory is host memory, so peers can always reach each other unless
    // the configuration says they cannot (to test what callers do on such machines).
    *can_access = device != peer && state.peer_access.load(std::memory_order_relaxed) ? 1 : 0;
    return CUDA_SUCCESS;
  });
}

CUresult device_total_mem(std::size_t* bytes, CUdevice device) {
  return entry_point([&](sim_state& state) {
    if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    sim_device* d = find_device(state, device);
    if (d == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = d->memory.capacity();
    return CUDA_SUCCESS;
  });
}

CUresult device_get_attribute(int* value, CUdevice_attribute attribute, CUdevice device) {
  return entry_point([&](sim_state& state) {
    if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (find_device(state, device) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    if (attribute == CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) {
      *value = device;
      return CUDA_SUCCESS;
    }
    for (const auto& [known, known_value] : attribute_table) {
      if (known == attribute) {
        *value = known_value;
        return CUDA_SUCCESS;
      }
    }
    return CUDA_ERROR_INVALID_VALUE;
  });
}

CUresult device_primary_ctx_retain(CUcontext* context, CUdevice device) {
  return entry_point([&](sim_state& state) {
    if (context == nullptr) return CUDA_ERROR_INVALID_VALUE;
    sim_device* d = find_device(state, device);
    if (d == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    d->context.retain();
    *context = to_handle(&d->context);
    return CUDA_SUCCESS;
  });
}

CUresult ctx_get_current(CUcontext* context) {
  return entry_point([&](sim_state&) {
    if (context == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *context = to_handle(current_context());
    return CUDA_SUCCESS;
  });
}

CUresult ctx_set_current(CUcontext context) {
  return entry_point([&](sim_state& state) {
    if (context == nullptr) {
      set_current_context(nullptr);
      return CUDA_SUCCESS;
    }
    sim_context* c = state.find_context(context);
    if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    set_current_context(c);
    return CUDA_SUCCESS;
  });
}

CUresult ctx_get_device(CUdevice* device) {
  return entry_point([&](sim_state&) {
    sim_context* context = nullptr;
    if (CUresult r = require_current_context(context); r != CUDA_SUCCESS) return r;
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *device = context->device();
    return CUDA_SUCCESS;
  });
}

CUresult ctx_synchronize() {
  return entry_point([&](sim_state& state) {
    sim_context* context = nullptr;
    if (CUresult r = require_current_context(context); r != CUDA_SUCCESS) return r;
    // Forbidden in every mode while one of its streams is captured (sim_capture_rules.hpp).
    if (CUresult r = context_synchronize_permitted(context->device()); r != CUDA_SUCCESS) return r;
    context->synchronize();
    // Every free on the context's streams is now seen complete: a synchronization point for the pools.
    observe_synchronization(state, host_observation::of_context(context->device()));
    return CUDA_SUCCESS;
  });
}

// cuCtxEnablePeerAccess / cuCtxDisablePeerAccess: the checks the driver makes, in its order.
namespace {

CUresult change_peer_access(sim_state& state, CUcontext peer, unsigned flags, bool enable) {
  sim_context* context = nullptr;
  if (CUresult r = require_current_context(context); r != CUDA_SUCCESS) return r;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  sim_context* other = state.find_context(peer);
  if (other == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (other->device() == context->device()) return CUDA_ERROR_INVALID_DEVICE;
  if (enable) {
    if (!state.peer_access.load(std::memory_order_relaxed)) return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    return context->enable_peer(other->device()) ? CUDA_SUCCESS : CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
  }
  return context->disable_peer(other->device()) ? CUDA_SUCCESS : CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
}

}  // namespace

bool sim_context::enable_peer(int device) {
  std::lock_guard lock(peers_mutex_);
  if (std::find(peers_.begin(), peers_.end(), device) != peers_.end()) return false;
  peers_.push_back(device);
  return true;
}

bool sim_context::disable_peer(int device) {
  std::lock_guard lock(peers_mutex_);
  auto it = std::find(peers_.begin(), peers_.end(), device);
  if (it == peers_.end()) return false;
  peers_.erase(it);
  return true;
}

CUresult ctx_enable_peer_access(CUcontext peer, unsigned flags) {
  return entry_point([&](sim_state& state) { return change_peer_access(state, peer, flags, true); });
}

CUresult ctx_disable_peer_access(CUcontext peer) {
  return entry_point([&](sim_state& state) { return change_peer_access(state, peer, 0, false); });
}

}  // namespace gpumem::detail::simulator
