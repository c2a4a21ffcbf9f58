// statistics_adaptor (include/gpumem/adaptors/statistics.hpp): per-thread counters,
// peaks estimated on the hot path, scopes. Read Note [Per-thread slots] first.
#include "gpumem/adaptors/statistics.hpp"
#include "diagnose.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <vector>

#include "adaptors/exit_hooks.hpp"
#include "text.hpp"
#include "adaptors/per_thread.hpp"
#include "gpumem/error.hpp"

namespace gpumem {
namespace {

// Note [Statistics peaks without shared writes]
// Every thread counts its own allocations and frees in its slot. The live total
// is then the sum over slots, which a reader can form but the hot path cannot
// afford (it would read every other thread's cache line on every call). So each
// thread also *publishes* its net change to two shared atomics, but only once it
// has drifted by more than publish_bytes or publish_count since it last did, and
// only once a second thread has used the adaptor. An allocation estimates the
// live total as published + its own unpublished change, and raises the peak if
// that is higher:
//  - one thread: nothing is published and the estimate is the exact total;
//  - several: every other thread's unpublished change (each within the publish
//    limits) may be missing, so the peak is within (threads - 1) x the limits.
// A thread that exits publishes what it had, so idle threads add no error.
// Readers fold the exact current total into the peak as well.
constexpr std::int64_t publish_bytes = std::int64_t{16} << 20;
constexpr std::int64_t publish_count = 1024;

struct shared_totals {
  alignas(64) std::atomic<std::int64_t> published_bytes{0};
  std::atomic<std::int64_t> published_count{0};
  std::atomic<bool> several_threads{false};
  // The innermost scope's peaks (the whole life's when no scope is open).
  alignas(64) std::atomic<std::int64_t> peak_bytes{0};
  std::atomic<std::int64_t> peak_count{0};
};

struct stats_slot final : detail::thread_slot {
  explicit stats_slot(std::shared_ptr<shared_totals> t) : totals(std::move(t)) {}

  // Written only by the owning thread; read by anyone.
  std::atomic<std::uint64_t> allocated_bytes{0};
  std::atomic<std::uint64_t> allocated_count{0};
  std::atomic<std::uint64_t> freed_bytes{0};
  std::atomic<std::uint64_t> freed_count{0};
  // The owner's alone: what of its change it has published.
  std::int64_t published_bytes = 0;
  std::int64_t published_count = 0;
  std::shared_ptr<shared_totals> totals;

  std::int64_t unpublished_bytes() const noexcept {
    return static_cast<std::int64_t>(allocated_bytes.load(std::memory_order_relaxed) -
                                     freed_bytes.load(std::memory_order_relaxed)) -
           published_bytes;
  }
  std::int64_t unpublished_count() const noexcept {
    return static_cast<std::int64_t>(allocated_count.load(std::memory_order_relaxed) -
                                     freed_count.load(std::memory_order_relaxed)) -
           published_count;
  }
  void publish(std::int64_t bytes, std::int64_t count) noexcept {
    totals->published_bytes.fetch_add(bytes, std::memory_order_relaxed);
    totals->published_count.fetch_add(count, std::memory_order_relaxed);
    published_bytes += bytes;
    published_count += count;
  }
  void on_thread_exit() noexcept override {
    const std::int64_t b = unpublished_bytes();
    const std::int64_t c = unpublished_count();
    if (b != 0 || c != 0) publish(b, c);
  }
};

// The last statistics adaptor this thread used.
thread_local detail::slot_cache stats_cache __attribute__((tls_model("initial-exec")));

void bump(std::atomic<std::uint64_t>& a, std::uint64_t by) noexcept {
  a.store(a.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
}

void raise(std::atomic<std::int64_t>& peak, std::int64_t value, bool shared) noexcept {
  std::int64_t p = peak.load(std::memory_order_relaxed);
  if (value <= p) return;
  if (!shared) {
    peak.store(value, std::memory_order_relaxed);
    return;
  }
  while (value > p && !peak.compare_exchange_weak(p, value, std::memory_order_relaxed)) {
  }
}

std::size_t non_negative(std::int64_t v) { return v < 0 ? 0 : static_cast<std::size_t>(v); }

}  // namespace

struct statistics_adaptor::state final : detail::exit_hook {
  struct sums {
    std::uint64_t allocated_bytes = 0, allocated_count = 0, freed_bytes = 0, freed_count = 0;
    std::int64_t current_bytes() const { return static_cast<std::int64_t>(allocated_bytes - freed_bytes); }
    std::int64_t current_count() const { return static_cast<std::int64_t>(allocated_count - freed_count); }
  };
  struct saved_scope {
    std::int64_t peak_bytes, peak_count;  // the enclosing scope's, when this one was pushed
    std::uint64_t allocated_bytes, allocated_count;  // totals when pushed
  };

  explicit state(statistics_options o)
      : opt(o), totals(std::make_shared<shared_totals>()) {
    auto t = totals;
    slots = detail::slot_registry::create([t] { return std::make_unique<stats_slot>(t); });
  }

  stats_slot& slot() {
    if (detail::thread_slot* s = stats_cache.find(slots->id())) [[likely]] {
      return static_cast<stats_slot&>(*s);
    }
    auto& s = static_cast<stats_slot&>(slots->attach(stats_cache));
    if (slots->slot_count() > 1) totals->several_threads.store(true, std::memory_order_relaxed);
    return s;
  }

  sums collect() {
    sums s;
    slots->for_each([&](detail::thread_slot& t) {
      auto& c = static_cast<stats_slot&>(t);
      s.allocated_bytes += c.allocated_bytes.load(std::memory_order_relaxed);
      s.allocated_count += c.allocated_count.load(std::memory_order_relaxed);
      s.freed_bytes += c.freed_bytes.load(std::memory_order_relaxed);
      s.freed_count += c.freed_count.load(std::memory_order_relaxed);
    });
    return s;
  }

  // The whole life's counters; scopes_mutex held.
  allocation_counters whole_life() {
    const sums s = collect();
    raise(totals->peak_bytes, s.current_bytes(), true);
    raise(totals->peak_count, s.current_count(), true);
    std::int64_t pb = totals->peak_bytes.load(std::memory_order_relaxed);
    std::int64_t pc = totals->peak_count.load(std::memory_order_relaxed);
    for (const saved_scope& sc : scopes) {
      pb = std::max(pb, sc.peak_bytes);
      pc = std::max(pc, sc.peak_count);
    }
    allocation_counters c;
    c.current_bytes = non_negative(s.current_bytes());
    c.current_count = non_negative(s.current_count());
    c.peak_bytes = non_negative(pb);
    c.peak_count = non_negative(pc);
    c.total_bytes = s.allocated_bytes;
    c.total_count = s.allocated_count;
    return c;
  }

  void report() noexcept {
    if (!opt.report_at_exit || reported.exchange(true)) return;
    try {
      std::lock_guard lock(scopes_mutex);
      const allocation_counters c = whole_life();
      detail::diagnosef(diagnostic_level::info,
                   "gpumem %s: peak %s in %zu allocation(s); %s in %zu allocation(s) in total; "
                   "%s in %zu allocation(s) live\n",
                   opt.name, detail::human_bytes(c.peak_bytes).c_str(), c.peak_count,
                   detail::human_bytes(c.total_bytes).c_str(), c.total_count,
                   detail::human_bytes(c.current_bytes).c_str(), c.current_count);
    } catch (...) {
    }
  }
  void at_exit() noexcept override { report(); }

  statistics_options opt;
  std::shared_ptr<shared_totals> totals;
  std::shared_ptr<detail::slot_registry> slots;
  std::mutex scopes_mutex;
  std::vector<saved_scope> scopes;
  std::atomic<bool> reported{false};
};

statistics_adaptor::statistics_adaptor(memory_resource& upstream, statistics_options options)
    : resource_adaptor(upstream, "statistics_adaptor"), state_(std::make_shared<state>(options)) {
  if (options.report_at_exit) detail::run_at_exit(state_);
}

statistics_adaptor::statistics_adaptor(std::shared_ptr<memory_resource> upstream,
                                       statistics_options options)
    : resource_adaptor(std::move(upstream), "statistics_adaptor"),
      state_(std::make_shared<state>(options)) {
  if (options.report_at_exit) detail::run_at_exit(state_);
}

statistics_adaptor::~statistics_adaptor() {
  state_->report();
  state_->slots->close();
}

void* statistics_adaptor::do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) {
  void* p = upstream_allocate(bytes, stream, alignment);
  stats_slot& s = state_->slot();
  bump(s.allocated_bytes, bytes);
  bump(s.allocated_count, 1);
  shared_totals& t = *s.totals;
  std::int64_t mine_bytes = s.unpublished_bytes();
  std::int64_t mine_count = s.unpublished_count();
  const bool shared = t.several_threads.load(std::memory_order_relaxed);
  if (shared && (mine_bytes > publish_bytes || mine_bytes < -publish_bytes ||
                 mine_count > publish_count || mine_count < -publish_count)) [[unlikely]] {
    s.publish(mine_bytes, mine_count);
    mine_bytes = mine_count = 0;
  }
  raise(t.peak_bytes, t.published_bytes.load(std::memory_order_relaxed) + mine_bytes, shared);
  raise(t.peak_count, t.published_count.load(std::memory_order_relaxed) + mine_count, shared);
  return p;
}

void statistics_adaptor::do_deallocate(void* ptr, std::size_t bytes, stream_view stream,
                                       std::size_t alignment) {
  upstream_deallocate(ptr, bytes, stream, alignment);
  stats_slot& s = state_->slot();
  bump(s.freed_bytes, bytes);
  bump(s.freed_count, 1);
  if (s.totals->several_threads.load(std::memory_order_relaxed)) {
    const std::int64_t b = s.unpublished_bytes();
    const std::int64_t c = s.unpublished_count();
    if (b < -publish_bytes || b > publish_bytes || c < -publish_count || c > publish_count) [[unlikely]] {
      s.publish(b, c);
    }
  }
}

allocation_counters statistics_adaptor::statistics() const {
  std::lock_guard lock(state_->scopes_mutex);
  return state_->whole_life();
}

void statistics_adaptor::push_scope() {
  state& st = *state_;
  std::lock_guard lock(st.scopes_mutex);
  const state::sums s = st.collect();
  shared_totals& t = *st.totals;
  raise(t.peak_bytes, s.current_bytes(), true);
  raise(t.peak_count, s.current_count(), true);
  st.scopes.push_back({t.peak_bytes.load(std::memory_order_relaxed),
                       t.peak_count.load(std::memory_order_relaxed), s.allocated_bytes,
                       s.allocated_count});
  t.peak_bytes.store(s.current_bytes(), std::memory_order_relaxed);
  t.peak_count.store(s.current_count(), std::memory_order_relaxed);
}

allocation_counters statistics_adaptor::pop_scope() {
  state& st = *state_;
  std::lock_guard lock(st.scopes_mutex);
  if (st.scopes.empty()) {
    throw logic_error("gpumem::statistics_adaptor::pop_scope: no scope was pushed");
  }
  const state::sums s = st.collect();
  shared_totals& t = *st.totals;
  raise(t.peak_bytes, s.current_bytes(), true);
  raise(t.peak_count, s.current_count(), true);
  const state::saved_scope saved = st.scopes.back();
  st.scopes.pop_back();
  allocation_counters c;
  c.current_bytes = non_negative(s.current_bytes());
  c.current_count = non_negative(s.current_count());
  const std::int64_t pb = t.peak_bytes.load(std::memory_order_relaxed);
  const std::int64_t pc = t.peak_count.load(std::memory_order_relaxed);
  c.peak_bytes = non_negative(pb);
  c.peak_count = non_negative(pc);
  c.total_bytes = s.allocated_bytes - saved.allocated_bytes;
  c.total_count = s.allocated_count - saved.allocated_count;
  t.peak_bytes.store(std::max(pb, saved.peak_bytes), std::memory_order_relaxed);
  t.peak_count.store(std::max(pc, saved.peak_count), std::memory_order_relaxed);
  return c;
}

std::size_t statistics_adaptor::scope_depth() const {
  std::lock_guard lock(state_->scopes_mutex);
  return state_->scopes.size();
}

}  // namespace gpumem
