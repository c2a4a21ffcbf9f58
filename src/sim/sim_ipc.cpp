// The simulator's legacy IPC handles and exported memory pools (see the note in
// sim_ipc.hpp) and their entry points.
#include "sim/sim_ipc.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "sim/sim_entry_points.hpp"
#include "sim/sim_memory.hpp"
#include "sim/sim_pool.hpp"
#include "sim/sim_state.hpp"

namespace gpumem::detail::simulator {
namespace {

constexpr std::uint32_t legacy_magic = 0x50495347;   // "GSIP"
constexpr std::uint32_t pool_magic = 0x4c505347;     // "GSPL"
constexpr std::uint32_t pointer_magic = 0x50505347;  // "GSPP"
constexpr std::uint32_t layout_version = 1;

// What a legacy handle's 64 bytes hold here.
struct legacy_bytes {
  std::uint32_t magic;
  std::uint32_t version;
  std::int32_t pid;
  std::int32_t fd;  // the memfd's number in the exporter
  std::int32_t device;
  std::uint32_t reserved;
  std::uint64_t inode;
  std::uint64_t file_device;
  std::uint64_t size;
  std::uint64_t footprint;
};
static_assert(sizeof(legacy_bytes) <= sizeof(CUipcMemHandle));

// What an exported pool's descriptor (a small memfd) holds.
struct pool_bytes {
  std::uint32_t magic;
  std::uint32_t version;
  std::int32_t pid;
  std::int32_t device;
  std::uint64_t pool_id;
};

// What a pointer's export data (64 bytes) holds.
struct pointer_bytes {
  std::uint32_t magic;
  std::uint32_t version;
  std::int32_t pid;
  std::int32_t fd;
  std::int32_t device;
  std::uint32_t reserved;
  std::uint64_t pool_id;
  std::uint64_t inode;
  std::uint64_t file_device;
  std::uint64_t size;
  std::uint64_t footprint;
};
static_assert(sizeof(pointer_bytes) <= sizeof(CUmemPoolPtrExportData));

struct imported_pool {
  std::int32_t pid = 0;
  std::int32_t device = 0;
  std::uint64_t pool_id = 0;
};

// The importing side's bookkeeping: legacy handles open here, pools imported here.
struct import_table {
  std::mutex mutex;
  std::map<std::pair<std::uint64_t, std::uint64_t>, CUdeviceptr> legacy_by_file;  // (dev, ino) -> base
  std::map<CUdeviceptr, std::pair<int, std::pair<std::uint64_t, std::uint64_t>>> legacy_by_base;  // base -> device, key
  std::set<imported_pool*> pools;
};

import_table& imports() {
  static auto* table = new import_table;  // never destroyed, like the simulator's state
  return *table;
}

// Opens the exporter's memfd and checks it is the one the bytes name.
int open_exported(std::int32_t pid, std::int32_t fd, std::uint64_t inode, std::uint64_t file_device,
                  std::uint64_t footprint) {
  if (pid <= 0 || fd < 0) return -1;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, fd);
  const int opened = open(path, O_RDWR | O_CLOEXEC);
  if (opened < 0) return -1;
  struct stat st {};
  if (fstat(opened, &st) != 0 || static_cast<std::uint64_t>(st.st_ino) != inode ||
      static_cast<std::uint64_t>(st.st_dev) != file_device || static_cast<std::uint64_t>(st.st_size) < footprint) {
    close(opened);
    return -1;
  }
  return opened;
}

bool valid_sizes(std::uint64_t size, std::uint64_t footprint) {
  const std::size_t page = device_address_space::granularity();
  return size > 0 && footprint >= size && footprint % page == 0 && footprint - size < page;
}

// The device imported memory is placed on: the exporter's ordinal when this process
// has it, else the current context's.
sim_device* import_device(sim_state& state, sim_context& context, std::int32_t device) {
  if (sim_device* d = state.device(device)) return d;
  return state.device(context.device());
}

}  // namespace

bool destroy_imported_pool(CUmemoryPool pool) {
  auto* p = reinterpret_cast<imported_pool*>(pool);
  import_table& t = imports();
  std::lock_guard lock(t.mutex);
  if (t.pools.erase(p) == 0) return false;
  delete p;
  return true;
}

int imported_pool_device(CUmemoryPool pool) {
  import_table& t = imports();
  std::lock_guard lock(t.mutex);
  auto* p = reinterpret_cast<imported_pool*>(pool);
  return t.pools.count(p) != 0 ? p->device : -1;
}

bool is_imported_pool(CUmemoryPool pool) {
  import_table& t = imports();
  std::lock_guard lock(t.mutex);
  return t.pools.count(reinterpret_cast<imported_pool*>(pool)) != 0;
}

// ---- legacy IPC ----

CUresult ipc_get_mem_handle(CUipcMemHandle* handle, CUdeviceptr pointer) {
  return entry_point([&](sim_state& state) {
    sim_context* context = nullptr;
    if (CUresult r = require_current_context(context); r != CUDA_SUCCESS) return r;
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (state.vmm->find(pointer)) return CUDA_ERROR_INVALID_VALUE;  // virtual memory: cuMemExportToShareableHandle
    auto a = find_allocation(state, pointer);
    // Only cuMemAlloc memory, named by its base (pool blocks, managed and imported memory cannot).
    if (!a || a->base != pointer || a->kind != allocation_kind::synchronous || a->free_pending) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    sim_device& owner = *state.device(a->device);
    owner.context.synchronize();  // moving the pages must not race queued work
    shared_region shared;
    if (CUresult r = owner.memory.share(pointer, &shared); r != CUDA_SUCCESS) return r;
    legacy_bytes b{};
    b.magic = legacy_magic;
    b.version = layout_version;
    b.pid = static_cast<std::int32_t>(getpid());
    b.fd = shared.fd;
    b.device = a->device;
    b.inode = shared.inode;
    b.file_device = shared.file_device;
    b.size = a->size;
    b.footprint = shared.footprint;
    std::memset(handle, 0, sizeof *handle);
    std::memcpy(handle->reserved, &b, sizeof b);
    return CUDA_SUCCESS;
  });
}

CUresult ipc_open_mem_handle(CUdeviceptr* pointer, CUipcMemHandle handle, unsigned int flags) {
  return entry_point([&](sim_state& state) {
    sim_context* context = nullptr;
    if (CUresult r = require_current_context(context); r != CUDA_SUCCESS) return r;
    if (pointer == nullptr || (flags & ~static_cast<unsigned>(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    legacy_bytes b{};
    std::memcpy(&b, handle.reserved, sizeof b);
    if (b.magic != legacy_magic || b.version != layout_version || !valid_sizes(b.size, b.footprint)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (b.pid == static_cast<std::int32_t>(getpid())) return CUDA_ERROR_INVALID_CONTEXT;
    import_table& t = imports();
    std::lock_guard lock(t.mutex);
    const auto key = std::make_pair(b.file_device, b.inode);
    if (t.legacy_by_file.count(key) != 0) return CUDA_ERROR_ALREADY_MAPPED;
    const int fd = open_exported(b.pid, b.fd, b.inode, b.file_device, b.footprint);
    if (fd < 0) return CUDA_ERROR_INVALID_VALUE;  // freed, exporter gone, or not a handle
    sim_device* d = import_device(state, *context, b.device);
    CUdeviceptr base = 0;
    const CUresult r = d->memory.map_import(fd, b.size, b.footprint, allocation_kind::ipc_legacy, &base);
    close(fd);  // the mapping holds the memfd
    if (r != CUDA_SUCCESS) return r;
    t.legacy_by_file.emplace(key, base);
    t.legacy_by_base.emplace(base, std::make_pair(d->memory.device(), key));
    *pointer = base;
    return CUDA_SUCCESS;
  });
}

CUresult ipc_close_mem_handle(CUdeviceptr pointer) {
  return entry_point([&](sim_state& state) {
    sim_context* context = nullptr;
    if (CUresult r = require_current_context(context); r != CUDA_SUCCESS) return r;
    import_table& t = imports();
    std::lock_guard lock(t.mutex);
    auto it = t.legacy_by_base.find(pointer);
    if (it == t.legacy_by_base.end()) return CUDA_ERROR_INVALID_VALUE;
    sim_device& d = *state.device(it->second.first);
    d.context.synchronize();  // work queued on the mapping finishes first
    if (CUresult r = d.memory.unmap_import(pointer, allocation_kind::ipc_legacy); r != CUDA_SUCCESS) return r;
    t.legacy_by_file.erase(it->second.second);
    t.legacy_by_base.erase(it);
    return CUDA_SUCCESS;
  });
}

// ---- exported pools ----

CUresult mem_pool_export_to_shareable_handle(void* handle_out, CUmemoryPool pool_handle,
                                             CUmemAllocationHandleType type, unsigned long long flags) {
  return entry_point([&](sim_state& state) {
    if (handle_out == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    sim_pool* pool = state.pools.find(pool_handle);
    if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    // A pool is shareable only if created with this handle type.
    if (pool->handle_types() != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
    pool_bytes b{pool_magic, layout_version, static_cast<std::int32_t>(getpid()), pool->device(),
                 reinterpret_cast<std::uint64_t>(pool)};
    const int fd = memfd_create("gpumem-sim-pool", MFD_CLOEXEC);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    if (pwrite(fd, &b, sizeof b, 0) != static_cast<ssize_t>(sizeof b)) {
      close(fd);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *static_cast<int*>(handle_out) = fd;
    return CUDA_SUCCESS;
  });
}

CUresult mem_pool_import_from_shareable_handle(CUmemoryPool* pool_out, void* handle, CUmemAllocationHandleType type,
                                               unsigned long long flags) {
  return entry_point([&](sim_state& state) {
    if (pool_out == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    // A POSIX file descriptor is passed as the pointer's value, as cuda.h says.
    const int fd = static_cast<int>(reinterpret_cast<std::intptr_t>(handle));
    pool_bytes b{};
    if (fd < 0 || pread(fd, &b, sizeof b, 0) != static_cast<ssize_t>(sizeof b)) return CUDA_ERROR_INVALID_VALUE;
    if (b.magic != pool_magic || b.version != layout_version || state.device(b.device) == nullptr) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    auto* p = new imported_pool{b.pid, b.device, b.pool_id};
    import_table& t = imports();
    std::lock_guard lock(t.mutex);
    t.pools.insert(p);
    *pool_out = reinterpret_cast<CUmemoryPool>(p);
    return CUDA_SUCCESS;
  });
}

CUresult mem_pool_export_pointer(CUmemPoolPtrExportData* data_out, CUdeviceptr pointer) {
  return entry_point([&](sim_state& state) {
    if (data_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto a = find_allocation(state, pointer);
    if (!a || a->base != pointer || a->kind != allocation_kind::stream_ordered) return CUDA_ERROR_INVALID_VALUE;
    if (a->pool->handle_types() != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
    sim_device& owner = *state.device(a->device);
    owner.context.synchronize();  // moving the pages must not race queued work
    shared_region shared;
    if (CUresult r = owner.memory.share(pointer, &shared); r != CUDA_SUCCESS) return r;
    pointer_bytes b{};
    b.magic = pointer_magic;
    b.version = layout_version;
    b.pid = static_cast<std::int32_t>(getpid());
    b.fd = shared.fd;
    b.device = a->device;
    b.pool_id = reinterpret_cast<std::uint64_t>(a->pool);
    b.inode = shared.inode;
    b.file_device = shared.file_device;
    b.size = a->size;
    b.footprint = shared.footprint;
    std::memset(data_out, 0, sizeof *data_out);
    std::memcpy(data_out->reserved, &b, sizeof b);
    return CUDA_SUCCESS;
  });
}

CUresult mem_pool_import_pointer(CUdeviceptr* pointer_out, CUmemoryPool pool, CUmemPoolPtrExportData* data) {
  return entry_point([&](sim_state& state) {
    if (pointer_out == nullptr || data == nullptr) return CUDA_ERROR_INVALID_VALUE;
    sim_context* context = nullptr;
    if (CUresult r = require_current_context(context); r != CUDA_SUCCESS) return r;
    pointer_bytes b{};
    std::memcpy(&b, data->reserved, sizeof b);
    if (b.magic != pointer_magic || b.version != layout_version || !valid_sizes(b.size, b.footprint)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    import_table& t = imports();
    std::lock_guard lock(t.mutex);
    auto* p = reinterpret_cast<imported_pool*>(pool);
    if (t.pools.count(p) == 0) return CUDA_ERROR_INVALID_VALUE;            // not an imported pool
    if (p->pid != b.pid || p->pool_id != b.pool_id) return CUDA_ERROR_INVALID_VALUE;  // another pool's
    const int fd = open_exported(b.pid, b.fd, b.inode, b.file_device, b.footprint);
    if (fd < 0) return CUDA_ERROR_INVALID_VALUE;  // freed, exporter gone, or not export data
    sim_device* d = import_device(state, *context, b.device);
    CUdeviceptr base = 0;
    const CUresult r = d->memory.map_import(fd, b.size, b.footprint, allocation_kind::ipc_pool, &base);
    close(fd);
    if (r != CUDA_SUCCESS) return r;
    *pointer_out = base;
    return CUDA_SUCCESS;
  });
}

}  // namespace gpumem::detail::simulator
