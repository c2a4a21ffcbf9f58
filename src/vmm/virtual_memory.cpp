// The virtual-memory layer over the driver seam (see virtual_memory.hpp).
#include "vmm/virtual_memory.hpp"
#include "diagnose.hpp"

#include <array>
#include <atomic>
#include <cstdio>
#include <exception>
#include <string>
#include <utility>

#include "driver/capture_interaction.hpp"
#include "driver/driver.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/vmm/virtual_memory.hpp"

namespace gpumem::detail::vmm {
namespace {

constexpr int max_devices = 64;

CUmemAllocationProp device_prop(int device, bool posix_fd_shareable) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = posix_fd_shareable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  return prop;
}

}  // namespace

std::size_t round_up(std::size_t n, std::size_t unit) { return (n + unit - 1) / unit * unit; }

std::size_t granularity(int device) {
  static std::array<std::atomic<std::size_t>, max_devices> cache{};
  validate_device(device, "gpumem::vmm::granularity");
  if (std::size_t g = cache[static_cast<std::size_t>(device)].load(std::memory_order_relaxed)) return g;
  int supported = 0;
  GPUMEM_CU(cuDeviceGetAttribute, &supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device);
  if (supported == 0) {
    throw logic_error("gpumem: device " + std::to_string(device) + " does not support virtual memory management");
  }
  const CUmemAllocationProp prop = device_prop(device, false);
  std::size_t g = 0;
  GPUMEM_CU(cuMemGetAllocationGranularity, &g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  cache[static_cast<std::size_t>(device)].store(g, std::memory_order_relaxed);
  return g;
}

CUdeviceptr reserve(int device, std::size_t bytes, CUdeviceptr hint, std::size_t alignment) {
  device_context_guard guard(device);
  CUdeviceptr p = 0;
  const CUresult r = driver().cuMemAddressReserve(&p, bytes, alignment, hint, 0);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) return 0;
  check(r, "cuMemAddressReserve", __FILE__, __LINE__);
  return p;
}

void free_addresses(int device, CUdeviceptr base, std::size_t bytes) {
  device_context_guard guard(device);
  GPUMEM_CU(cuMemAddressFree, base, bytes);
}

std::optional<CUmemGenericAllocationHandle> create(int device, std::size_t bytes, bool posix_fd_shareable) {
  device_context_guard guard(device);
  const CUmemAllocationProp prop = device_prop(device, posix_fd_shareable);
  CUmemGenericAllocationHandle h = 0;
  const CUresult r = driver().cuMemCreate(&h, bytes, &prop, 0);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) return std::nullopt;
  check(r, "cuMemCreate", __FILE__, __LINE__);
  return h;
}

void release(int device, CUmemGenericAllocationHandle handle) {
  device_context_guard guard(device);
  GPUMEM_CU(cuMemRelease, handle);
}

void map(int device, CUdeviceptr at, std::size_t bytes, CUmemGenericAllocationHandle handle, std::size_t offset) {
  device_context_guard guard(device);
  GPUMEM_CU(cuMemMap, at, bytes, offset, handle, 0);
}

void unmap(int device, CUdeviceptr at, std::size_t bytes) {
  device_context_guard guard(device);
  GPUMEM_CU(cuMemUnmap, at, bytes);
}

void set_access(int device, CUdeviceptr at, std::size_t bytes, const std::vector<int>& peers) {
  std::vector<CUmemAccessDesc> desc;
  desc.reserve(peers.size() + 1);
  auto add = [&](int d) {
    for (const auto& x : desc) {
      if (x.location.id == d) return;
    }
    CUmemAccessDesc a{};
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = d;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    desc.push_back(a);
  };
  add(device);
  for (int p : peers) add(p);
  device_context_guard guard(device);
  GPUMEM_CU(cuMemSetAccess, at, bytes, desc.data(), desc.size());
}

// ---- release_queue ----

release_queue::~release_queue() {
  std::lock_guard lock(mutex_);
  if (!entries_.empty()) {
    detail::diagnosef(diagnostic_level::warning, "gpumem: vmm: %zu unmap/release(s) still waiting for their streams at destruction; left to the driver\n",
                 entries_.size());
  }
}

void release_queue::run(entry& e) noexcept {
  try {
    e.action();
  } catch (const std::exception& x) {
    detail::diagnosef(diagnostic_level::error, "gpumem: vmm: giving memory back failed: %s\n", x.what());
  }
  if (e.event != nullptr) {
    if (const driver_api* d = driver_if_selected()) d->cuEventDestroy(e.event);
  }
}

void release_queue::enqueue(int device, stream_view stream, std::function<void()> action) {
  device_context_guard guard(device);
  // Nothing queued on the stream is still running: no work before this call can
  // use the memory, so it goes back now (earlier entries first).
  if (driver().cuStreamQuery(stream.handle()) == CUDA_SUCCESS) {
    poll();  // what is left waits on other streams (this one is idle): not ordered before this entry
    entry e{device, nullptr, std::move(action)};
    run(e);
    return;
  }
  CUevent ev = nullptr;
  GPUMEM_CU(cuEventCreate, &ev, CU_EVENT_DISABLE_TIMING);
  CUresult r = driver().cuEventRecord(ev, stream.handle());
  if (r != CUDA_SUCCESS) {
    driver().cuEventDestroy(ev);
    check(r, "cuEventRecord", __FILE__, __LINE__);
  }
  entry e{device, ev, std::move(action)};
  if (driver().cuEventQuery(ev) == CUDA_SUCCESS) {  // the stream was idle: nothing to wait for
    poll();  // entries queued before (earlier on the same stream) run first
    run(e);
    return;
  }
  std::lock_guard lock(mutex_);
  entries_.push_back(std::move(e));
}

std::size_t release_queue::poll() {
  std::deque<entry> ready;
  {
    std::lock_guard lock(mutex_);
    if (entries_.empty()) return 0;
    relaxed_capture_interaction relaxed;  // Note [Calls a capture elsewhere forbids]
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->event == nullptr || driver().cuEventQuery(it->event) == CUDA_SUCCESS) {
        ready.push_back(std::move(*it));
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& e : ready) run(e);
  return ready.size();
}

std::size_t release_queue::drain() {
  std::deque<entry> all;
  {
    std::lock_guard lock(mutex_);
    all.swap(entries_);
  }
  for (auto& e : all) {
    if (e.event != nullptr) driver().cuEventSynchronize(e.event);  // that stream's work only
    run(e);
  }
  return all.size();
}

void release_queue::move_into(release_queue& other) {
  if (&other == this) return;
  std::deque<entry> mine;
  {
    std::lock_guard lock(mutex_);
    mine.swap(entries_);
  }
  std::lock_guard lock(other.mutex_);
  for (auto& e : mine) other.entries_.push_back(std::move(e));
}

bool release_queue::empty() const {
  std::lock_guard lock(mutex_);
  return entries_.empty();
}

release_queue& global_release_queue() {
  static release_queue* q = new release_queue();  // never destroyed: entries may outlive statics
  return *q;
}

void throw_out_of_memory(const char* resource, int device, std::size_t requested, std::size_t held,
                         const std::string& reason) {
  out_of_memory_info info;
  info.requested_bytes = requested;
  info.device = device;
  info.resource = resource;
  info.resource_held_bytes = held;
  try {
    const memory_info m = device_memory_info(device);
    info.device_free_bytes = m.free_bytes;
    info.device_total_bytes = m.total_bytes;
  } catch (...) {
    // The device cannot say: the error still names the request and the reason.
  }
  info.reason = reason;
  throw out_of_memory(std::move(info));
}

}  // namespace gpumem::detail::vmm

namespace gpumem::vmm {

bool supported(int device) {
  detail::validate_device(device, "gpumem::vmm::supported");
  int value = 0;
  GPUMEM_CU(cuDeviceGetAttribute, &value, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device);
  return value != 0;
}

std::size_t granularity(int device) { return detail::vmm::granularity(device); }

std::size_t reclaim(bool wait) {
  auto& q = detail::vmm::global_release_queue();
  return wait ? q.drain() : q.poll();
}

}  // namespace gpumem::vmm
