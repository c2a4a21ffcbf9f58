// import_allocation and ipc_mapping: maps another process's memory here, by kind
// (docs/ipc.md, "Importing").
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "driver/driver.hpp"
#include "diagnose.hpp"
#include "gpumem/device.hpp"
#include "gpumem/ipc_fd_channel.hpp"
#include "ipc/ipc_access.hpp"
#include "text.hpp"

namespace gpumem {
namespace {

using detail::ipc_access;
using detail::throw_ipc;

// Note [One open per process]
// The driver refuses to open one legacy handle twice in a process
// (CUDA_ERROR_ALREADY_MAPPED), and a legacy handle names a whole cuMemAlloc allocation,
// so two sub-allocations of one pool chunk share it. Imported pools are likewise
// imported once per exporter pool, and each block of one once: a second
// cuMemPoolImportPointer of a block gives it again, and the first cuMemFree of it
// would leave the second mapping dangling (its own cuMemFree then fails). All are
// counted here, process-wide: the first import opens, the last close closes, in
// whatever order the mappings close.
struct legacy_entry {
  CUdeviceptr base = 0;
  unsigned references = 0;
};
struct pool_entry {
  CUmemoryPool pool = nullptr;
  unsigned references = 0;  // blocks imported from it
};
struct pool_block_entry {
  pool_entry* pool = nullptr;
  CUdeviceptr block = 0;
  unsigned references = 0;
};
using export_data = std::array<std::byte, sizeof(CUmemPoolPtrExportData)>;
struct import_cache {
  std::mutex mutex;
  std::map<std::array<std::byte, sizeof(CUipcMemHandle)>, legacy_entry> legacy;
  std::map<std::pair<pid_t, std::uint64_t>, pool_entry> pools;  // (exporter pid, exporter pool id)
  std::map<std::pair<const pool_entry*, export_data>, pool_block_entry> blocks;
};

import_cache& cache() {
  static auto* c = new import_cache;  // never destroyed: mappings may outlive static destruction
  return *c;
}

int local_device(const ipc_handle& h) {
  const int count = device_count();
  for (int d = 0; d < count; ++d) {
    if (detail::device_uuid(d) == h.device_uuid()) return d;
  }
  throw_ipc(ipc_errc::device_not_visible,
            "gpumem::import_allocation: the exporter's device (its ordinal " + std::to_string(h.device()) +
                " there) is not visible in this process (CUDA_VISIBLE_DEVICES?)");
}

// A descriptor of the handle's piece `i` usable here: the one it holds, or one taken
// from the exporter with pidfd_getfd (owned: `*owned` says to close it).
int descriptor(const ipc_handle& h, std::size_t i, bool* owned) {
  const auto& piece = ipc_access::pieces(h)[i];
  if (piece.fd >= 0) {
    *owned = false;
    return piece.fd;
  }
  *owned = true;
  return pidfd_get_fd(h.exporter_pid(), piece.remote_fd);
}

struct scoped_fd {
  int fd;
  bool owned;
  ~scoped_fd() {
    if (owned && fd >= 0) ::close(fd);
  }
};

// Note [Importing for another device]
// import_options::device names the device that will use the memory. The memory stays
// mapped in its own device's context (legacy and pool mappings are shared process-wide,
// and close() unmaps there); the user device gets access as each kind allows: a legacy
// handle is opened with CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, an imported pool gets
// cuMemPoolSetAccess, a vmm range cuMemSetAccess for both devices. All of it needs
// peer access, checked first with cuDeviceCanAccessPeer.
void require_peer_access(int user, int owner) {
  int can = 0;
  GPUMEM_CU(cuDeviceCanAccessPeer, &can, static_cast<CUdevice>(user), static_cast<CUdevice>(owner));
  if (can == 0) {
    throw_ipc(ipc_errc::peer_access_unavailable,
              "gpumem::import_allocation: device " + std::to_string(user) + " cannot use memory of device " +
                  std::to_string(owner) + ": cuDeviceCanAccessPeer(" + std::to_string(user) + ", " +
                  std::to_string(owner) +
                  ") says 0 (no peer access between them: no NVLink or PCIe peer path, or the platform "
                  "disables it); import for device " +
                  std::to_string(owner) + " and copy instead");
  }
}

// Note [What a handle's size and offset may claim]
// A handle's size and offset are bytes anyone can write: the checksum finds
// damage, not intent (it is FNV, not a MAC). So a mapping is handed out only when
// [offset, offset + size) lies inside what the driver itself opened, as it reports
// it (cuMemGetAddressRange on the opened pointer); else the import is undone and
// refused. VMM handles are checked against their pieces at deserialisation.
// Where the driver cannot report the range, its own checks stand.
void require_inside(CUdeviceptr opened, const ipc_handle& h, int device, const char* kind) {
  const detail::device_context_guard guard(device);
  CUdeviceptr base = 0;
  std::size_t size = 0;
  if (detail::driver().cuMemGetAddressRange(&base, &size, opened) != CUDA_SUCCESS) return;
  const std::size_t room = static_cast<std::size_t>(base + size - opened);
  if (opened < base || h.offset() > room || h.size() > room - h.offset()) {
    throw_ipc(ipc_errc::malformed_handle,
              std::string("gpumem::import_allocation: the ") + kind + " handle claims " + std::to_string(h.size()) +
                  " bytes at offset " + std::to_string(h.offset()) + ", but what the driver opened has " +
                  std::to_string(room) + " bytes: a forged or damaged handle");
  }
}

ipc_mapping import_legacy(const ipc_handle& h, int device, int user) {
  std::array<std::byte, sizeof(CUipcMemHandle)> key{};
  std::memcpy(key.data(), h.driver_bytes().data(), key.size());
  import_cache& c = cache();
  std::unique_lock lock(c.mutex);
  auto [it, inserted] = c.legacy.try_emplace(key);
  if (inserted) {
    CUipcMemHandle handle{};
    std::memcpy(&handle, key.data(), key.size());
    const detail::device_context_guard guard(device);
    CUdeviceptr base = 0;
    const CUresult r = detail::driver().cuIpcOpenMemHandle(&base, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (r != CUDA_SUCCESS) {
      c.legacy.erase(it);
      detail::check(r, "cuIpcOpenMemHandle", __FILE__, __LINE__);
    }
    it->second.base = base;
  }
  ++it->second.references;
  ipc_mapping m = ipc_access::make_mapping(reinterpret_cast<void*>(it->second.base + h.offset()), h.size(), device,
                                           user, ipc_kind::legacy, it->second.base, 0,
                                           reinterpret_cast<std::uintptr_t>(&it->second));
  const CUdeviceptr opened = it->second.base;
  lock.unlock();  // a refusal closes the mapping, which takes the lock
  require_inside(opened, h, device, "legacy");
  return m;
}

ipc_mapping import_pool(const ipc_handle& h, int device, int user) {
  const auto pool_id = static_cast<std::uint64_t>(ipc_access::pieces(h)[0].bytes);
  import_cache& c = cache();
  std::unique_lock lock(c.mutex);
  // Named, not structured bindings: the undo lambda below captures them.
  const auto pool_emplaced = c.pools.try_emplace(std::make_pair(h.exporter_pid(), pool_id));
  const auto it = pool_emplaced.first;
  const bool inserted = pool_emplaced.second;
  pool_entry& entry = it->second;
  const detail::device_context_guard guard(device);
  if (inserted) {
    try {
      bool owned = false;
      const int fd = descriptor(h, 0, &owned);
      const scoped_fd hold{fd, owned};
      // A POSIX file descriptor is passed as the pointer's value (cuda.h).
      GPUMEM_CU(cuMemPoolImportFromShareableHandle, &entry.pool, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    } catch (...) {
      c.pools.erase(it);
      throw;
    }
  }
  export_data key{};
  std::memcpy(key.data(), h.driver_bytes().data(), key.size());
  const auto block_emplaced = c.blocks.try_emplace(std::make_pair(&entry, key));
  const auto bit = block_emplaced.first;
  const bool block_inserted = block_emplaced.second;
  pool_block_entry& block = bit->second;
  // Drops what this import made if it fails before handing out the mapping.
  auto undo = [&] {
    if (block_inserted) {
      if (block.block != 0) (void)detail::driver().cuMemFree(block.block);  // already failing
      c.blocks.erase(bit);
    }
    if (entry.references == 0) {
      (void)detail::driver().cuMemPoolDestroy(entry.pool);
      c.pools.erase(it);
    }
  };
  if (block_inserted) {
    block.pool = &entry;
    CUmemPoolPtrExportData data{};
    std::memcpy(&data, key.data(), sizeof data);
    if (CUresult r = detail::driver().cuMemPoolImportPointer(&block.block, entry.pool, &data); r != CUDA_SUCCESS) {
      block.block = 0;
      undo();
      detail::check(r, "cuMemPoolImportPointer", __FILE__, __LINE__);
    }
  }
  if (user != device) {
    // Access is per pool in this process; granting it again for a later import is harmless.
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = user;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (CUresult r = detail::driver().cuMemPoolSetAccess(entry.pool, &access, 1); r != CUDA_SUCCESS) {
      undo();
      detail::check(r, "cuMemPoolSetAccess", __FILE__, __LINE__);
    }
  }
  if (block_inserted) ++entry.references;
  ++block.references;
  ipc_mapping m = ipc_access::make_mapping(reinterpret_cast<void*>(block.block + h.offset()), h.size(), device, user,
                                           ipc_kind::pool, block.block, 0, reinterpret_cast<std::uintptr_t>(&block));
  const CUdeviceptr opened = block.block;
  lock.unlock();  // a refusal closes the mapping, which takes the lock
  require_inside(opened, h, device, "pool");
  return m;
}

ipc_mapping import_vmm(const ipc_handle& h, int device, int user) {
  const auto& pieces = ipc_access::pieces(h);
  std::size_t total = 0;
  for (const auto& p : pieces) total += p.bytes;
  const detail::device_context_guard guard(device);
  CUdeviceptr base = 0;
  GPUMEM_CU(cuMemAddressReserve, &base, total, 0, 0, 0);
  std::size_t mapped = 0;
  auto undo = [&] {
    if (mapped > 0) detail::driver().cuMemUnmap(base, mapped);
    detail::driver().cuMemAddressFree(base, total);
  };
  try {
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      bool owned = false;
      const int fd = descriptor(h, i, &owned);
      const scoped_fd hold{fd, owned};
      CUmemGenericAllocationHandle handle = 0;
      GPUMEM_CU(cuMemImportFromShareableHandle, &handle, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      const CUresult r = detail::driver().cuMemMap(base + mapped, pieces[i].bytes, 0, handle, 0);
      detail::driver().cuMemRelease(handle);  // the mapping holds the memory now
      detail::check(r, "cuMemMap", __FILE__, __LINE__);
      mapped += pieces[i].bytes;
    }
    CUmemAccessDesc access[2]{};
    for (CUmemAccessDesc& a : access) {
      a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    access[0].location.id = device;
    access[1].location.id = user;
    GPUMEM_CU(cuMemSetAccess, base, total, access, user != device ? 2 : 1);
  } catch (...) {
    undo();
    throw;
  }
  return ipc_access::make_mapping(reinterpret_cast<void*>(base + h.offset()), h.size(), device, user, ipc_kind::vmm,
                                  base, total, 0);
}

}  // namespace

namespace detail {

void ipc_unmap(ipc_kind kind, int device, std::uintptr_t base, std::size_t mapped_bytes, std::uintptr_t cache_key) {
  const device_context_guard guard(device);
  // Work queued on the mapping finishes before it goes (as a free is ordered after it).
  GPUMEM_CU(cuCtxSynchronize);
  switch (kind) {
    case ipc_kind::legacy: {
      import_cache& c = cache();
      std::lock_guard lock(c.mutex);
      auto* entry = reinterpret_cast<legacy_entry*>(cache_key);
      if (--entry->references > 0) return;
      for (auto it = c.legacy.begin(); it != c.legacy.end(); ++it) {
        if (&it->second == entry) {
          c.legacy.erase(it);
          break;
        }
      }
      GPUMEM_CU(cuIpcCloseMemHandle, static_cast<CUdeviceptr>(base));
      return;
    }
    case ipc_kind::pool: {
      import_cache& c = cache();
      std::lock_guard lock(c.mutex);
      auto* block = reinterpret_cast<pool_block_entry*>(cache_key);
      if (--block->references > 0) return;
      pool_entry* entry = block->pool;
      for (auto it = c.blocks.begin(); it != c.blocks.end(); ++it) {
        if (&it->second == block) {
          c.blocks.erase(it);
          break;
        }
      }
      GPUMEM_CU(cuMemFree, static_cast<CUdeviceptr>(base));
      if (--entry->references > 0) return;
      const CUmemoryPool pool = entry->pool;
      for (auto it = c.pools.begin(); it != c.pools.end(); ++it) {
        if (&it->second == entry) {
          c.pools.erase(it);
          break;
        }
      }
      GPUMEM_CU(cuMemPoolDestroy, pool);
      return;
    }
    case ipc_kind::vmm:
      GPUMEM_CU(cuMemUnmap, static_cast<CUdeviceptr>(base), mapped_bytes);
      GPUMEM_CU(cuMemAddressFree, static_cast<CUdeviceptr>(base), mapped_bytes);
      return;
  }
}

}  // namespace detail

ipc_mapping import_allocation(const ipc_handle& h) { return import_allocation(h, import_options{}); }

ipc_mapping import_allocation(const ipc_handle& h, const import_options& options) {
  if (h.size() == 0) throw logic_error("gpumem::import_allocation: an empty handle");
  if (h.exporter_pid() == getpid()) {
    throw_ipc(ipc_errc::same_process,
              "gpumem::import_allocation: the handle was exported by this process; use the pointer itself "
              "(the driver cannot open its own process's memory)");
  }
  const int device = local_device(h);
  int user = device;
  if (options.device != -1) {
    const int count = device_count();
    if (options.device < 0 || options.device >= count) {
      throw logic_error("gpumem::import_allocation: import_options::device " + std::to_string(options.device) +
                        " is not a device of this process (" + std::to_string(count) + " visible)");
    }
    user = options.device;
  }
  if (user != device) require_peer_access(user, device);
  switch (h.kind()) {
    case ipc_kind::legacy: return import_legacy(h, device, user);
    case ipc_kind::pool: return import_pool(h, device, user);
    case ipc_kind::vmm: return import_vmm(h, device, user);
  }
  throw_ipc(ipc_errc::malformed_handle, "gpumem::import_allocation: unknown kind");
}

ipc_mapping::~ipc_mapping() {
  if (ptr_ == nullptr) return;
  try {
    close();
  } catch (const std::exception& e) {
    detail::diagnosef(diagnostic_level::error, "gpumem: closing an IPC mapping at %s failed: %s\n", detail::pointer_text(ptr_).c_str(),
                 e.what());
  }
}

ipc_mapping::ipc_mapping(ipc_mapping&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)),
      size_(other.size_),
      device_(other.device_),
      user_device_(other.user_device_),
      kind_(other.kind_),
      base_(other.base_),
      mapped_bytes_(other.mapped_bytes_),
      cache_key_(other.cache_key_) {}

ipc_mapping& ipc_mapping::operator=(ipc_mapping&& other) noexcept {
  if (this != &other) {
    this->~ipc_mapping();
    new (this) ipc_mapping(std::move(other));
  }
  return *this;
}

void ipc_mapping::close() {
  if (ptr_ == nullptr) return;
  ptr_ = nullptr;  // closed (or abandoned) even if the driver refuses
  detail::ipc_unmap(kind_, device_, base_, mapped_bytes_, cache_key_);
}

}  // namespace gpumem
