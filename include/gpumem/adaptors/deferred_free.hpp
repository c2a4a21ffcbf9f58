// deferred_free_adaptor: Numba's deallocation strategy over any resource. Frees
// are queued and handed to the upstream together, when the queue holds more than
// max_pending_count frees or more than max_pending_ratio of the device's memory;
// an allocation that runs out of memory flushes the queue and retries once; and a
// defer_cleanup scope (nestable) holds every free until the outermost scope ends.
// docs/observability.md ("Deferred frees") has the details and the differences
// from Numba.
//
// Defaults come from the environment, as Numba's do from its own variables:
//   GPUMEM_MAX_PENDING_DEALLOCS_COUNT  (default 10)
//   GPUMEM_MAX_PENDING_DEALLOCS_RATIO  (default 0.2, of the device's total memory)
//
// Stream order: a queued free is ordered after the work its stream had queued at
// the time of the free (an event recorded then), and handed to the upstream on a
// stream of the adaptor's own that waits for those events: so a stream may be
// destroyed while frees made on it are still queued.
//
// Misuse is reported at once, not at the flush: the adaptor keeps its own record
// of live allocations, so foreign and double-freed pointers and wrong sizes are
// logic_errors from deallocate. An error from the upstream while flushing cancels
// the rest of the queue (those frees are dropped: their memory is not returned),
// is counted in statistics(), and is thrown from the call that flushed.
//
// Thread safety: the queue is guarded by a mutex, flushes run one at a time;
// properties().thread_safe is the upstream's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "gpumem/adaptors/resource_adaptor.hpp"
#include "gpumem/export.hpp"

namespace gpumem {

struct GPUMEM_EXPORT deferred_free_options {
  std::size_t max_pending_count = 10;
  double max_pending_ratio = 0.2;  // in (0, 1]
  // Defaults overridden by GPUMEM_MAX_PENDING_DEALLOCS_COUNT / _RATIO where set;
  // logic_error naming the variable when one is malformed.
  static deferred_free_options from_environment();
};

struct deferred_free_statistics {
  std::size_t pending_count = 0;
  std::size_t pending_bytes = 0;
  std::uint64_t flushes = 0;            // every flush that freed something
  std::uint64_t flushes_by_count = 0;   // the queue passed max_pending_count
  std::uint64_t flushes_by_bytes = 0;   // the queue passed max_pending_bytes()
  std::uint64_t flushes_by_oom = 0;     // an allocation ran out of memory (and was retried)
  std::uint64_t flushes_requested = 0;  // flush() or the end of a defer_cleanup scope
  std::uint64_t frees = 0;              // handed to the upstream
  std::uint64_t cancelled_frees = 0;    // dropped after a deallocation error
  std::size_t cancelled_bytes = 0;
};

class GPUMEM_EXPORT deferred_free_adaptor final : public resource_adaptor {
 public:
  std::string_view layer_name() const noexcept override { return "defer"; }
  explicit deferred_free_adaptor(memory_resource& upstream,
                                 deferred_free_options options = deferred_free_options::from_environment());
  explicit deferred_free_adaptor(std::shared_ptr<memory_resource> upstream,
                                 deferred_free_options options = deferred_free_options::from_environment());
  ~deferred_free_adaptor() override;  // flushes; errors are reported on stderr

  // Hands every queued free to the upstream now, inside a defer_cleanup scope too
  // (an explicit request). Throws the first upstream error (the rest is cancelled).
  void flush();

  std::size_t max_pending_count() const noexcept;
  std::size_t max_pending_bytes() const noexcept;  // ratio x the device's total memory
  deferred_free_statistics statistics() const;
  // defer_cleanup scopes open now.
  int cleanup_deferrals() const;

  struct impl;

 private:
  friend class defer_cleanup;
  void* do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) override;
  void do_deallocate(void* ptr, std::size_t bytes, stream_view stream,
                     std::size_t alignment) override;

  std::unique_ptr<impl> impl_;
};

// While one exists, no automatic flush happens: frees are held (an allocation
// that runs out of memory is not rescued by a flush, as in Numba). When the
// outermost scope ends, the queue is flushed if it is past a limit; an error then
// is reported on stderr and counted (a destructor does not throw).
class GPUMEM_EXPORT defer_cleanup {
 public:
  explicit defer_cleanup(deferred_free_adaptor& resource);
  ~defer_cleanup();
  defer_cleanup(const defer_cleanup&) = delete;
  defer_cleanup& operator=(const defer_cleanup&) = delete;

 private:
  deferred_free_adaptor& resource_;
};

}  // namespace gpumem
