// tracking_adaptor: remembers every live allocation (size, alignment, stream,
// thread, when, and optionally the allocating stack) and reports what is still
// live on demand, when it is destroyed, and at process exit.
//
// It also checks frees itself: a pointer it did not hand out, one already freed,
// or a size other than the allocation's is a logic_error before the upstream is
// called. write_snapshot() writes the live allocations in the log format of
// docs/observability.md, so gpumem-report can draw them.
//
// Two optional records beside the native stack: a site the program supplies
// (tracking_options::sites, e.g. the Python call stack; Note [Sites the program
// supplies] in src/adaptors/tracking.cpp) and a history, the last
// history_entries allocations, frees and out-of-memory failures in order (what a
// memory timeline is drawn from).
//
// Cost: one lock of one of 64 shards (chosen by address) and a hash-map update
// per call; capturing stacks adds a backtrace() per allocation, a site hook one
// call of it per allocation (and per free with a history), a history one more
// lock per call. None of these costs anything while off.
// Thread safety: safe from many threads; properties().thread_safe is the upstream's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpumem/adaptors/resource_adaptor.hpp"
#include "gpumem/export.hpp"

namespace gpumem {

// Where a call came from, as the program sees it (the Python binding supplies the
// Python call stack). Both hooks may be called from any thread, concurrently, and
// with no lock of the adaptor held; an exception from either is taken as "no site".
struct tracking_site_hooks {
  // On the calling thread, before the upstream is called: an id for the current
  // site, the same id for the same site; 0 for none.
  std::function<std::uint64_t()> capture;
  // The site's frames, innermost first, as text ("file:line function"). Called when
  // live() or a leak report asks, possibly at process exit: what it reads must
  // live until then.
  std::function<std::vector<std::string>(std::uint64_t)> describe;
};

struct tracking_options {
  bool capture_stacks = false;  // record the allocating stack (frames outside gpumem)
  int stack_depth = 16;         // frames kept, 1..256 (others: logic_error at construction)
  bool report_at_exit = true;   // leak report on stderr at destruction and exit, when any are live
  std::size_t report_limit = 20;  // allocations listed in a report; the rest are counted
  tracking_site_hooks sites;    // no capture hook: no sites (and no cost)
  std::size_t history_entries = 0;  // keep the last N events (history()); 0: no history
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
  std::uint64_t site = 0;          // sites.capture's id; 0 without the hook
  std::vector<std::string> site_frames;  // sites.describe(site), innermost first
};

enum class tracking_event_kind : std::uint8_t { allocate, deallocate, out_of_memory };

// One entry of the history: an allocation that succeeded, a free, or an allocation
// the upstream refused with out_of_memory.
struct tracking_event {
  tracking_event_kind kind = tracking_event_kind::allocate;
  void* ptr = nullptr;             // null for out_of_memory
  std::size_t bytes = 0;           // as requested
  stream_view stream;
  std::uint32_t thread = 0;        // gpumem's small thread number
  std::uint64_t seq = 0;           // the allocation's seq (as tracked_allocation::seq); 0 for out_of_memory
  std::uint64_t time_ns = 0;       // since the adaptor was made
  std::uint64_t site = 0;          // the call's site (sites.capture), 0 without the hook
  std::size_t device_free_bytes = 0;  // out_of_memory: what the device reported free
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

  // The history, oldest first: at most history_entries events, the latest ones
  // (empty without a history). An allocation is recorded once the upstream has
  // returned it, a free before the upstream is called, so that a free always comes
  // before the next allocation of the same memory.
  std::vector<tracking_event> history() const;
  // Events the history has let go of (the oldest, once full) since it was last cleared.
  std::uint64_t history_dropped() const;
  void clear_history();
  const tracking_options& options() const noexcept;

 private:
  void* do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) override;
  void do_deallocate(void* ptr, std::size_t bytes, stream_view stream,
                     std::size_t alignment) override;

  struct state;
  std::shared_ptr<state> state_;
};

}  // namespace gpumem
