// The simulator's virtual memory management (see the note in sim_vmm.hpp) and
// its entry points.
#include "sim/sim_vmm.hpp"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <new>
#include <string>

#include "sim/sim_address_space.hpp"
#include "sim/sim_entry_points.hpp"
#include "sim/sim_fault_injection.hpp"
#include "sim/sim_state.hpp"

namespace gpumem::detail::simulator {
namespace {

constexpr std::size_t gran = vmm_space::granularity;
// Address space: this many times the devices' total capacity (halved until the host gives
// it). A GPU's is far larger than its memory; pools reserve a device's memory or more of
// addresses per stream (vmm_pool_resource's segments).
constexpr std::size_t address_factor = 16;
// Each device's memfd is this many times its capacity (sparse: costs nothing until touched).
constexpr std::size_t backing_factor = 4;
constexpr int reserved_flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;

bool aligned(std::size_t n) { return n % gran == 0; }
std::size_t round_up(std::size_t n, std::size_t unit) { return (n + unit - 1) / unit * unit; }

int protection_of(const std::vector<unsigned long long>& access) {
  unsigned long long most = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  for (unsigned long long a : access) most = std::max(most, a);
  if (most == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) return PROT_READ | PROT_WRITE;
  if (most == CU_MEM_ACCESS_FLAGS_PROT_READ) return PROT_READ;
  return PROT_NONE;
}

// First fit in `ranges` (offset -> length) of `size` bytes aligned to `alignment`
// (offsets from `base`, the address is aligned); takes it out. nullopt if none fits.
std::optional<std::size_t> take_first_fit(std::map<std::size_t, std::size_t>& ranges, std::size_t size,
                                          std::size_t alignment, std::uintptr_t base = 0) {
  for (auto it = ranges.begin(); it != ranges.end(); ++it) {
    const std::size_t start = round_up(base + it->first, alignment) - base;
    const std::size_t end = it->first + it->second;
    if (start < it->first || start > end || end - start < size) continue;
    const std::size_t hole = it->first;
    ranges.erase(it);
    if (start > hole) ranges.emplace(hole, start - hole);
    if (end > start + size) ranges.emplace(start + size, end - start - size);
    return start;
  }
  return std::nullopt;
}

// Takes exactly [offset, offset + size) out of `ranges` if it is free.
bool take_exact(std::map<std::size_t, std::size_t>& ranges, std::size_t offset, std::size_t size) {
  auto it = ranges.upper_bound(offset);
  if (it == ranges.begin()) return false;
  --it;
  const std::size_t hole = it->first;
  const std::size_t end = it->first + it->second;
  if (offset + size > end) return false;
  ranges.erase(it);
  if (offset > hole) ranges.emplace(hole, offset - hole);
  if (end > offset + size) ranges.emplace(offset + size, end - offset - size);
  return true;
}

}  // namespace

vmm_space::vmm_space(std::vector<device_address_space*> devices) : devices_(std::move(devices)) {
  std::size_t total = 0;
  for (auto* d : devices_) total += round_up(d->capacity(), gran);
  for (std::size_t factor = address_factor; factor >= 1; factor /= 2) {
    if (total > std::numeric_limits<std::size_t>::max() / factor - gran) continue;
    const std::size_t bytes = total * factor + gran;  // + gran: room to align the base
    void* p = mmap(nullptr, bytes, PROT_NONE, reserved_flags, -1, 0);
    if (p == MAP_FAILED) continue;
    mapping_base_ = p;
    mapping_bytes_ = bytes;
    base_ = reinterpret_cast<std::byte*>(round_up(reinterpret_cast<std::uintptr_t>(p), gran));
    reserved_ = total * factor;
    free_addresses_.emplace(0, reserved_);
    backings_.resize(devices_.size());
    return;
  }
  throw host_reservation_failed("cannot reserve the virtual address range of the simulated devices");
}

vmm_space::~vmm_space() {
  // Only reached when building the simulator fails part way.
  munmap(mapping_base_, mapping_bytes_);
  for (auto& b : backings_) {
    if (b.fd >= 0) close(b.fd);
  }
}

bool vmm_space::in_arena(CUdeviceptr p, std::size_t size) const {
  const auto lo = reinterpret_cast<CUdeviceptr>(base_);
  return p >= lo && size <= reserved_ && p - lo <= reserved_ - size;
}

bool vmm_space::overlaps(CUdeviceptr p, std::size_t bytes) const {
  const auto lo = reinterpret_cast<CUdeviceptr>(base_);
  return p < lo + reserved_ && p + bytes > lo;
}

void vmm_space::give_back(std::map<std::size_t, std::size_t>& ranges, std::size_t offset, std::size_t length) {
  auto next = ranges.lower_bound(offset);
  if (next != ranges.end() && offset + length == next->first) {
    length += next->second;
    next = ranges.erase(next);
  }
  if (next != ranges.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second == offset) {
      previous->second += length;
      return;
    }
  }
  ranges.emplace(offset, length);
}

// ---- addresses ----

CUresult vmm_space::reserve(CUdeviceptr* out, std::size_t size, std::size_t alignment, CUdeviceptr hint,
                            unsigned long long flags) {
  if (out == nullptr || size == 0 || !aligned(size) || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (alignment != 0 && !std::has_single_bit(alignment)) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t align = std::max(alignment, gran);
  std::lock_guard lock(mutex_);
  const auto lo = reinterpret_cast<CUdeviceptr>(base_);
  // The hint is honoured when that exact range is free (the driver treats it as a hint too).
  if (hint != 0 && hint % align == 0 && in_arena(hint, size) && take_exact(free_addresses_, hint - lo, size)) {
    reservations_.emplace(hint, size);
    *out = hint;
    return CUDA_SUCCESS;
  }
  auto offset = take_first_fit(free_addresses_, size, align, lo);
  if (!offset) return CUDA_ERROR_OUT_OF_MEMORY;
  *out = lo + *offset;
  reservations_.emplace(*out, size);
  return CUDA_SUCCESS;
}

CUresult vmm_space::free_range(CUdeviceptr ptr, std::size_t size) {
  std::lock_guard lock(mutex_);
  auto it = reservations_.find(ptr);
  if (it == reservations_.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  // Everything mapped in it must have been unmapped first.
  auto m = mappings_.lower_bound(ptr);
  if (m != mappings_.end() && m->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
  reservations_.erase(it);
  give_back(free_addresses_, ptr - reinterpret_cast<CUdeviceptr>(base_), size);
  return CUDA_SUCCESS;
}

// ---- physical memory ----

CUresult vmm_space::create(CUmemGenericAllocationHandle* handle, std::size_t size, const CUmemAllocationProp* prop,
                           unsigned long long flags, fault_injector& faults) {
  if (handle == nullptr || prop == nullptr || size == 0 || !aligned(size) || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_NOT_SUPPORTED;
  if (prop->location.id < 0 || static_cast<std::size_t>(prop->location.id) >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  if (prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE &&
      prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (faults.should_fail_allocation()) return CUDA_ERROR_OUT_OF_MEMORY;
  const int device = prop->location.id;
  device_address_space& memory = *devices_[static_cast<std::size_t>(device)];
  if (CUresult r = memory.charge(size); r != CUDA_SUCCESS) return r;

  if (prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    // Shareable: a memfd of its own, which other processes can map (see export_handle).
    const std::string name = "gpumem-sim-vmm-" + std::to_string(device);
    const int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
      if (fd >= 0) close(fd);
      memory.uncharge(size);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    physical p;
    p.device = device;
    p.size = size;
    p.handle_types = prop->requestedHandleTypes;
    p.own_fd = fd;
    std::lock_guard lock(mutex_);
    const CUmemGenericAllocationHandle h = next_handle_++;
    handles_.emplace(h, p);
    *handle = h;
    return CUDA_SUCCESS;
  }

  std::lock_guard lock(mutex_);
  backing& b = backings_[static_cast<std::size_t>(device)];
  if (b.fd < 0) {
    const std::string name = "gpumem-sim-device-" + std::to_string(device);
    const int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
    const std::size_t bytes = round_up(memory.capacity(), gran) * backing_factor;
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      if (fd >= 0) close(fd);
      memory.uncharge(size);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    b.fd = fd;
    b.size = bytes;
    b.free_extents.emplace(0, bytes);
  }
  auto extent = take_first_fit(b.free_extents, size, gran);
  if (!extent) {
    memory.uncharge(size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  physical p;
  p.device = device;
  p.size = size;
  p.file_offset = *extent;
  p.handle_types = prop->requestedHandleTypes;
  const CUmemGenericAllocationHandle h = next_handle_++;
  handles_.emplace(h, p);
  *handle = h;
  return CUDA_SUCCESS;
}

vmm_space::physical* vmm_space::live_handle(CUmemGenericAllocationHandle handle) {
  auto it = handles_.find(handle);
  if (it == handles_.end() || it->second.references == 0) return nullptr;
  return &it->second;
}

void vmm_space::destroy_if_unused_locked(CUmemGenericAllocationHandle handle) {
  auto it = handles_.find(handle);
  if (it == handles_.end() || it->second.references != 0 || it->second.mappings != 0) return;
  const physical& p = it->second;
  if (p.own_fd >= 0) {
    // The memfd's pages go once no process maps or holds it (importers may still).
    close(p.own_fd);
    if (!p.imported) devices_[static_cast<std::size_t>(p.device)]->uncharge(p.size);
    handles_.erase(it);
    return;
  }
  backing& b = backings_[static_cast<std::size_t>(p.device)];
  // The pages go back to the host; the next handle placed there reads zeros.
  fallocate(b.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(p.file_offset),
            static_cast<off_t>(p.size));
  give_back(b.free_extents, p.file_offset, p.size);
  devices_[static_cast<std::size_t>(p.device)]->uncharge(p.size);
  handles_.erase(it);
}

CUresult vmm_space::release(CUmemGenericAllocationHandle handle) {
  std::lock_guard lock(mutex_);
  physical* p = live_handle(handle);
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  --p->references;
  destroy_if_unused_locked(handle);
  return CUDA_SUCCESS;
}

CUresult vmm_space::retain(CUmemGenericAllocationHandle* handle, CUdeviceptr ptr) {
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(mutex_);
  auto it = mappings_.upper_bound(ptr);
  if (it == mappings_.begin()) return CUDA_ERROR_INVALID_VALUE;
  --it;
  if (ptr - it->first >= it->second.size) return CUDA_ERROR_INVALID_VALUE;
  // A mapped handle whose references were all released can be retained again.
  ++handles_.at(it->second.handle).references;
  *handle = it->second.handle;
  return CUDA_SUCCESS;
}

// ---- sharing with other processes ----

CUresult vmm_space::export_handle(void* shareable, CUmemGenericAllocationHandle handle, CUmemAllocationHandleType type,
                                  unsigned long long flags) {
  if (shareable == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  std::lock_guard lock(mutex_);
  physical* p = live_handle(handle);
  // Only handles created with this handle type can be exported (as with the driver).
  if (p == nullptr || p->own_fd < 0) return CUDA_ERROR_INVALID_VALUE;
  const int fd = fcntl(p->own_fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;  // out of descriptors
  *static_cast<int*>(shareable) = fd;
  return CUDA_SUCCESS;
}

CUresult vmm_space::import_handle(CUmemGenericAllocationHandle* handle, void* os_handle,
                                  CUmemAllocationHandleType type) {
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  // A POSIX file descriptor is passed as the pointer's value, as cuda.h says.
  const int fd = static_cast<int>(reinterpret_cast<std::intptr_t>(os_handle));
  if (fd < 0) return CUDA_ERROR_INVALID_VALUE;
  // Only the simulator's own memfds are handles: their name says which device.
  char link[128] = {};
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(path, link, sizeof link - 1);
  static constexpr char prefix[] = "/memfd:gpumem-sim-vmm-";
  if (n <= 0 || std::strncmp(link, prefix, sizeof prefix - 1) != 0) return CUDA_ERROR_INVALID_VALUE;
  const int device = std::atoi(link + sizeof prefix - 1);
  struct stat st {};
  if (device < 0 || static_cast<std::size_t>(device) >= device_count() || fstat(fd, &st) != 0 || st.st_size <= 0 ||
      !aligned(static_cast<std::size_t>(st.st_size))) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);  // the caller keeps (and closes) its descriptor
  if (own < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  physical p;
  p.device = device;
  p.size = static_cast<std::size_t>(st.st_size);
  p.handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  p.own_fd = own;
  p.imported = true;
  std::lock_guard lock(mutex_);
  const CUmemGenericAllocationHandle h = next_handle_++;
  handles_.emplace(h, p);
  *handle = h;
  return CUDA_SUCCESS;
}

// ---- mappings ----

CUresult vmm_space::map(CUdeviceptr ptr, std::size_t size, std::size_t offset, CUmemGenericAllocationHandle handle,
                        unsigned long long flags) {
  if (ptr == 0 || size == 0 || flags != 0 || !aligned(ptr) || !aligned(size) || !aligned(offset)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::lock_guard lock(mutex_);
  physical* p = live_handle(handle);
  if (p == nullptr || offset > p->size || size > p->size - offset) return CUDA_ERROR_INVALID_VALUE;
  // Inside one reservation...
  auto r = reservations_.upper_bound(ptr);
  if (r == reservations_.begin()) return CUDA_ERROR_INVALID_VALUE;
  --r;
  if (ptr - r->first >= r->second || size > r->second - (ptr - r->first)) return CUDA_ERROR_INVALID_VALUE;
  // ...and over nothing mapped.
  auto next = mappings_.lower_bound(ptr);
  if (next != mappings_.end() && next->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
  if (next != mappings_.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second.size > ptr) return CUDA_ERROR_INVALID_VALUE;
  }
  const backing& b = backings_[static_cast<std::size_t>(p->device)];
  const int fd = p->own_fd >= 0 ? p->own_fd : b.fd;
  void* at = reinterpret_cast<void*>(ptr);
  // PROT_NONE until cuMemSetAccess: as on a GPU, mapped memory is not accessible yet.
  if (mmap(at, size, PROT_NONE, MAP_SHARED | MAP_FIXED, fd, static_cast<off_t>(p->file_offset + offset)) ==
      MAP_FAILED) {
    mmap(at, size, PROT_NONE, reserved_flags | MAP_FIXED, -1, 0);
    return CUDA_ERROR_OUT_OF_MEMORY;  // the host ran out of mappings (vm.max_map_count)
  }
  mapping m;
  m.size = size;
  m.offset = offset;
  m.handle = handle;
  m.access.assign(device_count(), CU_MEM_ACCESS_FLAGS_PROT_NONE);
  mappings_.emplace(ptr, std::move(m));
  ++p->mappings;
  return CUDA_SUCCESS;
}

std::vector<std::map<CUdeviceptr, vmm_space::mapping>::iterator> vmm_space::whole_mappings_locked(CUdeviceptr ptr,
                                                                                                   std::size_t size) {
  std::vector<std::map<CUdeviceptr, mapping>::iterator> out;
  CUdeviceptr at = ptr;
  auto it = mappings_.find(ptr);
  while (it != mappings_.end() && it->first == at && at < ptr + size) {
    out.push_back(it);
    at += it->second.size;
    ++it;
  }
  if (at != ptr + size) out.clear();  // a gap, or a mapping cut by the range's end
  return out;
}

CUresult vmm_space::unmap(CUdeviceptr ptr, std::size_t size) {
  if (ptr == 0 || size == 0 || !aligned(ptr) || !aligned(size)) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(mutex_);
  // Whole mappings only, as the driver requires (it cannot unmap part of a mapping).
  auto covered = whole_mappings_locked(ptr, size);
  if (covered.empty()) return CUDA_ERROR_INVALID_VALUE;
  // Does not wait for work in flight, as on a GPU: the pages fault from now on.
  mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, reserved_flags | MAP_FIXED, -1, 0);
  for (auto it : covered) {
    const CUmemGenericAllocationHandle h = it->second.handle;
    --handles_.at(h).mappings;
    mappings_.erase(it);
    destroy_if_unused_locked(h);
  }
  return CUDA_SUCCESS;
}

CUresult vmm_space::set_access(CUdeviceptr ptr, std::size_t size, const CUmemAccessDesc* desc, std::size_t count) {
  if (ptr == 0 || size == 0 || desc == nullptr || count == 0 || !aligned(ptr) || !aligned(size)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (std::size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (desc[i].location.id < 0 || static_cast<std::size_t>(desc[i].location.id) >= device_count()) {
      return CUDA_ERROR_INVALID_DEVICE;
    }
    if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  std::lock_guard lock(mutex_);
  auto covered = whole_mappings_locked(ptr, size);
  if (covered.empty()) return CUDA_ERROR_INVALID_VALUE;  // the range must be fully mapped
  for (auto it : covered) {
    mapping& m = it->second;
    for (std::size_t i = 0; i < count; ++i) m.access[static_cast<std::size_t>(desc[i].location.id)] = desc[i].flags;
    // Every device is host memory here, so the host protection is the most any device has.
    mprotect(reinterpret_cast<void*>(it->first), m.size, protection_of(m.access));
  }
  return CUDA_SUCCESS;
}

CUresult vmm_space::get_access(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr) {
  if (flags == nullptr || location == nullptr || location->type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (location->id < 0 || static_cast<std::size_t>(location->id) >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard lock(mutex_);
  auto it = mappings_.upper_bound(ptr);
  if (it == mappings_.begin()) return CUDA_ERROR_INVALID_VALUE;
  --it;
  if (ptr - it->first >= it->second.size) return CUDA_ERROR_INVALID_VALUE;
  *flags = it->second.access[static_cast<std::size_t>(location->id)];
  return CUDA_SUCCESS;
}

CUresult vmm_space::check_access(CUdeviceptr p, std::size_t bytes) const {
  std::lock_guard lock(mutex_);
  CUdeviceptr at = p;
  const CUdeviceptr end = p + bytes;
  auto it = mappings_.upper_bound(at);
  if (it == mappings_.begin()) return CUDA_ERROR_INVALID_VALUE;
  --it;
  while (at < end) {
    if (it == mappings_.end() || it->first > at || at - it->first >= it->second.size) return CUDA_ERROR_INVALID_VALUE;
    if (protection_of(it->second.access) == PROT_NONE) return CUDA_ERROR_INVALID_VALUE;
    at = it->first + it->second.size;
    ++it;
  }
  return CUDA_SUCCESS;
}

std::optional<vmm_space::mapped_range> vmm_space::find(CUdeviceptr p) const {
  if (!overlaps(p, 1)) return std::nullopt;
  std::lock_guard lock(mutex_);
  auto it = mappings_.upper_bound(p);
  if (it == mappings_.begin()) return std::nullopt;
  --it;
  if (p - it->first >= it->second.size) return std::nullopt;
  return mapped_range{it->first, it->second.size, handles_.at(it->second.handle).device};
}

// ---- entry points: none needs a current context ----

CUresult mem_get_allocation_granularity(std::size_t* granularity, const CUmemAllocationProp* prop,
                                        CUmemAllocationGranularity_flags option) {
  return entry_point([&](sim_state& state) {
    if (granularity == nullptr || prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
    if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_NOT_SUPPORTED;
    if (state.device(prop->location.id) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    *granularity = vmm_space::granularity;
    return CUDA_SUCCESS;
  });
}

CUresult mem_address_reserve(CUdeviceptr* ptr, std::size_t size, std::size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
  return entry_point([&](sim_state& state) { return state.vmm->reserve(ptr, size, alignment, addr, flags); });
}

CUresult mem_address_free(CUdeviceptr ptr, std::size_t size) {
  return entry_point([&](sim_state& state) { return state.vmm->free_range(ptr, size); });
}

CUresult mem_create(CUmemGenericAllocationHandle* handle, std::size_t size, const CUmemAllocationProp* prop,
                    unsigned long long flags) {
  return entry_point([&](sim_state& state) { return state.vmm->create(handle, size, prop, flags, state.faults); });
}

CUresult mem_release(CUmemGenericAllocationHandle handle) {
  return entry_point([&](sim_state& state) { return state.vmm->release(handle); });
}

CUresult mem_map(CUdeviceptr ptr, std::size_t size, std::size_t offset, CUmemGenericAllocationHandle handle,
                 unsigned long long flags) {
  return entry_point([&](sim_state& state) {
    const CUresult r = state.vmm->map(ptr, size, offset, handle, flags);
    if (r == CUDA_SUCCESS && state.faults.should_fail_mapping()) {
      (void)state.vmm->unmap(ptr, size);  // the driver reports the failure with nothing mapped
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return r;
  });
}

CUresult mem_unmap(CUdeviceptr ptr, std::size_t size) {
  return entry_point([&](sim_state& state) { return state.vmm->unmap(ptr, size); });
}

CUresult mem_set_access(CUdeviceptr ptr, std::size_t size, const CUmemAccessDesc* desc, std::size_t count) {
  return entry_point([&](sim_state& state) {
    if (state.faults.should_fail_mapping()) return CUDA_ERROR_OUT_OF_MEMORY;
    return state.vmm->set_access(ptr, size, desc, count);
  });
}

CUresult mem_get_access(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr) {
  return entry_point([&](sim_state& state) { return state.vmm->get_access(flags, location, ptr); });
}

CUresult mem_export_to_shareable_handle(void* shareable_handle, CUmemGenericAllocationHandle handle,
                                        CUmemAllocationHandleType type, unsigned long long flags) {
  return entry_point([&](sim_state& state) { return state.vmm->export_handle(shareable_handle, handle, type, flags); });
}

CUresult mem_import_from_shareable_handle(CUmemGenericAllocationHandle* handle, void* os_handle,
                                          CUmemAllocationHandleType type) {
  return entry_point([&](sim_state& state) { return state.vmm->import_handle(handle, os_handle, type); });
}

CUresult mem_retain_allocation_handle(CUmemGenericAllocationHandle* handle, void* addr) {
  return entry_point(
      [&](sim_state& state) { return state.vmm->retain(handle, reinterpret_cast<CUdeviceptr>(addr)); });
}

}  // namespace gpumem::detail::simulator
