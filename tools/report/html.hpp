// gpumem-report's page: one self-contained HTML file (inline CSS and SVG, no
// script, nothing fetched) with the memory timeline and a summary.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "report/timeline.hpp"

namespace gpumem::tools {

struct page_options {
  std::string title = "gpumem memory timeline";
  std::string source_name;  // the log's file name, shown under the title
  std::string grouping_name = "size class";
};

std::string render_html(const timeline& tl, const page_options& options);

// One chart's SVG. The defaults draw one log on its own: time from its first to
// its last event, bytes up to its own peaks. Several logs on one page share the
// time axis and the byte scale, and their colours, through these options.
struct chart_options {
  struct time_axis {
    std::uint64_t start_ns, end_ns;  // in the log's time_ns
  };
  std::optional<time_axis> axis;  // set: the areas stop at the log's last event
  std::optional<double> top_bytes;
  double height = 480;
  std::vector<std::size_t> colour_of_group;  // palette index per group; empty: the group's own index
  std::string id = "timeline";
  std::string log_name;  // set: drawn in the plot's corner and as the svg's data-log
  std::string time_label = "time since the log began";
};
std::string render_chart(const timeline& tl, const chart_options& options);

// The chart's colours, bottom group first (the tests look for them in screenshots).
const std::vector<std::string>& group_palette();
inline constexpr const char* oom_colour = "#d62728";
inline constexpr const char* reserved_colour = "#222222";
inline constexpr std::size_t max_oom_markers = 100;  // per chart

// Text for pages: HTML-escaped; a duration ("1.5 ms").
std::string escape_html(const std::string& s);
std::string human_duration(double ns);

// A page from its doctype to <body>: the title and the style every page shares,
// then `extra_css`.
std::string page_start(const std::string& title, const std::string& extra_css = "");

}  // namespace gpumem::tools
