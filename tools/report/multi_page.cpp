// The page for several logs (multi_page.hpp).
//
// Note [Aligning several logs]
// A log's time_ns counts from the moment that log was opened, on the steady
// clock of the process that wrote it (docs/observability.md, "The log format");
// no wall-clock time is recorded, in the header or in any row. So a moment of one
// process cannot be matched with a moment of another: each chart starts at its
// own log's opening (time_ns 0). The charts share one time scale and one byte
// scale, so that durations and sizes compare from chart to chart, and the
// caption says that the axes are not one clock. A curve of all processes added
// up needs matched moments and would be wrong by however far apart the logs were
// opened, so none is drawn; the table gives the sum of the peaks instead, an
// upper bound on what the processes held at once.
#include "report/multi_page.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <sstream>

namespace gpumem::tools {
namespace {

constexpr double chart_height = 300;
constexpr const char* other_sites = "other sites";

// Every log's groups in one list, so that a colour is the same size class (or
// site) in every chart.
struct shared_groups {
  std::vector<std::string> names;                // legend order
  std::vector<std::vector<std::size_t>> of_log;  // per log, per group of its own: index in names
};

// Each log's "other sites (N)" counts its own remainder; on the page they are one group.
std::string group_key(const std::string& group) {
  return group.rfind(std::string(other_sites) + " (", 0) == 0 ? other_sites : group;
}

shared_groups merge_groups(const std::vector<named_timeline>& logs) {
  std::vector<std::string> seen;  // in order of first appearance
  for (const auto& log : logs) {
    for (const auto& g : log.tl.groups) {
      const std::string key = group_key(g);
      if (std::find(seen.begin(), seen.end(), key) == seen.end()) seen.push_back(key);
    }
  }
  auto is_seen = [&](const std::string& k) { return std::find(seen.begin(), seen.end(), k) != seen.end(); };
  const auto& classes = size_class_names();
  auto is_class = [&](const std::string& k) { return std::find(classes.begin(), classes.end(), k) != classes.end(); };
  shared_groups s;
  for (const auto& c : classes) {
    if (is_seen(c)) s.names.push_back(c);  // smallest first, as in one log's chart
  }
  for (const auto& k : seen) {
    if (!is_class(k) && k != other_sites) s.names.push_back(k);
  }
  if (is_seen(other_sites)) s.names.push_back(other_sites);
  for (const auto& log : logs) {
    std::vector<std::size_t> index;
    for (const auto& g : log.tl.groups) {
      index.push_back(static_cast<std::size_t>(
          std::find(s.names.begin(), s.names.end(), group_key(g)) - s.names.begin()));
    }
    s.of_log.push_back(std::move(index));
  }
  return s;
}

std::string bytes_text(std::uint64_t bytes) { return human_bytes(static_cast<double>(bytes)); }

std::string legend_html(const std::vector<named_timeline>& logs, const shared_groups& groups) {
  const auto& palette = group_palette();
  bool any_reserved = false;
  std::size_t ooms = 0, ooms_drawn = 0;
  for (const auto& log : logs) {
    any_reserved |= !log.tl.reserved.empty();
    ooms += log.tl.ooms.size();
    ooms_drawn += std::min(log.tl.ooms.size(), max_oom_markers);
  }
  std::ostringstream out;
  out << "<ul class=\"legend\">\n";
  for (std::size_t g = 0; g < groups.names.size(); ++g) {
    out << "<li><span class=\"swatch\" style=\"background:" << palette[g % palette.size()] << "\"></span>"
        << escape_html(groups.names[g]) << "</li>\n";
  }
  if (any_reserved) {
    out << "<li><span class=\"line\" style=\"border-color:" << reserved_colour
        << "\"></span>reserved (what the pool holds)</li>\n";
  }
  if (ooms > 0) {
    out << "<li><span class=\"line dashed\" style=\"border-color:" << oom_colour << "\"></span>out of memory ("
        << ooms << (ooms_drawn < ooms ? ", " + std::to_string(max_oom_markers) + " a chart drawn" : "") << ")</li>\n";
  }
  out << "</ul>\n";
  return out.str();
}

std::string summary_html(const std::vector<named_timeline>& logs) {
  std::ostringstream out;
  out << "<table class=\"summary\">\n<tr><th>log</th><th>duration</th><th>events</th><th>threads / streams</th>"
         "<th>peak live</th><th>peak reserved</th><th>largest allocation</th><th>out of memory</th></tr>\n";
  auto cell = [&](const std::string& text) { out << "<td>" << escape_html(text) << "</td>"; };
  std::size_t events = 0, ooms = 0;
  std::uint64_t live_peaks = 0, reserved_peaks = 0, largest = 0;
  bool any_reserved = false;
  for (const auto& log : logs) {
    const timeline& tl = log.tl;
    out << "<tr class=\"log\">";
    cell(log.name + (tl.snapshot ? " (a snapshot of live allocations)" : ""));
    cell(human_duration(std::max(1.0, static_cast<double>(tl.end_ns - tl.start_ns))));
    cell(std::to_string(tl.events) + " (" + std::to_string(tl.allocations) + " allocations, " +
         std::to_string(tl.frees) + " frees, " + std::to_string(tl.failed_calls) + " failed calls)");
    cell(std::to_string(tl.threads) + " / " + std::to_string(tl.streams));
    // "at": time since the log was opened, as on the charts' axis.
    cell(bytes_text(tl.peak_live) + " at " + human_duration(static_cast<double>(tl.peak_live_t)));
    cell(tl.reserved.empty() ? "-"
                             : bytes_text(tl.peak_reserved) + " at " +
                                   human_duration(static_cast<double>(tl.peak_reserved_t)));
    cell(bytes_text(tl.largest_allocation));
    cell(std::to_string(tl.ooms.size()));
    out << "</tr>\n";
    events += tl.events;
    ooms += tl.ooms.size();
    live_peaks += tl.peak_live;
    reserved_peaks += tl.peak_reserved;
    largest = std::max(largest, tl.largest_allocation);
    any_reserved |= !tl.reserved.empty();
  }
  out << "<tr class=\"all-logs\"><th>all " << logs.size() << " logs</th>";
  cell("");
  cell(std::to_string(events));
  cell("");
  cell("sum of the peaks " + bytes_text(live_peaks));
  cell(any_reserved ? "sum of the peaks " + bytes_text(reserved_peaks) : "-");
  cell(bytes_text(largest));
  cell(std::to_string(ooms));
  out << "</tr>\n</table>\n";
  return out.str();
}

std::string composition_html(const std::vector<named_timeline>& logs, const shared_groups& groups,
                             const std::string& grouping_name) {
  const auto& palette = group_palette();
  std::ostringstream out;
  out << "<table class=\"composition\">\n<tr><th>" << escape_html(grouping_name) << ": live at each log's peak</th>";
  for (const auto& log : logs) out << "<th>" << escape_html(log.name) << "</th>";
  out << "</tr>\n";
  for (std::size_t g = 0; g < groups.names.size(); ++g) {
    out << "<tr><td><span class=\"swatch\" style=\"background:" << palette[g % palette.size()] << "\"></span>"
        << escape_html(groups.names[g]) << "</td>";
    for (std::size_t i = 0; i < logs.size(); ++i) {
      const auto& index = groups.of_log[i];
      const auto own = std::find(index.begin(), index.end(), g);
      const auto at = static_cast<std::size_t>(own - index.begin());
      out << "<td>"
          << (own == index.end() ? std::string("-") : escape_html(bytes_text(logs[i].tl.live_at_peak[at])))
          << "</td>";
    }
    out << "</tr>\n";
  }
  out << "</table>\n";
  return out.str();
}

}  // namespace

std::string render_multi_log_html(const std::vector<named_timeline>& logs, const page_options& opt) {
  const shared_groups groups = merge_groups(logs);
  // One time scale from 0, the logs' openings (Note [Aligning several logs]), and one byte scale.
  std::uint64_t axis_end_ns = 1;
  std::uint64_t top_bytes = 0;
  for (const auto& log : logs) {
    axis_end_ns = std::max(axis_end_ns, log.tl.end_ns);
    top_bytes = std::max({top_bytes, log.tl.peak_live, log.tl.peak_reserved});
  }
  std::ostringstream charts;
  for (std::size_t i = 0; i < logs.size(); ++i) {
    chart_options chart;
    chart.axis = chart_options::time_axis{0, axis_end_ns};
    chart.top_bytes = static_cast<double>(top_bytes) * 1.08;
    chart.height = chart_height;
    chart.colour_of_group = groups.of_log[i];
    chart.id = "timeline-" + std::to_string(i + 1);
    chart.log_name = logs[i].name;
    chart.time_label = "time since each log was opened";
    charts << render_chart(logs[i].tl, chart);
  }
  std::ostringstream page;
  page << page_start(opt.title,
                     ".caption{font-size:13px;color:#444;max-width:1060px;margin:0 0 4px}\n"
                     "svg{display:block;margin:0 0 4px}\n"
                     ".tables{flex-direction:column;gap:16px}\n"
                     "tr.all-logs{border-top:1px solid #ccc}\n")
       << "<h1>" << escape_html(opt.title) << "</h1>\n<p class=\"sub\">" << logs.size()
       << " logs, one chart each &middot; live bytes stacked by " << escape_html(opt.grouping_name) << "</p>\n"
       << "<p class=\"caption\">The logs record time on each process's own clock, from when its log was opened, "
          "and no wall-clock time: so each chart starts at its own log's opening. The charts share one time scale "
          "and one byte scale, not one clock: the same place on two charts is the same time since opening, not the "
          "same moment. For that reason no curve of all processes added up is drawn; the table gives the sum of "
          "the peaks, an upper bound on what the processes held at once.</p>\n"
       << legend_html(logs, groups) << charts.str() << "<div class=\"tables\">\n"
       << summary_html(logs) << composition_html(logs, groups, opt.grouping_name) << "</div>\n</body>\n</html>\n";
  return page.str();
}

int multi_log_page_height(const std::vector<named_timeline>& logs) {
  // Generous: a screenshot a little too tall has white below; one too short loses
  // the tables. Long names (sites) wrap, about 90 characters a line.
  const shared_groups groups = merge_groups(logs);
  auto lines = [](const std::string& text) { return 1.0 + static_cast<double>(text.size() / 90); };
  double legend_chars = 0, composition = 24;
  for (const auto& g : groups.names) {
    legend_chars += static_cast<double>(g.size()) + 8;
    composition += 22 * lines(g);
  }
  const double heading = 24 + 30 + 30 + 4 * 18;
  const double legend = 28 * (1 + legend_chars / 150);
  const double charts = static_cast<double>(logs.size()) * (chart_height + 4);
  const double summary = 24 + 40 * static_cast<double>(logs.size() + 1);
  return static_cast<int>(heading + legend + charts + summary + 16 + composition + 48);
}

std::vector<std::string> log_display_names(const std::vector<std::string>& paths) {
  std::map<std::string, std::size_t> uses;
  std::vector<std::string> names;
  for (const auto& p : paths) names.push_back(std::filesystem::path(p).filename().string());
  for (const auto& n : names) ++uses[n];
  for (std::size_t i = 0; i < paths.size(); ++i) {
    if (uses[names[i]] > 1) names[i] = paths[i];
  }
  return names;
}

}  // namespace gpumem::tools
