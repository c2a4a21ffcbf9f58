// The CUDA driver entry points gpumem uses: the whole surface of the driver seam.
//
// Every backend (the real driver, loaded at run time, and the host simulator) fills
// one table with exactly these functions, with cuda.h's signatures. Code outside
// src/driver and src/sim calls the driver only through this table (see driver.hpp).
//
// What gpumem relies on, per entry point (pre => post). "ctx" means the calling
// thread has a current context; gpumem makes a device's primary context current
// with device_context_guard before every call that needs one.
//
//  cuInit                      once, by the loader                => driver usable
//  cuDriverGetVersion          -                                  => CUDA version of the driver
//  cuDeviceGetCount/Get        initialised                        => ordinals 0..n-1
//  cuDeviceGetName/TotalMem/GetAttribute   valid ordinal          => static facts
//  cuDevicePrimaryCtxRetain    valid ordinal                      => the device's primary context
//  cuCtxGetCurrent/SetCurrent  -                                  => thread's current context
//  cuCtxGetDevice              ctx                                => ordinal of the current context
//  cuCtxSynchronize            ctx                                => all work of the context done
//  cuStreamCreate(WithPriority)/Destroy   ctx                     => stream of the ctx's device;
//                              destroy returns at once, queued work still runs
//  cuStreamGetDevice           valid stream (0 = legacy default of ctx) => device of the stream
//  cuStreamSynchronize/Query   valid stream                       => done / CUDA_ERROR_NOT_READY
//  cuStreamWaitEvent           valid stream and event             => later work on the stream
//                              starts after the event's last record completed (not the host)
//  cuStreamIsCapturing         valid stream                       => whether work queued on it now is
//                              captured into a graph instead of run (the pools refuse to serve it)
//  cuThreadExchangeStreamCaptureMode   -                         => the calling thread's capture
//                              interaction mode swapped (relaxed: a capture in progress elsewhere
//                              does not forbid its queries, waits and cuMemAlloc/Free; capture_interaction.hpp)
//  cuStreamBeginCapture/EndCapture, cuGraphDestroy   (tests only) a stream other than the legacy
//                              default => capture begins / ends with a graph / the graph is freed
//  cuGraphInstantiateWithFlags, cuGraphLaunch, cuGraphExecDestroy   (tests only) a graph => an
//                              executable graph / launched on a stream / freed
//  cuStreamGetCaptureInfo      valid stream                       => its capture status, the capture's id
//                              and the graph being captured (which takes user objects meanwhile)
//  cuUserObjectCreate/Release, cuGraphRetainUserObject   => an object whose destroy function runs, on a
//                              driver thread, once its last reference goes; a graph's reference goes when
//                              the graph and every executable made from it are destroyed and their
//                              launches done (measured: docs/pool.md, "CUDA graphs")
//  cuDeviceGraphMemTrim        valid ordinal                      => the driver's cache of graph memory
//                              that no graph holds goes back to the device
//  cuMemAllocAsync/FreeAsync under capture   => an allocation / a free node: the graph's memory;
//                              such memory is also freed by cuMemFreeAsync outside the capture
//  cuLaunchHostFunc            valid stream                       => fn runs in stream order on a
//                              driver thread; fn must not call the driver
//  cuEventCreate/Destroy/Record/Query/Synchronize/ElapsedTime
//                              ctx (create), valid event          => an event never recorded counts
//                              as complete; record captures the work queued on the stream so far
//  cuMemAlloc/cuMemFree        ctx                                => device memory of the ctx's device,
//                              256-byte aligned at least; cuMemFree may synchronize the device
//  cuMemAllocAsync/FreeAsync   ctx, stream of the ctx's device    => stream-ordered, from the device's
//                              current pool; a free is reusable at once by later allocations on its
//                              stream, by other streams per the pool's REUSE_* attributes
//  cuMemAllocFromPoolAsync     valid pool and stream (any device)  => stream-ordered, from that pool
//  cuDeviceGetDefaultMemPool, cuDeviceGetMemPool/SetMemPool
//                              valid ordinal (and a pool of that device) => the default / current pool
//  cuMemPoolCreate/Destroy     props of a device pool              => a pool gpumem owns; destroy
//                              returns at once, memory goes back once every allocation is freed
//  cuMemPoolSetAttribute, cuMemPoolGetAttribute, cuMemPoolTrimTo, cuMemPoolSetAccess/GetAccess
//                              valid pool                          => memory above the release threshold
//                              returns at stream/event/context synchronization; trim returns free
//                              memory whose frees the host has seen complete; the owning device's
//                              access cannot be changed (CUDA_ERROR_INVALID_DEVICE)
//  cuMemAllocManaged           ctx, flags GLOBAL or HOST           => managed memory; cuMemFree frees it
//  cuMemHostAlloc/cuMemFreeHost  ctx                               => page-locked host memory; with
//                              unified addressing its device pointer is the host pointer unless
//                              write-combined (ask cuMemHostGetDevicePointer)
//  cuMemHostGetDevicePointer   ctx, memory allocated/registered as DEVICEMAP => device pointer
//  cuMemHostGetFlags           ctx, pointer in a cuMemHostAlloc allocation   => its flags
//  cuMemHostRegister/Unregister  ctx                               => the range is page-locked until
//                              unregistered; overlap: CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
//                              unknown range: CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
//  cuMemGetInfo                ctx                                => free and total of ctx's device
//  cuMemGetAddressRange        ctx, pointer inside a cuMemAlloc   => base and size of the allocation
//  cuPointerGetAttribute       any pointer                        => CUDA_ERROR_INVALID_VALUE for
//                              memory the driver does not know
//  cuMemcpy/cuMemcpyAsync      unified addressing (both backends) => bytes copied, in stream order
//  cuMemsetD8/cuMemsetD8Async  device pointer                     => bytes set, in stream order
//  cuGetErrorName/String       any CUresult                       => static strings
//  Virtual memory management (src/vmm; the simulator's model is in src/sim/sim_vmm.hpp):
//  cuMemGetAllocationGranularity  prop of device memory            => granularity (2 MiB on H100/H200)
//  cuMemAddressReserve/Free    size a granularity multiple         => a range of addresses, nothing
//                              mapped; the address argument is a hint only; free the exact range
//                              reserved, after unmapping everything in it
//  cuMemCreate/cuMemRelease    prop of device memory, size a granularity multiple
//                              => physical memory counted against the device; it returns to the
//                              device once released AND unmapped everywhere
//  cuMemMap/cuMemUnmap         inside one reservation, over nothing mapped / whole mappings
//                              => addresses backed; neither waits for work in flight: gpumem orders
//                              unmap after the frees it covers (docs/vmm.md)
//  cuMemSetAccess/GetAccess    a fully mapped range                => per-device access; mapped
//                              memory is inaccessible until access is set
//  cuMemRetainAllocationHandle an address inside a mapping         => its handle, one more reference
//  Kernels (gpumem-bench's W8 only; the library launches none; the simulator answers
//  CUDA_ERROR_NOT_SUPPORTED):
//  cuModuleLoadData/Unload     ctx, a PTX or cubin image           => a module of the ctx (PTX is
//                              compiled by the driver's JIT for the device)
//  cuModuleGetFunction         valid module, a kernel's name       => the kernel
//  cuLaunchKernel              ctx, kernel of a module of the ctx  => the kernel queued on the stream
//  Sharing memory between processes (src/ipc, docs/ipc.md; the simulator's model is in src/sim/sim_ipc.hpp):
//  cuDeviceGetUuid             valid ordinal                       => the device's identity across processes
//  cuDeviceCanAccessPeer       two valid ordinals                  => 1 if the first can access the second's
//                              memory (peer access over NVLink or PCIe), else 0; 0 for one device and itself
//  cuCtxEnablePeerAccess/DisablePeerAccess  ctx, another device's primary ctx, flags 0 => every
//                              cuMemAlloc allocation of that ctx reachable from this ctx's kernels (or no
//                              longer); _ALREADY_ENABLED / _NOT_ENABLED when it already is / is not. Only
//                              gpumem-bench's W9 calls them: gpumem grants access per allocation
//                              (cuMemSetAccess, cuMemPoolSetAccess), never for a whole context.
//  cuIpcGetMemHandle           ctx, base of a cuMemAlloc allocation => a handle naming the whole allocation
//  cuIpcOpenMemHandle          ctx, a handle of another process    => its base mapped here; the same
//                              handle twice in one process, or in the exporter: an error
//  cuIpcCloseMemHandle         ctx, a pointer cuIpcOpenMemHandle returned => unmapped
//  cuMemPoolExportToShareableHandle/ImportFromShareableHandle  a pool created with the POSIX fd
//                              handle type                         => an fd the caller owns / the pool here
//  cuMemPoolExportPointer/ImportPointer  the start of a block of an exported pool => 64 bytes / the block
//                              mapped here (freed with cuMemFree before the exporter frees it)
//  cuMemExportToShareableHandle/ImportFromShareableHandle  a VMM handle created with the POSIX fd
//                              handle type                         => an fd the caller owns / a handle here
#pragma once

#include <cuda.h>

// Each entry names the ABI version gpumem calls (cudaTypedefs.h's PFN_<name>_v<version>):
// cuGetProcAddress is asked for exactly that version, and driver.cpp checks at
// compile time that it is the signature gpumem calls. Asking for "the CUDA version
// of the headers" is not enough: at 13000, cuCtxSynchronize and cuCtxGetDevice
// resolve to new two-argument versions while cuda.h still declares the old ones.
#define GPUMEM_DRIVER_ENTRY_POINTS(X) \
  X(cuInit, 2000)                          \
  X(cuDriverGetVersion, 2020)              \
  X(cuGetErrorName, 6000)                  \
  X(cuGetErrorString, 6000)                \
  X(cuDeviceGetCount, 2000)                \
  X(cuDeviceGet, 2000)                     \
  X(cuDeviceGetName, 2000)                 \
  X(cuDeviceTotalMem, 3020)                \
  X(cuDeviceGetAttribute, 2000)            \
  X(cuDevicePrimaryCtxRetain, 7000)        \
  X(cuCtxGetCurrent, 4000)                 \
  X(cuCtxSetCurrent, 4000)                 \
  X(cuCtxGetDevice, 2000)                  \
  X(cuCtxSynchronize, 2000)                \
  X(cuStreamCreate, 2000)                  \
  X(cuStreamCreateWithPriority, 5050)      \
  X(cuStreamDestroy, 4000)                 \
  X(cuStreamGetDevice, 12080)               \
  X(cuStreamSynchronize, 2000)             \
  X(cuStreamQuery, 2000)                   \
  X(cuStreamWaitEvent, 3020)               \
  X(cuLaunchHostFunc, 10000)                \
  X(cuStreamIsCapturing, 10000)             \
  X(cuStreamGetCaptureInfo, 12030)          \
  X(cuStreamBeginCapture, 10010)            \
  X(cuThreadExchangeStreamCaptureMode, 10010) \
  X(cuStreamEndCapture, 10000)              \
  X(cuGraphDestroy, 10000)                  \
  X(cuGraphInstantiateWithFlags, 11040)     \
  X(cuGraphLaunch, 10000)                   \
  X(cuGraphExecDestroy, 10000)              \
  X(cuUserObjectCreate, 11030)              \
  X(cuUserObjectRelease, 11030)             \
  X(cuGraphRetainUserObject, 11030)         \
  X(cuDeviceGraphMemTrim, 11040)            \
  X(cuEventCreate, 2000)                   \
  X(cuEventDestroy, 4000)                  \
  X(cuEventRecord, 2000)                   \
  X(cuEventQuery, 2000)                    \
  X(cuEventSynchronize, 2000)              \
  X(cuEventElapsedTime, 12080)              \
  X(cuMemAlloc, 3020)                      \
  X(cuMemFree, 3020)                       \
  X(cuMemAllocAsync, 11020)                 \
  X(cuMemAllocFromPoolAsync, 11020)         \
  X(cuMemFreeAsync, 11020)                  \
  X(cuDeviceGetDefaultMemPool, 11020)       \
  X(cuDeviceGetMemPool, 11020)              \
  X(cuDeviceSetMemPool, 11020)              \
  X(cuMemPoolCreate, 11020)                 \
  X(cuMemPoolDestroy, 11020)                \
  X(cuMemPoolSetAttribute, 11020)           \
  X(cuMemPoolGetAttribute, 11020)           \
  X(cuMemPoolTrimTo, 11020)                 \
  X(cuMemPoolSetAccess, 11020)              \
  X(cuMemPoolGetAccess, 11020)              \
  X(cuMemAllocManaged, 6000)                \
  X(cuMemHostAlloc, 2020)                   \
  X(cuMemFreeHost, 2000)                    \
  X(cuMemHostGetDevicePointer, 3020)        \
  X(cuMemHostGetFlags, 2030)                \
  X(cuMemHostRegister, 6050)                \
  X(cuMemHostUnregister, 4000)              \
  X(cuMemGetInfo, 3020)                    \
  X(cuMemGetAddressRange, 3020)            \
  X(cuPointerGetAttribute, 4000)           \
  X(cuMemcpy, 4000)                        \
  X(cuMemcpyAsync, 4000)                   \
  X(cuMemsetD8, 3020)                      \
  X(cuMemsetD8Async, 3020)                 \
  X(cuMemGetAllocationGranularity, 10020)   \
  X(cuMemAddressReserve, 10020)             \
  X(cuMemAddressFree, 10020)                \
  X(cuMemCreate, 10020)                     \
  X(cuMemRelease, 10020)                    \
  X(cuMemMap, 10020)                        \
  X(cuMemUnmap, 10020)                      \
  X(cuMemSetAccess, 10020)                  \
  X(cuMemGetAccess, 10020)                  \
  X(cuMemRetainAllocationHandle, 11000)     \
  X(cuModuleLoadData, 2000)                 \
  X(cuModuleUnload, 2000)                   \
  X(cuModuleGetFunction, 2000)              \
  X(cuLaunchKernel, 4000)     \
  X(cuMemExportToShareableHandle, 10020)    \
  X(cuMemImportFromShareableHandle, 10020)  \
  X(cuDeviceGetUuid, 11040)                 \
  X(cuDeviceCanAccessPeer, 4000)            \
  X(cuCtxEnablePeerAccess, 4000)            \
  X(cuCtxDisablePeerAccess, 4000)           \
  X(cuIpcGetMemHandle, 4010)                \
  X(cuIpcOpenMemHandle, 11000)              \
  X(cuIpcCloseMemHandle, 4010)              \
  X(cuMemPoolExportToShareableHandle, 11020) \
  X(cuMemPoolImportFromShareableHandle, 11020) \
  X(cuMemPoolExportPointer, 11020)          \
  X(cuMemPoolImportPointer, 11020)
