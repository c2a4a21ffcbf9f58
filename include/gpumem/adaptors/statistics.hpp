// statistics_adaptor: counts what passes through it: bytes and allocations now,
// at their peak, and in total; nested scopes measure one region of a program.
// Cheap enough to leave on: the hot path touches only the calling thread's
// counters, with no lock and no atomic read-modify-write (docs/observability.md
// gives the measured cost over pool_resource).
//
// Bytes are counted as requested (before the upstream rounds them). Calls the
// upstream rejects are not counted.
//
// Peaks are exact while one thread at a time uses the adaptor. With several
// threads allocating at once, each thread's change not yet published to the
// others (at most 16 MiB and 1024 allocations per thread) may be missing from the
// peak: it is within (threads - 1) x that of the true peak. current and total are
// exact whenever no call is in flight.
//
// Thread safety: the adaptor's own state is safe to use from many threads;
// properties().thread_safe is the upstream's.
#pragma once

#include <cstddef>
#include <memory>

#include "gpumem/adaptors/resource_adaptor.hpp"
#include "gpumem/export.hpp"

namespace gpumem {

struct allocation_counters {
  std::size_t current_bytes = 0;  // live now
  std::size_t peak_bytes = 0;     // the most live at once
  std::size_t total_bytes = 0;    // allocated, ever (in a scope: since it was pushed)
  std::size_t current_count = 0;
  std::size_t peak_count = 0;
  std::size_t total_count = 0;
};

struct statistics_options {
  // Print the counters on stderr when the adaptor is destroyed or the process exits.
  bool report_at_exit = false;
  // A name for that report.
  const char* name = "statistics_adaptor";
};

class GPUMEM_EXPORT statistics_adaptor final : public resource_adaptor {
 public:
  std::string_view layer_name() const noexcept override { return "stats"; }
  explicit statistics_adaptor(memory_resource& upstream, statistics_options options = {});
  explicit statistics_adaptor(std::shared_ptr<memory_resource> upstream,
                              statistics_options options = {});
  ~statistics_adaptor() override;

  // Since the adaptor was made; the peak covers every scope.
  allocation_counters statistics() const;

  // Starts a scope: the peak restarts from what is live now, totals from zero.
  // Scopes nest; they are the adaptor's, not the calling thread's.
  void push_scope();
  // Ends the innermost scope and returns its counters (current: live now). The
  // enclosing scope's peak takes in the popped one's. logic_error without a scope.
  allocation_counters pop_scope();
  // Scopes open.
  std::size_t scope_depth() const;

 private:
  void* do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) override;
  void do_deallocate(void* ptr, std::size_t bytes, stream_view stream,
                     std::size_t alignment) override;

  struct state;
  std::shared_ptr<state> state_;
};

}  // namespace gpumem
