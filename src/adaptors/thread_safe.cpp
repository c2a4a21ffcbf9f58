// thread_safe_adaptor (include/gpumem/adaptors/thread_safe.hpp).
#include "gpumem/adaptors/thread_safe.hpp"

namespace gpumem {

thread_safe_adaptor::thread_safe_adaptor(memory_resource& upstream)
    : resource_adaptor(upstream, "thread_safe_adaptor") {}

thread_safe_adaptor::thread_safe_adaptor(std::shared_ptr<memory_resource> upstream)
    : resource_adaptor(std::move(upstream), "thread_safe_adaptor") {}

resource_properties thread_safe_adaptor::properties() const noexcept {
  resource_properties p = upstream().properties();
  p.thread_safe = true;
  return p;
}

void* thread_safe_adaptor::do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) {
  std::lock_guard lock(mutex_);
  return upstream_allocate(bytes, stream, alignment);
}

void thread_safe_adaptor::do_deallocate(void* ptr, std::size_t bytes, stream_view stream,
                                        std::size_t alignment) {
  std::lock_guard lock(mutex_);
  upstream_deallocate(ptr, bytes, stream, alignment);
}

}  // namespace gpumem
