// limiting_adaptor (include/gpumem/adaptors/limiting.hpp): reserve against the
// cap first, then ask the upstream, and give the reservation back if it fails.
#include "gpumem/adaptors/limiting.hpp"

#include <algorithm>
#include <string>

#include "text.hpp"
#include "gpumem/error.hpp"

namespace gpumem {
namespace {

// Bytes are counted in whole units of the alignment every resource gives at least.
constexpr std::size_t granule = default_alignment;

std::size_t counted(std::size_t bytes) noexcept { return (bytes + granule - 1) & ~(granule - 1); }

}  // namespace

limiting_adaptor::limiting_adaptor(memory_resource& upstream, std::size_t limit_bytes)
    : resource_adaptor(upstream, "limiting_adaptor"), limit_bytes_(limit_bytes) {
  if (limit_bytes == 0) throw logic_error("gpumem::limiting_adaptor: the limit must be above 0 bytes");
}

limiting_adaptor::limiting_adaptor(std::shared_ptr<memory_resource> upstream, std::size_t limit_bytes)
    : resource_adaptor(std::move(upstream), "limiting_adaptor"), limit_bytes_(limit_bytes) {
  if (limit_bytes == 0) throw logic_error("gpumem::limiting_adaptor: the limit must be above 0 bytes");
}

void* limiting_adaptor::do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) {
  const std::size_t n = counted(bytes);  // bytes <= SIZE_MAX/4: checked by memory_resource
  std::size_t used = used_.load(std::memory_order_relaxed);
  do {
    if (n > limit_bytes_ || used > limit_bytes_ - n) {
      out_of_memory_info info;
      info.requested_bytes = bytes;
      info.device = properties().device;
      info.resource = "limiting_adaptor";
      info.resource_held_bytes = used;
      info.reason = "the limit of " + std::to_string(limit_bytes_) + " bytes (" +
                    detail::human_bytes(limit_bytes_) + ") would be exceeded: " +
                    std::to_string(used) + " bytes are in use";
      throw out_of_memory(std::move(info));
    }
  } while (!used_.compare_exchange_weak(used, used + n, std::memory_order_relaxed));
  try {
    return upstream_allocate(bytes, stream, alignment);
  } catch (...) {
    used_.fetch_sub(n, std::memory_order_relaxed);
    throw;
  }
}

void limiting_adaptor::do_deallocate(void* ptr, std::size_t bytes, stream_view stream,
                                     std::size_t alignment) {
  upstream_deallocate(ptr, bytes, stream, alignment);  // a rejected pointer changes nothing
  used_.fetch_sub(counted(bytes), std::memory_order_relaxed);
}

std::optional<std::size_t> limiting_adaptor::available_bytes() const {
  const std::size_t used = used_bytes();
  const std::size_t left = limit_bytes_ - std::min(used, limit_bytes_);
  const std::optional<std::size_t> upstream_has = upstream().available_bytes();
  if (!upstream_has) return std::nullopt;  // the device may have less than the limit leaves
  return std::min(*upstream_has, left);
}

}  // namespace gpumem
