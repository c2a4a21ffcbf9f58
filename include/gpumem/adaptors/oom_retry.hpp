// oom_retry_adaptor: when the upstream runs out of memory, calls the registered
// callbacks (free a cache, spill to the host, trim a pool) and retries the
// allocation as they ask.
//
// On out_of_memory the callbacks are called in the order they were added, each
// with the request and the error, until one returns true ("retry"); the
// allocation is then tried again, and on another out_of_memory the round starts
// again from the first callback with attempt + 1. When no callback asks for a
// retry, or after max_retries retries, the last out_of_memory reaches the caller.
// Callbacks run on the allocating thread with no lock of the adaptor held; they
// may allocate and free through any resource, this one included. Other errors
// (logic_error, cuda_error) are never retried.
//
// Thread safety: adding and removing callbacks may race with allocations;
// properties().thread_safe is the upstream's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "gpumem/adaptors/resource_adaptor.hpp"
#include "gpumem/error.hpp"
#include "gpumem/export.hpp"

namespace gpumem {

struct oom_event {
  std::size_t bytes;           // requested
  std::size_t alignment;
  stream_view stream;
  int attempt;                 // 1 on the first failure, 2 after one retry failed, ...
  const out_of_memory& error;  // the upstream's
};

// Returns true to have the allocation retried.
using oom_callback = std::function<bool(const oom_event&)>;

class GPUMEM_EXPORT oom_retry_adaptor final : public resource_adaptor {
 public:
  std::string_view layer_name() const noexcept override { return "oom_retry"; }
  explicit oom_retry_adaptor(memory_resource& upstream, int max_retries = 16);
  explicit oom_retry_adaptor(std::shared_ptr<memory_resource> upstream, int max_retries = 16);

  // Returns an id for remove_callback. A null callback is a logic_error.
  std::uint64_t add_callback(oom_callback callback);
  // False when no callback has that id.
  bool remove_callback(std::uint64_t id);
  int max_retries() const noexcept { return max_retries_; }

 private:
  void* do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) override;
  void do_deallocate(void* ptr, std::size_t bytes, stream_view stream,
                     std::size_t alignment) override;

  struct entry {
    std::uint64_t id;
    std::shared_ptr<oom_callback> callback;
  };
  int max_retries_;
  std::mutex mutex_;
  std::vector<entry> callbacks_;
  std::uint64_t next_id_ = 1;
};

}  // namespace gpumem
