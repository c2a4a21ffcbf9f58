// tracking_adaptor (include/gpumem/adaptors/tracking.hpp): a sharded map of live
// allocations, leak reports and snapshots, sites the program supplies, a history.
//
// Note [Sites the program supplies]
// A native stack says little when the program is Python: its frames are the
// interpreter's. tracking_options::sites lets the program say where a call came
// from instead. capture() runs on the calling thread before the upstream is called
// (for a free too, when there is a history) and returns a small id; the adaptor
// keeps the id (8 bytes a record) and asks describe() for the frames only when a
// report or live() wants text. So the cost of a site is whatever capture() costs,
// paid only when the hook is set, and interning (the same site, the same id) is the
// program's: the Python binding walks the Python frames under the GIL and interns
// them (python/src/python_sites.cpp). No lock of the adaptor is held while either
// hook runs, so a hook may take the GIL; the lock-order caveat that leaves is the
// caller's (docs/observability.md, "The GIL inside allocate": a Python site hook
// below a layer that holds a lock around its upstream could wait for the GIL while
// the GIL's holder waits for that lock). Exceptions from a hook are swallowed: a
// site is never worth a failed call.
//
// The history is a ring of fixed-size events under one mutex: a call's event is
// taken under that lock (its time too), so the ring's order is one order of all
// threads' calls. An allocation is recorded after the upstream returned it and a
// free before the upstream is called: the free of some memory always comes before
// its next allocation, as in the event log (Note [Sequence numbers and reuse] in
// logging.cpp). A free the upstream then fails stays recorded (the allocation stays
// live); that is an upstream error, reported to the caller anyway. Recording never
// fails a call: an event the ring cannot store (no memory to grow it) is counted as
// dropped.
#include "gpumem/adaptors/tracking.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <unordered_map>

#include "adaptors/call_site.hpp"
#include "adaptors/exit_hooks.hpp"
#include "text.hpp"
#include "adaptors/log_format.hpp"
#include "adaptors/per_thread.hpp"
#include "gpumem/diagnostics.hpp"
#include "gpumem/error.hpp"

namespace gpumem {
namespace {

constexpr std::size_t shard_count = 64;

struct record {
  std::size_t bytes;
  std::size_t alignment;
  CUstream stream;
  std::uint32_t thread;
  std::uint64_t seq;
  std::uint64_t time_ns;
  std::uint64_t site;
  std::vector<void*> frames;
};

// The last `capacity` events, oldest overwritten first.
class history_ring {
 public:
  explicit history_ring(std::size_t capacity) : capacity_(capacity) {}

  // Stamps the event's time (since `start_ns`) under the lock, so times follow the order.
  void push(tracking_event e, std::uint64_t start_ns) noexcept {
    std::lock_guard lock(mutex_);
    e.time_ns = detail::steady_ns() - start_ns;
    if (events_.size() < capacity_) {
      try {
        events_.push_back(e);
      } catch (...) {
        ++dropped_;
      }
      return;
    }
    events_[next_] = e;
    next_ = next_ + 1 == capacity_ ? 0 : next_ + 1;
    ++dropped_;
  }

  std::vector<tracking_event> ordered() const {
    std::lock_guard lock(mutex_);
    std::vector<tracking_event> out(events_.begin() + static_cast<std::ptrdiff_t>(next_), events_.end());
    out.insert(out.end(), events_.begin(), events_.begin() + static_cast<std::ptrdiff_t>(next_));
    return out;
  }

  std::uint64_t dropped() const {
    std::lock_guard lock(mutex_);
    return dropped_;
  }

  void clear() {
    std::lock_guard lock(mutex_);
    events_.clear();
    next_ = 0;
    dropped_ = 0;
  }

 private:
  mutable std::mutex mutex_;
  std::size_t capacity_;
  std::vector<tracking_event> events_;  // grows to capacity_, then is a ring from next_
  std::size_t next_ = 0;
  std::uint64_t dropped_ = 0;
};

std::size_t shard_of(const void* p) noexcept {
  auto a = reinterpret_cast<std::uintptr_t>(p) >> 8;  // allocations are 256-byte aligned
  a ^= a >> 17;
  a *= 0x9E3779B97F4A7C15ULL;
  return static_cast<std::size_t>(a >> 58);  // top 6 bits: 0..63
}

}  // namespace

struct tracking_adaptor::state final : detail::exit_hook {
  struct shard {
    mutable std::mutex mutex;
    std::unordered_map<void*, record> live;
  };

  explicit state(tracking_options o, int dev)
      : opt(std::move(o)),
        device(dev),
        start_ns(detail::steady_ns()),
        history(opt.history_entries > 0 ? std::make_unique<history_ring>(opt.history_entries) : nullptr) {}

  // Note [Sites the program supplies]: never throws.
  std::uint64_t capture_site() const noexcept {
    if (!opt.sites.capture) return 0;
    try {
      return opt.sites.capture();
    } catch (...) {
      return 0;
    }
  }

  std::vector<std::string> describe_site(std::uint64_t site) const noexcept {
    if (site == 0 || !opt.sites.describe) return {};
    try {
      return opt.sites.describe(site);
    } catch (...) {
      return {};
    }
  }

  std::vector<std::pair<void*, record>> copy_live() const {
    std::vector<std::pair<void*, record>> out;
    for (const shard& s : shards) {
      std::lock_guard lock(s.mutex);
      for (const auto& [p, r] : s.live) out.emplace_back(p, r);
    }
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second.seq < b.second.seq; });
    return out;
  }

  std::string report(const char* when) const {
    const auto all = copy_live();
    if (all.empty()) return {};
    std::size_t bytes = 0;
    for (const auto& [p, r] : all) bytes += r.bytes;
    const std::uint64_t now = detail::steady_ns();
    // String building, not iostreams: see src/text.hpp.
    using std::to_string;
    std::string s = "gpumem tracking_adaptor (device " + to_string(device) + "): " + to_string(all.size()) +
                    " allocation(s), " + to_string(bytes) + " bytes (" + detail::human_bytes(bytes) +
                    "), still live" + when + ":\n";
    std::size_t listed = 0;
    for (const auto& [p, r] : all) {
      if (listed++ == opt.report_limit) break;
      s += "  " + detail::hex_pointer(reinterpret_cast<std::uintptr_t>(p)) + ": " + to_string(r.bytes) +
           " bytes, stream " + detail::hex_pointer(reinterpret_cast<std::uintptr_t>(r.stream)) + ", thread " +
           to_string(r.thread) + ", allocated " +
           detail::human_duration_ns(now - start_ns - std::min(now - start_ns, r.time_ns)) +
           " ago (allocation #" + to_string(r.seq) + ")\n";
      std::size_t frame = 0;  // the program's site first, then the native stack
      for (const std::string& f : describe_site(r.site)) s += "      #" + to_string(frame++) + " " + f + "\n";
      for (void* f : r.frames) s += "      #" + to_string(frame++) + " " + detail::describe_frame(f) + "\n";
    }
    if (all.size() > opt.report_limit) s += "  ... and " + to_string(all.size() - opt.report_limit) + " more\n";
    return s;
  }

  void at_exit() noexcept override {
    if (!opt.report_at_exit || reported.exchange(true)) return;
    try {
      const std::string r = report(" at exit");
      if (!r.empty()) diagnose(diagnostic_level::warning, r);
    } catch (...) {
    }
  }

  tracking_options opt;
  int device;
  std::uint64_t start_ns;
  std::atomic<std::uint64_t> next_seq{1};
  std::array<shard, shard_count> shards;
  std::atomic<bool> reported{false};
  std::unique_ptr<history_ring> history;  // null: no history
};

namespace {

// The most frames a recorded stack keeps: deeper stacks cost every allocation more.
constexpr int max_stack_depth = 256;

const tracking_options& checked(const tracking_options& options) {
  if (options.stack_depth < 1 || options.stack_depth > max_stack_depth) {
    throw logic_error("gpumem::tracking_adaptor: tracking_options::stack_depth " + std::to_string(options.stack_depth) +
                      " is outside 1.." + std::to_string(max_stack_depth));
  }
  return options;
}

}  // namespace

tracking_adaptor::tracking_adaptor(memory_resource& upstream, tracking_options options)
    : resource_adaptor(upstream, "tracking_adaptor"),
      state_(std::make_shared<state>(checked(options), upstream.properties().device)) {
  if (options.report_at_exit) detail::run_at_exit(state_);
}

tracking_adaptor::tracking_adaptor(std::shared_ptr<memory_resource> upstream, tracking_options options)
    : resource_adaptor(std::move(upstream), "tracking_adaptor"),
      state_(std::make_shared<state>(checked(options), this->upstream().properties().device)) {
  if (options.report_at_exit) detail::run_at_exit(state_);
}

tracking_adaptor::~tracking_adaptor() {
  if (!state_->opt.report_at_exit || state_->reported.exchange(true)) return;
  try {
    const std::string r = state_->report(" as the adaptor is destroyed");
    if (!r.empty()) diagnose(diagnostic_level::warning, r);
  } catch (...) {
  }
}

void* tracking_adaptor::do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) {
  state& st = *state_;
  record r{bytes, alignment, stream.handle(), detail::small_thread_id(), 0, 0, 0, {}};
  if (st.opt.capture_stacks) r.frames = detail::capture_stack(st.opt.stack_depth);
  r.site = st.capture_site();
  void* p = nullptr;
  try {
    p = upstream_allocate(bytes, stream, alignment);
  } catch (const out_of_memory& e) {
    if (st.history) {
      tracking_event oom;
      oom.kind = tracking_event_kind::out_of_memory;
      oom.bytes = bytes;
      oom.stream = stream;
      oom.thread = r.thread;
      oom.site = r.site;
      oom.device_free_bytes = e.info().device_free_bytes;
      st.history->push(oom, st.start_ns);
    }
    throw;
  }
  r.seq = st.next_seq.fetch_add(1, std::memory_order_relaxed);
  r.time_ns = detail::steady_ns() - st.start_ns;
  if (st.history) {
    tracking_event e;
    e.kind = tracking_event_kind::allocate;
    e.ptr = p;
    e.bytes = bytes;
    e.stream = stream;
    e.thread = r.thread;
    e.seq = r.seq;
    e.site = r.site;
    st.history->push(e, st.start_ns);
  }
  auto& sh = st.shards[shard_of(p)];
  std::lock_guard lock(sh.mutex);
  sh.live.insert_or_assign(p, std::move(r));
  return p;
}

void tracking_adaptor::do_deallocate(void* ptr, std::size_t bytes, stream_view stream,
                                     std::size_t alignment) {
  state& st = *state_;
  auto& sh = st.shards[shard_of(ptr)];
  record taken;
  {
    std::lock_guard lock(sh.mutex);
    auto it = sh.live.find(ptr);
    if (it == sh.live.end()) {
      throw logic_error("gpumem::tracking_adaptor::deallocate: " +
                        detail::hex_pointer(reinterpret_cast<std::uintptr_t>(ptr)) +
                        " is not a live allocation of this adaptor (foreign, interior or already freed)");
    }
    if (it->second.bytes != bytes) {
      throw logic_error("gpumem::tracking_adaptor::deallocate: " +
                        detail::hex_pointer(reinterpret_cast<std::uintptr_t>(ptr)) + " was allocated with " +
                        std::to_string(it->second.bytes) + " bytes, freed with " + std::to_string(bytes));
    }
    taken = std::move(it->second);
    sh.live.erase(it);
  }
  if (st.history) {  // before the upstream: Note [Sites the program supplies]
    tracking_event e;
    e.kind = tracking_event_kind::deallocate;
    e.ptr = ptr;
    e.bytes = bytes;
    e.stream = stream;
    e.thread = detail::small_thread_id();
    e.seq = taken.seq;
    e.site = st.capture_site();
    st.history->push(e, st.start_ns);
  }
  try {
    upstream_deallocate(ptr, bytes, stream, alignment);
  } catch (...) {
    std::lock_guard lock(sh.mutex);  // the upstream kept it: so do we
    sh.live.emplace(ptr, std::move(taken));
    throw;
  }
}

std::vector<tracked_allocation> tracking_adaptor::live() const {
  std::vector<tracked_allocation> out;
  for (auto& [p, r] : state_->copy_live()) {
    tracked_allocation a;
    a.ptr = p;
    a.bytes = r.bytes;
    a.alignment = r.alignment;
    a.stream = stream_view{r.stream};
    a.thread = r.thread;
    a.seq = r.seq;
    a.time_ns = r.time_ns;
    for (void* f : r.frames) a.stack.push_back(detail::describe_frame(f));
    a.site = r.site;
    a.site_frames = state_->describe_site(r.site);
    out.push_back(std::move(a));
  }
  return out;
}

std::size_t tracking_adaptor::live_count() const {
  std::size_t n = 0;
  for (const auto& s : state_->shards) {
    std::lock_guard lock(s.mutex);
    n += s.live.size();
  }
  return n;
}

std::size_t tracking_adaptor::live_bytes() const {
  std::size_t n = 0;
  for (const auto& s : state_->shards) {
    std::lock_guard lock(s.mutex);
    for (const auto& [p, r] : s.live) n += r.bytes;
  }
  return n;
}

std::string tracking_adaptor::leak_report() const { return state_->report(""); }

void tracking_adaptor::write_snapshot(const std::string& path) const {
  std::string text(detail::log_header);
  text.push_back('\n');
  for (auto& [p, r] : state_->copy_live()) {
    // The program's site where there is one (Python's innermost frame), else the native caller.
    const std::vector<std::string> program_site = state_->describe_site(r.site);
    const std::string site = !program_site.empty() ? program_site.front()
                             : r.frames.empty()    ? std::string()
                                                   : detail::describe_frame(r.frames.front());
    detail::log_row row;
    row.seq = r.seq;
    row.time_ns = r.time_ns;
    row.thread = r.thread;
    row.device = state_->device;
    row.stream = reinterpret_cast<std::uintptr_t>(r.stream);
    row.source = "snapshot";
    row.op = detail::log_op::allocate;
    row.ptr = reinterpret_cast<std::uintptr_t>(p);
    row.bytes = r.bytes;
    row.alignment = r.alignment;
    row.site = site;
    detail::append_log_row(text, row);
  }
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) throw logic_error("gpumem::tracking_adaptor::write_snapshot: cannot open " + path);
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) {
    throw logic_error("gpumem::tracking_adaptor::write_snapshot: cannot write " + path);
  }
}

std::vector<tracking_event> tracking_adaptor::history() const {
  return state_->history ? state_->history->ordered() : std::vector<tracking_event>{};
}

std::uint64_t tracking_adaptor::history_dropped() const {
  return state_->history ? state_->history->dropped() : 0;
}

void tracking_adaptor::clear_history() {
  if (state_->history) state_->history->clear();
}

const tracking_options& tracking_adaptor::options() const noexcept { return state_->opt; }

}  // namespace gpumem
