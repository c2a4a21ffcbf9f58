// The simulator's implementation of every driver entry point, one function each
// with cuda.h's signature (sim_driver.cpp puts them in the driver_api table,
// whose member types check the signatures). Grouped by the file defining them.
#pragma once

#include <cstddef>

#include <cuda.h>

namespace gpumem::detail::simulator {

// sim_device.cpp: initialization, devices, contexts.
CUresult init(unsigned int flags);
CUresult driver_get_version(int* version);
CUresult device_get_count(int* count);
CUresult device_get(CUdevice* device, int ordinal);
CUresult device_get_name(char* name, int length, CUdevice device);
CUresult device_total_mem(std::size_t* bytes, CUdevice device);
CUresult device_get_attribute(int* value, CUdevice_attribute attribute, CUdevice device);
CUresult device_get_uuid(CUuuid* uuid, CUdevice device);
CUresult device_can_access_peer(int* can_access, CUdevice device, CUdevice peer);
CUresult ctx_enable_peer_access(CUcontext peer, unsigned flags);
CUresult ctx_disable_peer_access(CUcontext peer);
CUresult device_primary_ctx_retain(CUcontext* context, CUdevice device);
CUresult ctx_get_current(CUcontext* context);
CUresult ctx_set_current(CUcontext context);
CUresult ctx_get_device(CUdevice* device);
CUresult ctx_synchronize();

// sim_errors.cpp
CUresult get_error_name(CUresult error, const char** name);
CUresult get_error_string(CUresult error, const char** text);

// sim_stream.cpp
CUresult stream_create(CUstream* stream, unsigned int flags);
CUresult stream_create_with_priority(CUstream* stream, unsigned int flags, int priority);
CUresult stream_destroy(CUstream stream);
CUresult stream_get_device(CUstream stream, CUdevice* device);
CUresult stream_synchronize(CUstream stream);
CUresult stream_query(CUstream stream);
CUresult launch_host_func(CUstream stream, CUhostFn fn, void* user_data);
CUresult stream_begin_capture(CUstream stream, CUstreamCaptureMode mode);
CUresult stream_end_capture(CUstream stream, CUgraph* graph);
CUresult stream_is_capturing(CUstream stream, CUstreamCaptureStatus* status);
CUresult stream_get_capture_info(CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                                 const CUgraphNode** dependencies, const CUgraphEdgeData** edge_data,
                                 std::size_t* dependency_count);
CUresult graph_destroy(CUgraph graph);
CUresult graph_instantiate_with_flags(CUgraphExec* exec, CUgraph graph, unsigned long long flags);
CUresult graph_launch(CUgraphExec exec, CUstream stream);
CUresult graph_exec_destroy(CUgraphExec exec);
// sim_graph.cpp
CUresult user_object_create(CUuserObject* object, void* ptr, CUhostFn destroy, unsigned int initial_references,
                            unsigned int flags);
CUresult user_object_release(CUuserObject object, unsigned int count);
CUresult graph_retain_user_object(CUgraph graph, CUuserObject object, unsigned int count, unsigned int flags);
CUresult device_graph_mem_trim(CUdevice device);

// sim_event.cpp
CUresult event_create(CUevent* event, unsigned int flags);
CUresult event_destroy(CUevent event);
CUresult event_record(CUevent event, CUstream stream);
CUresult event_query(CUevent event);
CUresult event_synchronize(CUevent event);
CUresult event_elapsed_time(float* milliseconds, CUevent start, CUevent end);
CUresult stream_wait_event(CUstream stream, CUevent event, unsigned int flags);

// sim_memory.cpp
CUresult mem_alloc(CUdeviceptr* pointer, std::size_t bytes);
CUresult mem_alloc_managed(CUdeviceptr* pointer, std::size_t bytes, unsigned int flags);
CUresult mem_free(CUdeviceptr pointer);
CUresult mem_get_info(std::size_t* free, std::size_t* total);
CUresult mem_get_address_range(CUdeviceptr* base, std::size_t* size, CUdeviceptr pointer);
CUresult pointer_get_attribute(void* data, CUpointer_attribute attribute, CUdeviceptr pointer);

// sim_pool.cpp
CUresult mem_alloc_async(CUdeviceptr* pointer, std::size_t bytes, CUstream stream);
CUresult mem_alloc_from_pool_async(CUdeviceptr* pointer, std::size_t bytes, CUmemoryPool pool, CUstream stream);
CUresult mem_free_async(CUdeviceptr pointer, CUstream stream);
CUresult device_get_default_mem_pool(CUmemoryPool* pool, CUdevice device);
CUresult device_get_mem_pool(CUmemoryPool* pool, CUdevice device);
CUresult device_set_mem_pool(CUdevice device, CUmemoryPool pool);
CUresult mem_pool_create(CUmemoryPool* pool, const CUmemPoolProps* props);
CUresult mem_pool_destroy(CUmemoryPool pool);
CUresult mem_pool_set_attribute(CUmemoryPool pool, CUmemPool_attribute attribute, void* value);
CUresult mem_pool_get_attribute(CUmemoryPool pool, CUmemPool_attribute attribute, void* value);
CUresult mem_pool_trim_to(CUmemoryPool pool, std::size_t min_bytes_to_keep);
CUresult mem_pool_set_access(CUmemoryPool pool, const CUmemAccessDesc* map, std::size_t count);
CUresult mem_pool_get_access(CUmemAccess_flags* flags, CUmemoryPool pool, CUmemLocation* location);

// sim_host_memory.cpp
CUresult mem_host_alloc(void** pointer, std::size_t bytes, unsigned int flags);
CUresult mem_free_host(void* pointer);
CUresult mem_host_get_device_pointer(CUdeviceptr* device_pointer, void* pointer, unsigned int flags);
CUresult mem_host_get_flags(unsigned int* flags, void* pointer);
CUresult mem_host_register(void* pointer, std::size_t bytes, unsigned int flags);
CUresult mem_host_unregister(void* pointer);

// sim_copy.cpp
CUresult memcpy_sync(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes);
CUresult memcpy_async(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes, CUstream stream);
CUresult memset_d8_sync(CUdeviceptr dst, unsigned char value, std::size_t count);
CUresult memset_d8_async(CUdeviceptr dst, unsigned char value, std::size_t count, CUstream stream);

// sim_vmm.cpp
CUresult mem_get_allocation_granularity(std::size_t* granularity, const CUmemAllocationProp* prop,
                                        CUmemAllocationGranularity_flags option);
CUresult mem_address_reserve(CUdeviceptr* ptr, std::size_t size, std::size_t alignment, CUdeviceptr addr,
                             unsigned long long flags);
CUresult mem_address_free(CUdeviceptr ptr, std::size_t size);
CUresult mem_create(CUmemGenericAllocationHandle* handle, std::size_t size, const CUmemAllocationProp* prop,
                    unsigned long long flags);
CUresult mem_release(CUmemGenericAllocationHandle handle);
CUresult mem_map(CUdeviceptr ptr, std::size_t size, std::size_t offset, CUmemGenericAllocationHandle handle,
                 unsigned long long flags);
CUresult mem_unmap(CUdeviceptr ptr, std::size_t size);
CUresult mem_set_access(CUdeviceptr ptr, std::size_t size, const CUmemAccessDesc* desc, std::size_t count);
CUresult mem_get_access(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr);
CUresult mem_retain_allocation_handle(CUmemGenericAllocationHandle* handle, void* addr);
CUresult mem_export_to_shareable_handle(void* shareable_handle, CUmemGenericAllocationHandle handle,
                                        CUmemAllocationHandleType type, unsigned long long flags);
CUresult mem_import_from_shareable_handle(CUmemGenericAllocationHandle* handle, void* os_handle,
                                          CUmemAllocationHandleType type);

// sim_ipc.cpp
CUresult ipc_get_mem_handle(CUipcMemHandle* handle, CUdeviceptr pointer);
CUresult ipc_open_mem_handle(CUdeviceptr* pointer, CUipcMemHandle handle, unsigned int flags);
CUresult ipc_close_mem_handle(CUdeviceptr pointer);
CUresult mem_pool_export_to_shareable_handle(void* handle_out, CUmemoryPool pool, CUmemAllocationHandleType type,
                                             unsigned long long flags);
CUresult mem_pool_import_from_shareable_handle(CUmemoryPool* pool_out, void* handle, CUmemAllocationHandleType type,
                                               unsigned long long flags);
CUresult mem_pool_export_pointer(CUmemPoolPtrExportData* data_out, CUdeviceptr pointer);
CUresult mem_pool_import_pointer(CUdeviceptr* pointer_out, CUmemoryPool pool, CUmemPoolPtrExportData* data);

// sim_module.cpp: modules and kernel launches, which the simulator does not run.
CUresult module_load_data(CUmodule* module, const void* image);
CUresult module_unload(CUmodule module);
CUresult module_get_function(CUfunction* function, CUmodule module, const char* name);
CUresult launch_kernel(CUfunction f, unsigned int grid_x, unsigned int grid_y, unsigned int grid_z,
                       unsigned int block_x, unsigned int block_y, unsigned int block_z,
                       unsigned int shared_bytes, CUstream stream, void** params, void** extra);

}  // namespace gpumem::detail::simulator
