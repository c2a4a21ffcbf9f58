// gpumem-report's model: a log turned into a memory timeline (live bytes by
// group over time, reserved bytes, out-of-memory markers), sampled down to a
// size a browser draws at once while keeping every peak.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/event_log_reader.hpp"

namespace gpumem::tools {

enum class grouping { size_class, site };

struct timeline_point {
  std::uint64_t t_ns;
  std::vector<std::uint64_t> live;  // per group, bottom of the stack first
};

struct reserved_point {
  std::uint64_t t_ns;
  std::uint64_t bytes;
};

struct oom_marker {
  std::uint64_t t_ns;
  std::uint64_t bytes;
  std::uint32_t thread;
  std::string site;
};

struct timeline {
  std::vector<std::string> groups;
  std::vector<timeline_point> points;    // step function: a value holds until the next point
  std::vector<reserved_point> reserved;  // empty when the log has no "upstream" rows
  std::vector<oom_marker> ooms;
  std::uint64_t start_ns = 0, end_ns = 0;
  std::uint64_t peak_live = 0, peak_live_t = 0;
  std::uint64_t peak_reserved = 0, peak_reserved_t = 0;
  std::vector<std::uint64_t> live_at_peak;  // per group
  std::size_t events = 0, allocations = 0, frees = 0, failed_calls = 0, threads = 0, streams = 0;
  std::uint64_t largest_allocation = 0;
  bool snapshot = false;  // made from a tracking snapshot (allocations only)
};

// The size classes' group names, smallest first.
const std::vector<std::string>& size_class_names();

// At most about max_points points per series: each time bucket keeps the moment
// of its highest total and its last state, so peaks and drops both survive.
timeline build_timeline(const std::vector<logged_event>& events, grouping by, std::size_t max_points = 1600);

}  // namespace gpumem::tools
