// export_allocation: chooses the mechanism for a pointer and builds its ipc_handle
// (docs/ipc.md, "Which mechanism").
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "driver/driver.hpp"
#include "gpumem/memory_resource.hpp"
#include "ipc/ipc_access.hpp"
#include "ipc/shareable.hpp"
#include "text.hpp"

namespace gpumem {
namespace detail {

std::array<unsigned char, 16> device_uuid(int device) {
  CUdevice d = 0;
  GPUMEM_CU(cuDeviceGet, &d, device);
  CUuuid uuid{};
  GPUMEM_CU(cuDeviceGetUuid, &uuid, d);
  std::array<unsigned char, 16> out{};
  std::memcpy(out.data(), uuid.bytes, out.size());
  return out;
}

}  // namespace detail

namespace {

using detail::ipc_access;
using detail::throw_ipc;

using detail::shareable_resources;

[[noreturn]] void not_exportable(const void* ptr, const std::string& why) {
  throw_ipc(ipc_errc::not_exportable,
            "gpumem::export_allocation(" + detail::pointer_text(ptr) + "): " + why);
}

std::string driver_said(CUresult r, const char* api) {
  return std::string(" (") + api + ": " + std::string(detail::error_name(r)) + ")";
}

ipc_handle start(ipc_kind kind, int device, std::size_t bytes) {
  ipc_handle h;
  ipc_access::kind(h) = kind;
  ipc_access::device(h) = device;
  ipc_access::size(h) = bytes;
  ipc_access::uuid(h) = detail::device_uuid(device);
  ipc_access::pid(h) = getpid();
  return h;
}

ipc_handle export_legacy(const void* ptr, std::size_t bytes, int device) {
  const detail::device_context_guard guard(device);
  const auto p = reinterpret_cast<CUdeviceptr>(ptr);
  CUdeviceptr base = 0;
  std::size_t base_bytes = 0;
  if (CUresult r = detail::driver().cuMemGetAddressRange(&base, &base_bytes, p); r != CUDA_SUCCESS) {
    not_exportable(ptr, "not an allocation the driver knows" + driver_said(r, "cuMemGetAddressRange"));
  }
  if (bytes > base_bytes - (p - base)) {
    throw logic_error("gpumem::export_allocation: " + std::to_string(bytes) + " bytes at " +
                      detail::pointer_text(ptr) + " run past the end of their allocation");
  }
  CUipcMemHandle handle{};
  if (CUresult r = detail::driver().cuIpcGetMemHandle(&handle, base); r != CUDA_SUCCESS) {
    not_exportable(ptr, "legacy CUDA IPC refused the allocation" + driver_said(r, "cuIpcGetMemHandle") +
                            "; memory that can be shared comes from " + shareable_resources);
  }
  ipc_handle h = start(ipc_kind::legacy, device, bytes);
  ipc_access::offset(h) = static_cast<std::size_t>(p - base);
  auto& driver_bytes = ipc_access::driver_bytes(h);
  driver_bytes.resize(sizeof handle);
  std::memcpy(driver_bytes.data(), &handle, sizeof handle);
  return h;
}

ipc_handle export_pool(const void* ptr, std::size_t bytes, int device, CUmemoryPool pool) {
  const detail::device_context_guard guard(device);
  const auto p = reinterpret_cast<CUdeviceptr>(ptr);
  CUdeviceptr base = 0;
  std::size_t base_bytes = 0;
  GPUMEM_CU(cuMemGetAddressRange, &base, &base_bytes, p);
  if (bytes > base_bytes - (p - base)) {
    throw logic_error("gpumem::export_allocation: " + std::to_string(bytes) + " bytes at " +
                      detail::pointer_text(ptr) + " run past the end of their allocation");
  }
  int fd = -1;
  if (CUresult r = detail::driver().cuMemPoolExportToShareableHandle(&fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      r != CUDA_SUCCESS) {
    not_exportable(ptr, "the driver pool it came from is not shareable" +
                            driver_said(r, "cuMemPoolExportToShareableHandle") +
                            "; create it with async_resource(device, {.ipc = async_ipc_handle::posix_file_descriptor}) "
                            "(the device's default pool cannot be shared)");
  }
  ipc_handle h = start(ipc_kind::pool, device, bytes);
  ipc_access::pieces(h).push_back({reinterpret_cast<std::uintptr_t>(pool), fd, fd});
  ipc_access::offset(h) = static_cast<std::size_t>(p - base);
  CUmemPoolPtrExportData data{};
  GPUMEM_CU(cuMemPoolExportPointer, &data, base);
  auto& driver_bytes = ipc_access::driver_bytes(h);
  driver_bytes.resize(sizeof data);
  std::memcpy(driver_bytes.data(), &data, sizeof data);
  return h;
}

struct piece_range {
  std::uintptr_t address;
  std::size_t bytes;
};

ipc_handle export_vmm(const void* ptr, std::size_t bytes, int device, const std::vector<piece_range>& pieces) {
  if (pieces.empty()) not_exportable(ptr, "no physical memory is mapped under it");
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  ipc_handle h = start(ipc_kind::vmm, device, bytes);
  ipc_access::offset(h) = static_cast<std::size_t>(p - pieces.front().address);
  std::uintptr_t next = pieces.front().address;
  for (const piece_range& piece : pieces) {
    if (piece.address != next) not_exportable(ptr, "its physical pieces are not contiguous");
    next += piece.bytes;
    CUmemGenericAllocationHandle handle = 0;
    GPUMEM_CU(cuMemRetainAllocationHandle, &handle, reinterpret_cast<void*>(piece.address));
    int fd = -1;
    const CUresult r =
        detail::driver().cuMemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    detail::check(detail::driver().cuMemRelease(handle), "cuMemRelease", __FILE__, __LINE__);
    if (r != CUDA_SUCCESS) {
      not_exportable(ptr, "its physical memory was not created shareable" +
                              driver_said(r, "cuMemExportToShareableHandle") +
                              "; construct vmm_pool_resource with vmm_pool_options::posix_fd_shareable = true");
    }
    ipc_access::pieces(h).push_back({piece.bytes, fd, fd});
  }
  if (p + bytes > next) not_exportable(ptr, "the range runs past its physical pieces");
  return h;
}

// The mappings under [ptr, ptr + bytes), from the driver's pointer queries.
std::vector<piece_range> mapped_pieces(const void* ptr, std::size_t bytes) {
  std::vector<piece_range> out;
  auto at = reinterpret_cast<CUdeviceptr>(ptr);
  const CUdeviceptr end = at + bytes;
  while (at < end) {
    CUdeviceptr base = 0;
    std::size_t size = 0;
    GPUMEM_CU(cuMemGetAddressRange, &base, &size, at);
    out.push_back({static_cast<std::uintptr_t>(base), size});
    at = base + size;
  }
  return out;
}

template <class T>
T pointer_attribute(CUpointer_attribute attribute, const void* ptr, CUresult* result) {
  T value{};
  *result = detail::driver().cuPointerGetAttribute(&value, attribute, reinterpret_cast<CUdeviceptr>(ptr));
  return value;
}

}  // namespace

ipc_handle export_allocation(const void* ptr, std::size_t bytes) {
  if (ptr == nullptr || bytes == 0) throw logic_error("gpumem::export_allocation: a null pointer or 0 bytes");
  CUresult r = CUDA_SUCCESS;
  const auto type = pointer_attribute<unsigned int>(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr, &r);
  if (r != CUDA_SUCCESS) not_exportable(ptr, "not memory the driver knows" + driver_said(r, "cuPointerGetAttribute"));
  if (type == CU_MEMORYTYPE_HOST) {
    not_exportable(ptr, "host memory (pinned_host_resource) cannot be shared through CUDA IPC; share host "
                        "memory with the operating system (a memfd or shm_open) and register it in each process");
  }
  const auto managed = pointer_attribute<bool>(CU_POINTER_ATTRIBUTE_IS_MANAGED, ptr, &r);
  if (r == CUDA_SUCCESS && managed) {
    not_exportable(ptr, std::string("managed memory (managed_resource) cannot be shared between processes; "
                                    "allocate what you share from ") + shareable_resources);
  }
  const int device = pointer_attribute<int>(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr, &r);
  detail::check(r, "cuPointerGetAttribute", __FILE__, __LINE__);
  const auto pool = pointer_attribute<CUmemoryPool>(CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, ptr, &r);
  if (r == CUDA_SUCCESS && pool != nullptr) return export_pool(ptr, bytes, device, pool);
  // Virtual memory: cuMemRetainAllocationHandle answers only for mapped physical memory.
  CUmemGenericAllocationHandle handle = 0;
  if (detail::driver().cuMemRetainAllocationHandle(&handle, const_cast<void*>(ptr)) == CUDA_SUCCESS) {
    detail::check(detail::driver().cuMemRelease(handle), "cuMemRelease", __FILE__, __LINE__);
    const detail::device_context_guard guard(device);
    return export_vmm(ptr, bytes, device, mapped_pieces(ptr, bytes));
  }
  return export_legacy(ptr, bytes, device);
}

ipc_handle export_allocation(const memory_resource& mr, const void* ptr, std::size_t bytes) {
  if (ptr == nullptr || bytes == 0) throw logic_error("gpumem::export_allocation: a null pointer or 0 bytes");
  // The stack says how (memory_resource::ipc_route, forwarded by adaptors).
  const ipc_export_route route = mr.ipc_route(ptr, bytes);
  switch (route.how) {
    case ipc_export_route::way::refused:
      not_exportable(ptr, route.refusal);
    case ipc_export_route::way::driver_pool:
      return export_pool(ptr, bytes, route.device, route.pool);
    case ipc_export_route::way::pages: {
      std::vector<piece_range> pieces;
      for (const auto& [address, piece_bytes] : route.pieces) pieces.push_back({address, piece_bytes});
      const detail::device_context_guard guard(route.device);
      return export_vmm(ptr, bytes, route.device, pieces);
    }
    case ipc_export_route::way::ask_the_driver:
      break;
  }
  return export_allocation(ptr, bytes);
}

}  // namespace gpumem
