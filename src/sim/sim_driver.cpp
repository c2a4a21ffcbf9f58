// The simulator's driver table: reads the configuration, creates the simulator,
// initializes it as the real loader would (cuInit), and wires every entry point.
#include "sim/sim_driver.hpp"

#include <atomic>
#include <cstdint>
#include <string>

#include "gpumem/error.hpp"
#include "sim/sim_capture_rules.hpp"
#include "sim/sim_config.hpp"
#include "sim/sim_entry_points.hpp"
#include "sim/sim_state.hpp"

namespace gpumem::detail {
namespace {

// Every entry point of the table is a trampoline that counts the call and then
// calls the simulator's function, so that tests can assert which driver calls
// a path makes (gpumem::sim::driver_calls): a relaxed increment, on the
// simulator only.
namespace counted {
#define GPUMEM_SIM_COUNTED_ENTRY(name, version)             \
  std::atomic<std::uint64_t> calls_##name{0};               \
  decltype(&::name) simulated_##name = nullptr;             \
  template <class>                                          \
  struct entry_##name;                                      \
  template <class R, class... A>                            \
  struct entry_##name<R (*)(A...)> {                        \
    static R call(A... args) {                              \
      calls_##name.fetch_add(1, std::memory_order_relaxed); \
      return simulated_##name(args...);                     \
    }                                                       \
  };
GPUMEM_DRIVER_ENTRY_POINTS(GPUMEM_SIM_COUNTED_ENTRY)
#undef GPUMEM_SIM_COUNTED_ENTRY
}  // namespace counted

void count_every_call(driver_api& table) {
#define GPUMEM_SIM_COUNT_ENTRY(name, version) \
  counted::simulated_##name = table.name;     \
  table.name = &counted::entry_##name<decltype(table.name)>::call;
  GPUMEM_DRIVER_ENTRY_POINTS(GPUMEM_SIM_COUNT_ENTRY)
#undef GPUMEM_SIM_COUNT_ENTRY
}

driver_api build_sim_driver_table() {
  using namespace simulator;
  const sim_config config = read_config_from_environment();  // throws logic_error if malformed
  start_simulator(config);

  driver_api table;
  table.kind = backend_kind::sim;
  // cuda.h maps some names to versioned symbols (cuMemAlloc -> cuMemAlloc_v2...);
  // the members are spelled the same way, so they line up. Assigning checks each
  // function's signature against cuda.h's.
  table.cuInit = &init;
  table.cuDriverGetVersion = &driver_get_version;
  table.cuGetErrorName = &get_error_name;
  table.cuGetErrorString = &get_error_string;
  table.cuDeviceGetCount = &device_get_count;
  table.cuDeviceGet = &device_get;
  table.cuDeviceGetName = &device_get_name;
  table.cuDeviceTotalMem = &device_total_mem;
  table.cuDeviceGetAttribute = &device_get_attribute;
  table.cuDevicePrimaryCtxRetain = &device_primary_ctx_retain;
  table.cuCtxGetCurrent = &ctx_get_current;
  table.cuCtxSetCurrent = &ctx_set_current;
  table.cuCtxGetDevice = &ctx_get_device;
  table.cuCtxSynchronize = &ctx_synchronize;
  table.cuStreamCreate = &stream_create;
  table.cuStreamCreateWithPriority = &stream_create_with_priority;
  table.cuStreamDestroy = &stream_destroy;
  table.cuStreamGetDevice = &stream_get_device;
  table.cuStreamSynchronize = &stream_synchronize;
  table.cuStreamQuery = &stream_query;
  table.cuStreamIsCapturing = &stream_is_capturing;
  table.cuStreamBeginCapture = &stream_begin_capture;
  table.cuThreadExchangeStreamCaptureMode = &thread_exchange_stream_capture_mode;
  table.cuStreamEndCapture = &stream_end_capture;
  table.cuGraphDestroy = &graph_destroy;
  table.cuGraphInstantiateWithFlags = &graph_instantiate_with_flags;
  table.cuGraphLaunch = &graph_launch;
  table.cuGraphExecDestroy = &graph_exec_destroy;
  table.cuStreamGetCaptureInfo = &stream_get_capture_info;
  table.cuUserObjectCreate = &user_object_create;
  table.cuUserObjectRelease = &user_object_release;
  table.cuGraphRetainUserObject = &graph_retain_user_object;
  table.cuDeviceGraphMemTrim = &device_graph_mem_trim;
  table.cuStreamWaitEvent = &stream_wait_event;
  table.cuLaunchHostFunc = &launch_host_func;
  table.cuEventCreate = &event_create;
  table.cuEventDestroy = &event_destroy;
  table.cuEventRecord = &event_record;
  table.cuEventQuery = &event_query;
  table.cuEventSynchronize = &event_synchronize;
  table.cuEventElapsedTime = &event_elapsed_time;
  table.cuMemAlloc = &mem_alloc;
  table.cuMemAllocManaged = &mem_alloc_managed;
  table.cuMemFree = &mem_free;
  table.cuMemAllocAsync = &mem_alloc_async;
  table.cuMemAllocFromPoolAsync = &mem_alloc_from_pool_async;
  table.cuMemFreeAsync = &mem_free_async;
  table.cuDeviceGetDefaultMemPool = &device_get_default_mem_pool;
  table.cuDeviceGetMemPool = &device_get_mem_pool;
  table.cuDeviceSetMemPool = &device_set_mem_pool;
  table.cuMemPoolCreate = &mem_pool_create;
  table.cuMemPoolDestroy = &mem_pool_destroy;
  table.cuMemPoolSetAttribute = &mem_pool_set_attribute;
  table.cuMemPoolGetAttribute = &mem_pool_get_attribute;
  table.cuMemPoolTrimTo = &mem_pool_trim_to;
  table.cuMemPoolSetAccess = &mem_pool_set_access;
  table.cuMemPoolGetAccess = &mem_pool_get_access;
  table.cuMemHostAlloc = &mem_host_alloc;
  table.cuMemFreeHost = &mem_free_host;
  table.cuMemHostGetDevicePointer = &mem_host_get_device_pointer;
  table.cuMemHostGetFlags = &mem_host_get_flags;
  table.cuMemHostRegister = &mem_host_register;
  table.cuMemHostUnregister = &mem_host_unregister;
  table.cuMemGetInfo = &mem_get_info;
  table.cuMemGetAddressRange = &mem_get_address_range;
  table.cuPointerGetAttribute = &pointer_get_attribute;
  table.cuMemcpy = &memcpy_sync;
  table.cuMemcpyAsync = &memcpy_async;
  table.cuMemsetD8 = &memset_d8_sync;
  table.cuMemsetD8Async = &memset_d8_async;
  table.cuMemGetAllocationGranularity = &mem_get_allocation_granularity;
  table.cuMemAddressReserve = &mem_address_reserve;
  table.cuMemAddressFree = &mem_address_free;
  table.cuMemCreate = &mem_create;
  table.cuMemRelease = &mem_release;
  table.cuMemMap = &mem_map;
  table.cuMemUnmap = &mem_unmap;
  table.cuMemSetAccess = &mem_set_access;
  table.cuMemGetAccess = &mem_get_access;
  table.cuMemRetainAllocationHandle = &mem_retain_allocation_handle;
  table.cuModuleLoadData = &module_load_data;
  table.cuModuleUnload = &module_unload;
  table.cuModuleGetFunction = &module_get_function;
  table.cuLaunchKernel = &launch_kernel;
  table.cuMemExportToShareableHandle = &mem_export_to_shareable_handle;
  table.cuMemImportFromShareableHandle = &mem_import_from_shareable_handle;
  table.cuDeviceGetUuid = &device_get_uuid;
  table.cuDeviceCanAccessPeer = &device_can_access_peer;
  table.cuCtxEnablePeerAccess = &ctx_enable_peer_access;
  table.cuCtxDisablePeerAccess = &ctx_disable_peer_access;
  table.cuIpcGetMemHandle = &ipc_get_mem_handle;
  table.cuIpcOpenMemHandle = &ipc_open_mem_handle;
  table.cuIpcCloseMemHandle = &ipc_close_mem_handle;
  table.cuMemPoolExportToShareableHandle = &mem_pool_export_to_shareable_handle;
  table.cuMemPoolImportFromShareableHandle = &mem_pool_import_from_shareable_handle;
  table.cuMemPoolExportPointer = &mem_pool_export_pointer;
  table.cuMemPoolImportPointer = &mem_pool_import_pointer;

  // The real loader calls cuInit too; gpumem's driver() does not for either backend.
  if (table.cuInit(0) != CUDA_SUCCESS) {
    throw logic_error("gpumem simulator: cannot reserve host address space for GPUMEM_SIM_DEVICES=" +
                      std::to_string(config.device_count) + " devices of GPUMEM_SIM_MEMORY=" +
                      std::to_string(config.memory_per_device) + " bytes; lower them");
  }
  return table;
}

// An entry point added to entry_points.hpp but not wired above would be a null
// call later; refuse to hand out such a table.
bool every_entry_point_set(const driver_api& table) {
#define GPUMEM_SIM_CHECK_ENTRY(name, version) &&table.name != nullptr
  return true GPUMEM_DRIVER_ENTRY_POINTS(GPUMEM_SIM_CHECK_ENTRY);
#undef GPUMEM_SIM_CHECK_ENTRY
}

}  // namespace

const driver_api& sim_driver_table() {
  // If building throws (malformed GPUMEM_SIM_*), the next call tries again and throws again.
  static const driver_api table = [] {
    driver_api t = build_sim_driver_table();
    if (!every_entry_point_set(t)) throw logic_error("gpumem simulator: an entry point is not wired");
    count_every_call(t);
    return t;
  }();
  return table;
}

std::optional<std::uint64_t> sim_driver_calls(std::string_view entry_point) noexcept {
#define GPUMEM_SIM_CALLS_OF(name, version) \
  if (entry_point == #name) return counted::calls_##name.load(std::memory_order_relaxed);
  GPUMEM_DRIVER_ENTRY_POINTS(GPUMEM_SIM_CALLS_OF)
#undef GPUMEM_SIM_CALLS_OF
  return std::nullopt;
}

}  // namespace gpumem::detail
