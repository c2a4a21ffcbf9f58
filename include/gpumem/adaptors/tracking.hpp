// tracking_adaptor: remembers every live allocation (size, alignment, stream,
// thread, when, and optionally the allocating stack) and reports what is still
// live on demand, when it is destroyed, and at process exit.
//
// It also checks frees itself: a pointer it did not hand out, one already freed,
// or a size other than the allocation's is a logic_error before the upstream is
// called. write_snapshot() writes the live allocations in the log format of
// docs/observability.md, so gpumem-report can draw them.
//
// Cost: one lock of one of 64 shards (chosen by address) and a hash-map update
// per call; capturing stacks adds a backtrace() per allocation.
// Thread safety: safe from many threads; properties().thread_safe is the upstream's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpumem/adaptors/resource_adaptor.hpp"
#include "gpumem/export.hpp"

namespace gpumem {

struct tracking_options {
  bool capture_stacks = false;  // record the allocating stack (frames outside gpumem)
  int stack_depth = 16;         // frames kept, 1..256 (others: logic_error at construction)
  bool report_at_exit = true;   // leak report on stderr at destruction and exit, when any are live
  std::size_t report_limit = 20;  // allocations listed in a report; the rest are counted
};

struct tracked_allocation {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  std::size_t alignment = 0;
  stream_view stream;
  std::uint32_t thread = 0;      // gpumem's small thread number (as in logs)
  std::uint64_t seq = 0;         // order of allocation through this adaptor, from 1
  std::uint64_t time_ns = 0;     // since the adaptor was made
  std::vector<std::string> stack;  // innermost first; empty unless capture_stacks
};

class GPUMEM_EXPORT tracking_adaptor final : public resource_adaptor {
 public:
  std::string_view layer_name() const noexcept override { return "track"; }
  explicit tracking_adaptor(memory_resource& upstream, tracking_options options = {});
  explicit tracking_adaptor(std::shared_ptr<memory_resource> upstream, tracking_options options = {});
  ~tracking_adaptor() override;

  // Live allocations, oldest first.
  std::vector<tracked_allocation> live() const;
  std::size_t live_count() const;
  std::size_t live_bytes() const;
  // The leak report: empty when nothing is live.
  std::string leak_report() const;
  // The live allocations as a log (docs/observability.md, source "snapshot"), for
  // gpumem-report. logic_error when the file cannot be written.
  void write_snapshot(const std::string& path) const;

 private:
  void* do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) override;
  void do_deallocate(void* ptr, std::size_t bytes, stream_view stream,
                     std::size_t alignment) override;

  struct state;
  std::shared_ptr<state> state_;
};

}  // namespace gpumem
