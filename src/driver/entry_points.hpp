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
//  cuLaunchHostFunc            valid stream                       => fn runs in stream order on a
//                              driver thread; fn must not call the driver
//  cuEventCreate/Destroy/Record/Query/Synchronize/ElapsedTime
//                              ctx (create), valid event          => an event never recorded counts
//                              as complete; record captures the work queued on the stream so far
//  cuMemAlloc/cuMemFree        ctx                                => device memory of the ctx's device,
//                              256-byte aligned at least; cuMemFree may synchronize the device
//  cuMemAllocAsync/FreeAsync   ctx, stream of the ctx's device    => stream-ordered (default pool)
//  cuDeviceGetDefaultMemPool, cuMemPoolSetAttribute, cuMemPoolGetAttribute, cuMemPoolTrimTo
//                              valid ordinal / pool               => the device's default pool
//  cuMemGetInfo                ctx                                => free and total of ctx's device
//  cuMemGetAddressRange        ctx, pointer inside a cuMemAlloc   => base and size of the allocation
//  cuPointerGetAttribute       any pointer                        => CUDA_ERROR_INVALID_VALUE for
//                              memory the driver does not know
//  cuMemcpy/cuMemcpyAsync      unified addressing (both backends) => bytes copied, in stream order
//  cuMemsetD8/cuMemsetD8Async  device pointer                     => bytes set, in stream order
//  cuGetErrorName/String       any CUresult                       => static strings
#pragma once

#include <cuda.h>

#define GPUMEM_DRIVER_ENTRY_POINTS(X) \
  X(cuInit)                          \
  X(cuDriverGetVersion)              \
  X(cuGetErrorName)                  \
  X(cuGetErrorString)                \
  X(cuDeviceGetCount)                \
  X(cuDeviceGet)                     \
  X(cuDeviceGetName)                 \
  X(cuDeviceTotalMem)                \
  X(cuDeviceGetAttribute)            \
  X(cuDevicePrimaryCtxRetain)        \
  X(cuCtxGetCurrent)                 \
  X(cuCtxSetCurrent)                 \
  X(cuCtxGetDevice)                  \
  X(cuCtxSynchronize)                \
  X(cuStreamCreate)                  \
  X(cuStreamCreateWithPriority)      \
  X(cuStreamDestroy)                 \
  X(cuStreamGetDevice)               \
  X(cuStreamSynchronize)             \
  X(cuStreamQuery)                   \
  X(cuStreamWaitEvent)               \
  X(cuLaunchHostFunc)                \
  X(cuEventCreate)                   \
  X(cuEventDestroy)                  \
  X(cuEventRecord)                   \
  X(cuEventQuery)                    \
  X(cuEventSynchronize)              \
  X(cuEventElapsedTime)              \
  X(cuMemAlloc)                      \
  X(cuMemFree)                       \
  X(cuMemAllocAsync)                 \
  X(cuMemFreeAsync)                  \
  X(cuDeviceGetDefaultMemPool)       \
  X(cuMemPoolSetAttribute)           \
  X(cuMemPoolGetAttribute)           \
  X(cuMemPoolTrimTo)                 \
  X(cuMemGetInfo)                    \
  X(cuMemGetAddressRange)            \
  X(cuPointerGetAttribute)           \
  X(cuMemcpy)                        \
  X(cuMemcpyAsync)                   \
  X(cuMemsetD8)                      \
  X(cuMemsetD8Async)
