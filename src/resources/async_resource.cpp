// async_resource (include/gpumem/async_resource.hpp): the driver's stream-ordered
// allocator on a pool this resource owns or wraps, with a record of live
// allocations for the contract's pointer checks.
#include "gpumem/async_resource.hpp"
#include "diagnose.hpp"
#include "gpumem/ipc.hpp"

#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

#include "driver/capture_interaction.hpp"
#include "driver/driver.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/stream.hpp"
#include "live_allocations.hpp"
#include "stream_device.hpp"

namespace gpumem {
namespace {

// The driver's allocations are aligned to default_alignment (cuMemAlloc's
// documented 256 bytes, its pools' and managed memory's too); larger alignments
// are made by over-allocating.
constexpr std::size_t driver_alignment = default_alignment;

std::string describe_bytes(std::size_t bytes) { return std::to_string(bytes) + " bytes"; }

int device_attribute(CUdevice_attribute attribute, int device) {
  int value = 0;
  GPUMEM_CU(cuDeviceGetAttribute, &value, attribute, device);
  return value;
}

cuuint64_t pool_attribute(CUmemoryPool pool, CUmemPool_attribute attribute) {
  cuuint64_t value = 0;
  GPUMEM_CU(cuMemPoolGetAttribute, pool, attribute, &value);
  return value;
}

void set_flag(CUmemoryPool pool, CUmemPool_attribute attribute, bool on) {
  int value = on ? 1 : 0;
  GPUMEM_CU(cuMemPoolSetAttribute, pool, attribute, &value);
}

bool get_flag(CUmemoryPool pool, CUmemPool_attribute attribute) {
  int value = 0;
  GPUMEM_CU(cuMemPoolGetAttribute, pool, attribute, &value);
  return value != 0;
}

void require_pool_support(int device) {
  if (device_attribute(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, device) == 0) {
    throw cuda_error(CUDA_ERROR_NOT_SUPPORTED, "gpumem::async_resource",
                     "device " + std::to_string(device) + " does not support memory pools (cuMemAllocAsync)");
  }
}

}  // namespace

struct async_resource::state {
  int device = 0;
  CUmemoryPool pool = nullptr;
  bool owned = false;
  async_ipc_handle ipc = async_ipc_handle::none;
  std::size_t maximum_bytes = 0;  // 0: the device's
  std::size_t device_total_bytes = 0;
  detail::live_allocations live;
};

namespace {

void prime(CUmemoryPool pool, int device, std::size_t bytes) {
  detail::device_context_guard guard(device);
  stream s(device);
  CUdeviceptr p = 0;
  CUresult r = detail::driver().cuMemAllocFromPoolAsync(&p, bytes, pool, s.handle());
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    const memory_info m = device_memory_info(device);
    throw out_of_memory({.requested_bytes = bytes, .device = device, .resource = "async_resource",
                         .resource_held_bytes = 0, .device_free_bytes = m.free_bytes,
                         .device_total_bytes = m.total_bytes,
                         .reason = "the device has no room for initial_bytes"});
  }
  detail::check(r, "cuMemAllocFromPoolAsync", __FILE__, __LINE__);
  GPUMEM_CU(cuMemFreeAsync, p, s.handle());
  // The free is seen complete here, so the pool keeps the memory (threshold >= bytes).
  s.synchronize();
}

}  // namespace

async_resource::async_resource(int device, async_options options) : state_(std::make_unique<state>()) {
  state& s = *state_;
  s.device = device == -1 ? current_device() : device;
  detail::validate_device(s.device, "gpumem::async_resource");
  if (options.maximum_bytes != 0 && options.initial_bytes > options.maximum_bytes) {
    throw logic_error("gpumem::async_resource: initial_bytes (" + describe_bytes(options.initial_bytes) +
                      ") is above maximum_bytes (" + describe_bytes(options.maximum_bytes) + ")");
  }
  if (options.initial_bytes > options.release_threshold_bytes) {
    throw logic_error("gpumem::async_resource: initial_bytes (" + describe_bytes(options.initial_bytes) +
                      ") is above release_threshold_bytes (" + describe_bytes(options.release_threshold_bytes) +
                      "): the pool would give it back at the first synchronisation");
  }
  require_pool_support(s.device);
  if (options.ipc == async_ipc_handle::posix_file_descriptor &&
      (device_attribute(CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, s.device) &
       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
    throw cuda_error(CUDA_ERROR_NOT_SUPPORTED, "gpumem::async_resource",
                     "device " + std::to_string(s.device) +
                         " cannot share memory pools through POSIX file descriptors");
  }
  s.device_total_bytes = device_memory_info(s.device).total_bytes;

  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.handleTypes = options.ipc == async_ipc_handle::posix_file_descriptor
                          ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                          : CU_MEM_HANDLE_TYPE_NONE;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = s.device;
  // A maximum at or past the device's memory is the whole device: the driver
  // refuses a pool whose maxSize is far past it (CUDA_ERROR_OUT_OF_MEMORY).
  if (options.maximum_bytes >= s.device_total_bytes) options.maximum_bytes = 0;
  props.maxSize = options.maximum_bytes;  // 0: the driver's default, the whole device
  {
    detail::device_context_guard guard(s.device);
    GPUMEM_CU(cuMemPoolCreate, &s.pool, &props);
  }
  s.owned = true;
  s.ipc = options.ipc;
  s.maximum_bytes = options.maximum_bytes;
  try {
    set_release_threshold(options.release_threshold_bytes);
    set_reuse_policy(options.reuse);
    if (options.initial_bytes > 0) prime(s.pool, s.device, options.initial_bytes);
    if (options.access_for_every_peer) {
      for (int peer : peers_of(s.device)) set_access(peer, pool_access::read_write);
    }
  } catch (...) {
    (void)detail::driver().cuMemPoolDestroy(s.pool);
    throw;
  }
}

async_resource::async_resource(existing_pool which, int device) : state_(std::make_unique<state>()) {
  state& s = *state_;
  s.device = device == -1 ? current_device() : device;
  detail::validate_device(s.device, "gpumem::async_resource");
  require_pool_support(s.device);
  s.device_total_bytes = device_memory_info(s.device).total_bytes;
  if (which == existing_pool::device_default) {
    GPUMEM_CU(cuDeviceGetDefaultMemPool, &s.pool, s.device);
  } else {
    GPUMEM_CU(cuDeviceGetMemPool, &s.pool, s.device);
  }
}

async_resource::~async_resource() {
  state& s = *state_;
  try {
    if (s.live.count() != 0) {
      // Leaked allocations: report them and give the memory back once the work
      // that may still use them is done.
      detail::diagnosef(diagnostic_level::warning,
                   "gpumem: async_resource on device %d destroyed with %zu live allocation(s), %zu bytes; "
                   "freeing them\n",
                   s.device, s.live.count(), s.live.bytes());
      detail::device_context_guard guard(s.device);
      (void)detail::driver().cuCtxSynchronize();
      for (const auto& e : s.live.drain()) {
        (void)detail::driver().cuMemFreeAsync(reinterpret_cast<CUdeviceptr>(e.base), CU_STREAM_LEGACY);
      }
    }
    // Returns at once; the driver gives the memory back as pending frees complete.
    if (s.owned) (void)detail::driver().cuMemPoolDestroy(s.pool);
  } catch (...) {
    // The driver is gone (process teardown): nothing left to give back.
  }
}

int async_resource::device() const noexcept { return state_->device; }
CUmemoryPool async_resource::pool_handle() const noexcept { return state_->pool; }
bool async_resource::owns_pool() const noexcept { return state_->owned; }
async_ipc_handle async_resource::ipc_handle() const noexcept { return state_->ipc; }
std::size_t async_resource::allocated_bytes() const noexcept { return state_->live.bytes(); }
std::size_t async_resource::allocation_count() const noexcept { return state_->live.count(); }

void async_resource::trim_to(std::size_t bytes_to_keep) { GPUMEM_CU(cuMemPoolTrimTo, state_->pool, bytes_to_keep); }

async_statistics async_resource::statistics() const {
  const CUmemoryPool pool = state_->pool;
  return {.used_bytes = static_cast<std::size_t>(pool_attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT)),
          .reserved_bytes = static_cast<std::size_t>(pool_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)),
          .used_high_bytes = static_cast<std::size_t>(pool_attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH)),
          .reserved_high_bytes = static_cast<std::size_t>(pool_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH))};
}

void async_resource::reset_high_watermarks() {
  // The driver only allows setting a high watermark to 0, which makes it the current value.
  cuuint64_t zero = 0;
  GPUMEM_CU(cuMemPoolSetAttribute, state_->pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero);
  GPUMEM_CU(cuMemPoolSetAttribute, state_->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero);
}

std::size_t async_resource::release_threshold() const {
  const cuuint64_t v = pool_attribute(state_->pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD);
  return v > std::numeric_limits<std::size_t>::max() ? std::numeric_limits<std::size_t>::max()
                                                      : static_cast<std::size_t>(v);
}

void async_resource::set_release_threshold(std::size_t bytes) {
  cuuint64_t value = bytes;
  GPUMEM_CU(cuMemPoolSetAttribute, state_->pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &value);
}

async_reuse_policy async_resource::reuse_policy() const {
  const CUmemoryPool pool = state_->pool;
  return {.follow_event_dependencies = get_flag(pool, CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES),
          .allow_opportunistic = get_flag(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC),
          .allow_internal_dependencies = get_flag(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES)};
}

void async_resource::set_reuse_policy(const async_reuse_policy& policy) {
  const CUmemoryPool pool = state_->pool;
  set_flag(pool, CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, policy.follow_event_dependencies);
  set_flag(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, policy.allow_opportunistic);
  set_flag(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, policy.allow_internal_dependencies);
}

void async_resource::set_access(int peer_device, pool_access access) {
  detail::validate_device(peer_device, "gpumem::async_resource::set_access");
  if (peer_device == state_->device) {
    throw logic_error("gpumem::async_resource::set_access: device " + std::to_string(peer_device) +
                      " owns the pool; its read-write access cannot change");
  }
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = peer_device;
  desc.flags = access == pool_access::read_write ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
               : access == pool_access::read     ? CU_MEM_ACCESS_FLAGS_PROT_READ
                                                 : CU_MEM_ACCESS_FLAGS_PROT_NONE;
  GPUMEM_CU(cuMemPoolSetAccess, state_->pool, &desc, 1);
}

pool_access async_resource::access_from(int device) const {
  detail::validate_device(device, "gpumem::async_resource::access_from");
  CUmemLocation where{};
  where.type = CU_MEM_LOCATION_TYPE_DEVICE;
  where.id = device;
  CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  GPUMEM_CU(cuMemPoolGetAccess, &flags, state_->pool, &where);
  switch (flags) {
    case CU_MEM_ACCESS_FLAGS_PROT_READWRITE: return pool_access::read_write;
    case CU_MEM_ACCESS_FLAGS_PROT_READ: return pool_access::read;
    default: return pool_access::none;
  }
}

resource_properties async_resource::properties() const noexcept {
  return {.device = state_->device, .device_accessible = true, .host_accessible = false, .thread_safe = true};
}

void* async_resource::do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) {
  state& s = *state_;
  detail::device_context_guard guard(s.device);
  detail::check_stream_device(stream, s.device, "gpumem::async_resource::allocate");
  const std::size_t padding = alignment > driver_alignment ? alignment - driver_alignment : 0;
  const std::size_t limit = s.maximum_bytes != 0 ? s.maximum_bytes : s.device_total_bytes;
  if (bytes > limit || padding > limit - bytes) {
    throw out_of_memory({.requested_bytes = bytes, .device = s.device, .resource = "async_resource",
                         .resource_held_bytes = s.live.bytes(),
                         .device_free_bytes = device_memory_info(s.device).free_bytes,
                         .device_total_bytes = s.device_total_bytes,
                         .reason = s.maximum_bytes != 0 && s.maximum_bytes < s.device_total_bytes
                                       ? "the request is larger than the pool's maximum_bytes (" +
                                             describe_bytes(s.maximum_bytes) + ")"
                                       : "the request is larger than the device's total memory"});
  }
  CUdeviceptr base = 0;
  CUresult r = CUDA_SUCCESS;
  {
    detail::relaxed_capture_interaction relaxed;  // Note [Calls a capture elsewhere forbids]
    r = detail::driver().cuMemAllocFromPoolAsync(&base, bytes + padding, s.pool, stream.handle());
  }
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    // Memory is short. The pool may hold free memory it cannot use for this
    // request (scattered, or freed on streams it may not take from yet): wait
    // for the device once, so every free is seen complete, give the pool's free
    // memory back, and try again. Off the hot path, like pool_resource's step 4.
    GPUMEM_CU(cuCtxSynchronize);
    GPUMEM_CU(cuMemPoolTrimTo, s.pool, 0);
    detail::relaxed_capture_interaction relaxed;
    r = detail::driver().cuMemAllocFromPoolAsync(&base, bytes + padding, s.pool, stream.handle());
  }
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    const memory_info m = device_memory_info(s.device);
    const async_statistics st = statistics();
    std::string reason = "cuMemAllocFromPoolAsync found no room: the pool holds " +
                         describe_bytes(st.reserved_bytes) + ", " + describe_bytes(st.used_bytes) + " of it in use";
    if (s.maximum_bytes != 0 && st.reserved_bytes + bytes + padding > s.maximum_bytes) {
      reason += "; the pool's maximum_bytes (" + describe_bytes(s.maximum_bytes) + ") is reached";
    }
    throw out_of_memory({.requested_bytes = bytes, .device = s.device, .resource = "async_resource",
                         .resource_held_bytes = st.reserved_bytes, .device_free_bytes = m.free_bytes,
                         .device_total_bytes = m.total_bytes, .reason = std::move(reason)});
  }
  detail::check(r, "cuMemAllocFromPoolAsync", __FILE__, __LINE__);
  const std::uintptr_t aligned = (base + alignment - 1) & ~(std::uintptr_t{alignment} - 1);
  void* user = reinterpret_cast<void*>(aligned);
  s.live.insert(user, {reinterpret_cast<void*>(base), bytes});
  return user;
}

void async_resource::do_deallocate(void* ptr, std::size_t bytes, stream_view stream, std::size_t /*alignment*/) {
  state& s = *state_;
  detail::device_context_guard guard(s.device);
  detail::check_stream_device(stream, s.device, "gpumem::async_resource::deallocate");
  const detail::live_allocations::entry e = s.live.take(ptr, bytes, "gpumem::async_resource::deallocate");
  // Stream-ordered by the driver: reused once `stream`'s earlier work is done
  // (at once by later work on `stream` itself).
  CUresult r = CUDA_SUCCESS;
  {
    detail::relaxed_capture_interaction relaxed;  // Note [Calls a capture elsewhere forbids]
    r = detail::driver().cuMemFreeAsync(reinterpret_cast<CUdeviceptr>(e.base), stream.handle());
  }
  if (r != CUDA_SUCCESS) {
    s.live.insert(ptr, e);  // still the caller's: the resource stays consistent
    detail::check(r, "cuMemFreeAsync", __FILE__, __LINE__);
  }
}


std::optional<std::size_t> async_resource::available_bytes() const {
  const async_statistics st = statistics();
  return device_memory_info(state_->device).free_bytes + (st.reserved_bytes - std::min(st.used_bytes, st.reserved_bytes));
}

std::size_t async_resource::release_free_memory() {
  const std::size_t before = statistics().reserved_bytes;
  {
    // Frees still in flight keep their memory in the pool: wait for them first.
    detail::device_context_guard guard(state_->device);
    GPUMEM_CU(cuCtxSynchronize);
  }
  trim_to(0);
  const std::size_t after = statistics().reserved_bytes;
  return before - std::min(before, after);
}

ipc_export_route async_resource::ipc_route(const void*, std::size_t) const {
  ipc_export_route route;
  if (ipc_handle() != async_ipc_handle::posix_file_descriptor) {
    route.how = ipc_export_route::way::refused;
    route.refusal = "this async_resource's pool is not shareable; construct it with async_options::ipc = "
                    "async_ipc_handle::posix_file_descriptor (the device's default pool cannot be shared)";
    return route;
  }
  route.how = ipc_export_route::way::driver_pool;
  route.pool = pool_handle();
  route.device = device();
  return route;
}

}  // namespace gpumem
