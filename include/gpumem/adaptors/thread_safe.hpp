// thread_safe_adaptor: makes a resource that is not thread-safe safe to call
// from many threads, by holding one mutex around every call into it.
//
// The lock is held across the upstream's allocate and deallocate, including any
// driver call they make: that is the point (the upstream's state is guarded), and
// the price (calls from all threads run one at a time). Resources that are
// thread-safe already (cuda_resource, pool_resource) do not need it.
#pragma once

#include <memory>
#include <mutex>

#include "gpumem/adaptors/resource_adaptor.hpp"
#include "gpumem/export.hpp"

namespace gpumem {

class GPUMEM_EXPORT thread_safe_adaptor final : public resource_adaptor {
 public:
  std::string_view layer_name() const noexcept override { return "thread_safe"; }
  explicit thread_safe_adaptor(memory_resource& upstream);
  explicit thread_safe_adaptor(std::shared_ptr<memory_resource> upstream);

  // The upstream's, with thread_safe = true.
  resource_properties properties() const noexcept override;

 private:
  void* do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) override;
  void do_deallocate(void* ptr, std::size_t bytes, stream_view stream,
                     std::size_t alignment) override;

  std::mutex mutex_;
};

}  // namespace gpumem
