// The checks every resource shares (include/gpumem/memory_resource.hpp): a bad
// argument is reported the same way whichever resource receives it.
#include "gpumem/memory_resource.hpp"

#include <cstdint>
#include <limits>
#include <string>

#include "driver/driver.hpp"
#include "gpumem/error.hpp"
#include "gpumem/ipc.hpp"

namespace gpumem {
namespace {

// No device or host can hold more than this; larger requests (and rounding
// that would overflow) are out of memory at once.
constexpr std::size_t largest_possible_bytes = std::numeric_limits<std::size_t>::max() / 4;

void check_alignment(std::size_t alignment, const char* where) {
  // Not std::has_single_bit: without -mpopcnt that is a library call on the hot path.
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    throw logic_error(std::string(where) + ": alignment " + std::to_string(alignment) +
                      " is not a power of two");
  }
}

}  // namespace

void* memory_resource::allocate(std::size_t bytes, stream_view stream, std::size_t alignment) {
  if (bytes == 0) {
    throw logic_error("gpumem::memory_resource::allocate: 0 bytes requested (gpumem does not hand "
                      "out empty allocations)");
  }
  check_alignment(alignment, "gpumem::memory_resource::allocate");
  if (bytes > largest_possible_bytes || alignment > largest_possible_bytes) {
    out_of_memory_info info;
    info.requested_bytes = bytes;
    info.device = properties().device;
    info.reason = "the request is larger than any device or host could hold";
    throw out_of_memory(std::move(info));
  }
  return do_allocate(bytes, stream, alignment);
}

void memory_resource::deallocate(void* ptr, std::size_t bytes, stream_view stream,
                                 std::size_t alignment) {
  if (ptr == nullptr) {
    throw logic_error("gpumem::memory_resource::deallocate: null pointer");
  }
  if (bytes == 0) {
    throw logic_error("gpumem::memory_resource::deallocate: 0 bytes (pass the size allocated)");
  }
  check_alignment(alignment, "gpumem::memory_resource::deallocate");
  do_deallocate(ptr, bytes, stream, alignment);
}

void* memory_resource::try_allocate_now(std::size_t bytes, stream_view stream, std::size_t alignment) {
  // A request allocate() would refuse is not served here: allocate() raises its error.
  if (bytes == 0 || alignment == 0 || (alignment & (alignment - 1)) != 0 || bytes > largest_possible_bytes ||
      alignment > largest_possible_bytes) {
    return nullptr;
  }
  return do_try_allocate_now(bytes, stream, alignment);
}

bool memory_resource::try_deallocate_now(void* ptr, std::size_t bytes, stream_view stream, std::size_t alignment) {
  if (ptr == nullptr || bytes == 0 || alignment == 0 || (alignment & (alignment - 1)) != 0) return false;
  return do_try_deallocate_now(ptr, bytes, stream, alignment);
}

void* memory_resource::do_try_allocate_now(std::size_t, stream_view, std::size_t) { return nullptr; }

bool memory_resource::do_try_deallocate_now(void*, std::size_t, stream_view, std::size_t) { return false; }

void* memory_resource::allocate_sync(std::size_t bytes, std::size_t alignment) {
  // Allocate in order on the legacy default stream of the resource's device and
  // wait, so the memory is usable from any stream on return.
  const int device = properties().device;
  if (device < 0) {
    return allocate(bytes, stream_view{}, alignment);
  }
  detail::device_context_guard guard(device);
  void* p = allocate(bytes, stream_view::legacy_default(), alignment);
  stream_view::legacy_default().synchronize();
  return p;
}

void memory_resource::deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) {
  const int device = properties().device;
  if (device < 0) {
    deallocate(ptr, bytes, stream_view{}, alignment);
    return;
  }
  detail::device_context_guard guard(device);
  deallocate(ptr, bytes, stream_view::legacy_default(), alignment);
}

// The capabilities' defaults: a resource that declares none (memory_resource.hpp).
std::optional<std::size_t> memory_resource::available_bytes() const { return std::nullopt; }

std::size_t memory_resource::release_free_memory() { return 0; }

ipc_export_route memory_resource::ipc_route(const void*, std::size_t) const { return {}; }

}  // namespace gpumem
