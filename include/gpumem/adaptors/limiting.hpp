// limiting_adaptor: a hard cap on the bytes live through it. A request that
// would pass the cap is out_of_memory at once, without calling the upstream,
// and says the limit, what is in use and what was asked.
//
// Bytes are counted as requested, rounded up to 256 (the granule every gpumem
// resource hands out at least); what the upstream reserves beyond that (a pool's
// free blocks, larger alignments) is not counted.
//
// Thread safety: the count is one atomic; properties().thread_safe is the upstream's.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>

#include "gpumem/adaptors/resource_adaptor.hpp"
#include "gpumem/export.hpp"

namespace gpumem {

class GPUMEM_EXPORT limiting_adaptor final : public resource_adaptor {
 public:
  std::string_view layer_name() const noexcept override { return "limit"; }
  // The upstream's, within what the limit has left.
  std::optional<std::size_t> available_bytes() const override;
  limiting_adaptor(memory_resource& upstream, std::size_t limit_bytes);
  limiting_adaptor(std::shared_ptr<memory_resource> upstream, std::size_t limit_bytes);

  std::size_t limit_bytes() const noexcept { return limit_bytes_; }
  // Bytes live now, as counted (see above).
  std::size_t used_bytes() const noexcept { return used_.load(std::memory_order_relaxed); }

 private:
  void* do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) override;
  void do_deallocate(void* ptr, std::size_t bytes, stream_view stream,
                     std::size_t alignment) override;

  std::size_t limit_bytes_;
  std::atomic<std::size_t> used_{0};
};

}  // namespace gpumem
