// The simulator's inter-process sharing of device memory: legacy IPC handles
// (cuIpcGetMemHandle/OpenMemHandle/CloseMemHandle) and exported memory pools
// (cuMemPoolExportToShareableHandle/ImportFromShareableHandle, cuMemPoolExportPointer/
// ImportPointer). Virtual-memory handles are exported in sim_vmm.cpp.
//
// Note [Shareable simulated memory]
// Each process simulates its own devices, so sharing memory means sharing host pages
// between processes. Device memory is private anonymous memory until it is first
// exported: cuIpcGetMemHandle (a cuMemAlloc allocation) and cuMemPoolExportPointer (a
// block of a pool created with the POSIX file descriptor handle type) wait for the
// device's work, copy the allocation's pages into a memfd of its own and map that memfd
// MAP_SHARED at the same address (device_address_space::share). The exported bytes
// carry the exporter's pid, the memfd's descriptor number there, and the memfd's
// identity (st_dev, st_ino); the importer opens /proc/<pid>/fd/<n> (a same-user read of
// /proc, allowed wherever the process may read the exporter's descriptors), checks the
// identity, and maps the memfd into its own simulated device's range.
//
// Consequences, all as with the driver unless said otherwise:
//  - A legacy handle names the whole allocation (the importer gets its base).
//  - Opening a handle in the process that exported it is CUDA_ERROR_INVALID_CONTEXT;
//    opening one that is already open in this process is CUDA_ERROR_ALREADY_MAPPED.
//  - A handle of memory the exporter has freed (or of an exporter that exited) no longer
//    opens: CUDA_ERROR_INVALID_VALUE. Bytes that are not a handle: the same.
//  - The exporter freeing memory an importer still maps is undefined behaviour in
//    CUDA; here the importer keeps the pages it mapped (the memfd lives while mapped) and
//    the exporter's range gets fresh pages, so neither side can corrupt the other.
//  - Imported memory counts against the importing process's simulated device (each
//    process simulates its own devices).
#pragma once

#include <cstddef>

#include <cuda.h>

namespace gpumem::detail::simulator {

// cuMemPoolDestroy of a pool imported from another process: true if it was one
// (and it is now destroyed).
bool destroy_imported_pool(CUmemoryPool pool);

// Whether `pool` is a pool imported from another process.
bool is_imported_pool(CUmemoryPool pool);

// The exporter's device ordinal of a pool imported from another process, or -1 when
// `pool` is not one. cuMemPoolSetAccess on an imported pool checks its descriptors
// against it and records nothing: imported memory is host memory, reachable from every
// simulated device.
int imported_pool_device(CUmemoryPool pool);

}  // namespace gpumem::detail::simulator
