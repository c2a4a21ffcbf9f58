// oom_retry_adaptor (include/gpumem/adaptors/oom_retry.hpp).
#include "gpumem/adaptors/oom_retry.hpp"

#include <string>

namespace gpumem {

oom_retry_adaptor::oom_retry_adaptor(memory_resource& upstream, int max_retries)
    : resource_adaptor(upstream, "oom_retry_adaptor"), max_retries_(max_retries) {
  if (max_retries < 0) throw logic_error("gpumem::oom_retry_adaptor: max_retries is negative");
}

oom_retry_adaptor::oom_retry_adaptor(std::shared_ptr<memory_resource> upstream, int max_retries)
    : resource_adaptor(std::move(upstream), "oom_retry_adaptor"), max_retries_(max_retries) {
  if (max_retries < 0) throw logic_error("gpumem::oom_retry_adaptor: max_retries is negative");
}

std::uint64_t oom_retry_adaptor::add_callback(oom_callback callback) {
  if (!callback) throw logic_error("gpumem::oom_retry_adaptor::add_callback: null callback");
  std::lock_guard lock(mutex_);
  const std::uint64_t id = next_id_++;
  callbacks_.push_back({id, std::make_shared<oom_callback>(std::move(callback))});
  return id;
}

bool oom_retry_adaptor::remove_callback(std::uint64_t id) {
  std::lock_guard lock(mutex_);
  return std::erase_if(callbacks_, [id](const entry& e) { return e.id == id; }) != 0;
}

void* oom_retry_adaptor::do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) {
  for (int attempt = 1;; ++attempt) {
    try {
      return upstream_allocate(bytes, stream, alignment);
    } catch (const out_of_memory& e) {
      if (attempt > max_retries_) throw;
      // A snapshot: callbacks may add or remove callbacks (or be removed) while running.
      std::vector<std::shared_ptr<oom_callback>> snapshot;
      {
        std::lock_guard lock(mutex_);
        for (const entry& c : callbacks_) snapshot.push_back(c.callback);
      }
      const oom_event event{bytes, alignment, stream, attempt, e};
      bool retry = false;
      for (const auto& cb : snapshot) {
        if ((*cb)(event)) {
          retry = true;
          break;
        }
      }
      if (!retry) throw;
    }
  }
}

void oom_retry_adaptor::do_deallocate(void* ptr, std::size_t bytes, stream_view stream,
                                      std::size_t alignment) {
  upstream_deallocate(ptr, bytes, stream, alignment);
}

}  // namespace gpumem
