// Building the timeline (timeline.hpp).
#include "report/timeline.hpp"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <unordered_map>

namespace gpumem::tools {
namespace {

constexpr std::uint64_t KiB = 1024, MiB = KiB * 1024;
struct size_class {
  std::uint64_t below;
  const char* name;
};
constexpr size_class size_classes[] = {
    {4 * KiB, "< 4 KiB"},          {64 * KiB, "4 KiB - 64 KiB"},    {MiB, "64 KiB - 1 MiB"},
    {16 * MiB, "1 MiB - 16 MiB"},  {256 * MiB, "16 MiB - 256 MiB"}, {~std::uint64_t{0}, ">= 256 MiB"},
};
constexpr std::size_t max_site_groups = 8;

// Samples a step function into buckets: per bucket, the state at its highest
// total and its last state.
template <class State, class Total>
class sampler {
 public:
  sampler(std::uint64_t start, std::uint64_t width, Total total) : start_(start), width_(width), total_(total) {}
  template <class Emit>
  void add(std::uint64_t t, const State& s, Emit&& emit) {
    const std::uint64_t b = (t - start_) / width_;
    if (has_ && b != bucket_) flush(emit);
    if (!has_ || total_(s) > total_(max_)) {
      max_ = s;
      max_t_ = t;
    }
    has_ = true;
    bucket_ = b;
    last_ = s;
    last_t_ = t;
  }
  template <class Emit>
  void flush(Emit&& emit) {
    if (!has_) return;
    emit(max_t_, max_);
    if (last_t_ != max_t_ || total_(last_) != total_(max_)) emit(last_t_, last_);
    has_ = false;
  }

 private:
  std::uint64_t start_, width_;
  Total total_;
  bool has_ = false;
  std::uint64_t bucket_ = 0, max_t_ = 0, last_t_ = 0;
  State max_{}, last_{};
};

}  // namespace

const std::vector<std::string>& size_class_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& c : size_classes) v.push_back(c.name);
    return v;
  }();
  return names;
}

timeline build_timeline(const std::vector<logged_event>& events, grouping by, std::size_t max_points) {
  timeline tl;
  tl.events = events.size();
  if (events.empty()) return tl;
  tl.start_ns = events.front().time_ns;
  tl.end_ns = events.front().time_ns;
  std::set<std::uint32_t> threads;
  std::set<std::uint64_t> streams;
  bool any_free = false, any_snapshot = false;
  for (const auto& e : events) {
    tl.start_ns = std::min(tl.start_ns, e.time_ns);
    tl.end_ns = std::max(tl.end_ns, e.time_ns);
    if (e.source == "upstream") continue;
    threads.insert(e.thread);
    streams.insert(e.stream);
    any_free |= !e.allocate;
    any_snapshot |= e.source == "snapshot";
  }
  tl.threads = threads.size();
  tl.streams = streams.size();
  tl.snapshot = any_snapshot && !any_free;

  // Groups: size classes that occur, or the sites that allocated most.
  std::vector<std::size_t> group_of_class(std::size(size_classes), 0);
  std::unordered_map<std::string, std::size_t> group_of_site;
  auto class_of = [](std::uint64_t bytes) {
    std::size_t c = 0;
    while (bytes >= size_classes[c].below) ++c;
    return c;
  };
  std::size_t other_group = 0;
  if (by == grouping::size_class) {
    std::vector<bool> used(std::size(size_classes), false);
    for (const auto& e : events) {
      if (e.source != "upstream" && e.allocate && e.ok()) used[class_of(e.bytes)] = true;
    }
    for (std::size_t c = 0; c < used.size(); ++c) {
      if (!used[c]) continue;
      group_of_class[c] = tl.groups.size();
      tl.groups.push_back(size_classes[c].name);
    }
  } else {
    std::map<std::string, std::uint64_t> bytes_by_site;
    for (const auto& e : events) {
      if (e.source != "upstream" && e.allocate && e.ok()) {
        bytes_by_site[e.site.empty() ? "(no site recorded)" : e.site] += e.bytes;
      }
    }
    std::vector<std::pair<std::string, std::uint64_t>> sites(bytes_by_site.begin(), bytes_by_site.end());
    std::stable_sort(sites.begin(), sites.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    for (std::size_t i = 0; i < sites.size() && i < max_site_groups; ++i) {
      group_of_site[sites[i].first] = tl.groups.size();
      tl.groups.push_back(sites[i].first);
    }
    if (sites.size() > max_site_groups) {
      other_group = tl.groups.size();
      tl.groups.push_back("other sites (" + std::to_string(sites.size() - max_site_groups) + ")");
    }
  }
  auto group_of = [&](const logged_event& e) -> std::size_t {
    if (by == grouping::size_class) return group_of_class[class_of(e.bytes)];
    auto it = group_of_site.find(e.site.empty() ? "(no site recorded)" : e.site);
    return it != group_of_site.end() ? it->second : other_group;
  };

  const std::uint64_t span = std::max<std::uint64_t>(1, tl.end_ns - tl.start_ns + 1);
  const std::uint64_t width = std::max<std::uint64_t>(1, span * 2 / std::max<std::size_t>(2, max_points));
  using live_state = std::vector<std::uint64_t>;
  auto live_total = [](const live_state& s) { return std::accumulate(s.begin(), s.end(), std::uint64_t{0}); };
  sampler<live_state, decltype(live_total)> live_sampler(tl.start_ns, width, live_total);
  auto reserved_total = [](std::uint64_t v) { return v; };
  sampler<std::uint64_t, decltype(reserved_total)> reserved_sampler(tl.start_ns, width, reserved_total);
  auto emit_live = [&](std::uint64_t t, const live_state& s) { tl.points.push_back({t, s}); };
  auto emit_reserved = [&](std::uint64_t t, std::uint64_t v) { tl.reserved.push_back({t, v}); };

  live_state live(tl.groups.size(), 0);
  std::uint64_t total = 0, reserved = 0;
  std::unordered_map<std::uint64_t, std::pair<std::size_t, std::uint64_t>> live_ptrs;  // ptr -> group, bytes
  std::unordered_map<std::uint64_t, std::uint64_t> reserved_ptrs;
  bool any_upstream = false;
  live_sampler.add(tl.start_ns, live, emit_live);
  for (const auto& e : events) {
    if (!e.ok()) {
      ++tl.failed_calls;
      if (e.allocate && e.outcome == "oom" && e.source != "upstream") {
        tl.ooms.push_back({e.time_ns, e.bytes, e.thread, e.site});
      }
      continue;
    }
    if (e.source == "upstream") {
      if (!any_upstream) reserved_sampler.add(tl.start_ns, 0, emit_reserved);
      any_upstream = true;
      if (e.allocate) {
        reserved += e.bytes;
        reserved_ptrs[e.ptr] = e.bytes;
      } else if (auto it = reserved_ptrs.find(e.ptr); it != reserved_ptrs.end()) {
        reserved -= it->second;
        reserved_ptrs.erase(it);
      }
      if (reserved > tl.peak_reserved) {
        tl.peak_reserved = reserved;
        tl.peak_reserved_t = e.time_ns;
      }
      reserved_sampler.add(e.time_ns, reserved, emit_reserved);
      continue;
    }
    if (e.allocate) {
      const std::size_t g = group_of(e);
      live[g] += e.bytes;
      total += e.bytes;
      live_ptrs[e.ptr] = {g, e.bytes};
      ++tl.allocations;
      tl.largest_allocation = std::max(tl.largest_allocation, e.bytes);
      if (total > tl.peak_live) {
        tl.peak_live = total;
        tl.peak_live_t = e.time_ns;
        tl.live_at_peak = live;
      }
    } else {
      auto it = live_ptrs.find(e.ptr);
      if (it == live_ptrs.end()) continue;  // allocated before the log began
      live[it->second.first] -= it->second.second;
      total -= it->second.second;
      live_ptrs.erase(it);
      ++tl.frees;
    }
    live_sampler.add(e.time_ns, live, emit_live);
  }
  live_sampler.flush(emit_live);
  reserved_sampler.flush(emit_reserved);
  if (tl.live_at_peak.empty()) tl.live_at_peak.assign(tl.groups.size(), 0);
  return tl;
}

}  // namespace gpumem::tools
