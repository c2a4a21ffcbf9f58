// The report page (html.hpp): an SVG chart of stacked live bytes per group as
// step areas, the reserved bytes as a line, out-of-memory markers, axes, legend
// and a summary table. The chart alone is also what multi_page.cpp stacks.
#include "report/html.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace gpumem::tools {
namespace {

constexpr double chart_width = 1100;
constexpr double left = 90, right = 24, top = 24, bottom = 52;
constexpr double plot_w = chart_width - left - right;

std::string fixed(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// Tick steps giving about 4 to 8 ticks: a power of two of bytes, or 1, 2 or 5
// times a power of ten of nanoseconds.
double byte_step(double range) {
  double step = 1;
  while (step * 6 < range) step *= 2;
  return step;
}
double time_step(double range) {
  double unit = 1;
  while (unit * 10 <= range / 6) unit *= 10;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (unit * m >= range / 6) return unit * m;
  }
  return unit * 10;
}

// "512 MiB", "1.5 GiB": no trailing zeros on axis labels.
std::string tick_bytes(double v) {
  std::string s = human_bytes(v);
  const auto dot = s.find('.');
  if (dot == std::string::npos) return s;
  const auto space = s.find(' ', dot);
  std::string digits = s.substr(0, space);
  while (digits.back() == '0') digits.pop_back();
  if (digits.back() == '.') digits.pop_back();
  return digits + s.substr(space);
}

}  // namespace

std::string escape_html(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

std::string human_duration(double ns) {
  char buf[32];
  if (ns < 1e3) std::snprintf(buf, sizeof buf, "%.0f ns", ns);
  else if (ns < 1e6) std::snprintf(buf, sizeof buf, "%.3g us", ns / 1e3);
  else if (ns < 1e9) std::snprintf(buf, sizeof buf, "%.3g ms", ns / 1e6);
  else std::snprintf(buf, sizeof buf, "%.3g s", ns / 1e9);
  return buf;
}

const std::vector<std::string>& group_palette() {
  // One log has at most 9 groups; several logs' sites can add up to more.
  static const std::vector<std::string> p = {"#4e79a7", "#f28e2b", "#59a14f", "#76b7b2", "#edc948",
                                             "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac", "#86bcb6",
                                             "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e",
                                             "#e6ab02", "#a6761d", "#17becf", "#bcbd22", "#393b79"};
  return p;
}

std::string render_chart(const timeline& tl, const chart_options& opt) {
  const auto& palette = group_palette();
  const double chart_height = opt.height;
  const double plot_h = chart_height - top - bottom;
  const std::uint64_t axis_start = opt.axis ? opt.axis->start_ns : tl.start_ns;
  const std::uint64_t axis_end = opt.axis ? opt.axis->end_ns : tl.end_ns;
  const double t0 = static_cast<double>(axis_start);
  const double span = std::max(1.0, static_cast<double>(axis_end - axis_start));
  const double own_top = static_cast<double>(std::max(tl.peak_live, tl.peak_reserved)) * 1.08;
  const double ymax = std::max(1.0, opt.top_bytes ? *opt.top_bytes : own_top);
  auto X = [&](std::uint64_t t) { return left + (static_cast<double>(t) - t0) / span * plot_w; };
  auto Y = [&](double bytes) { return top + plot_h - bytes / ymax * plot_h; };
  // On a shared axis a log that ended early stops there; alone, its last state
  // fills the plot.
  const double x_last = opt.axis ? X(tl.end_ns) : left + plot_w;
  auto colour = [&](std::size_t g) {
    return palette[(g < opt.colour_of_group.size() ? opt.colour_of_group[g] : g) % palette.size()];
  };

  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"" << escape_html(opt.id) << "\"";
  if (!opt.log_name.empty()) svg << " data-log=\"" << escape_html(opt.log_name) << "\"";
  svg << " width=\"" << chart_width << "\" height=\"" << chart_height << "\" viewBox=\"0 0 " << chart_width << " "
      << chart_height << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  svg << "<rect class=\"plot-area\" x=\"" << left << "\" y=\"" << top << "\" width=\"" << plot_w
      << "\" height=\"" << plot_h << "\" fill=\"#fafafa\" stroke=\"#ccc\"/>\n";

  // Axes and grid.
  svg << "<g class=\"axis y-axis\">\n";
  const double ystep = byte_step(ymax);
  for (double v = 0; v <= ymax; v += ystep) {
    svg << "<line x1=\"" << left << "\" x2=\"" << left + plot_w << "\" y1=\"" << fixed(Y(v)) << "\" y2=\""
        << fixed(Y(v)) << "\" stroke=\"#e4e4e4\"/>"
        << "<text x=\"" << left - 8 << "\" y=\"" << fixed(Y(v) + 4) << "\" text-anchor=\"end\">"
        << escape_html(tick_bytes(v)) << "</text>\n";
  }
  svg << "<text x=\"16\" y=\"" << top + plot_h / 2 << "\" transform=\"rotate(-90 16 " << top + plot_h / 2
      << ")\" text-anchor=\"middle\">bytes</text>\n</g>\n";
  svg << "<g class=\"axis x-axis\">\n";
  const double xstep = time_step(span);
  for (double v = 0; v <= span; v += xstep) {
    const double x = left + v / span * plot_w;
    svg << "<line x1=\"" << fixed(x) << "\" x2=\"" << fixed(x) << "\" y1=\"" << top + plot_h << "\" y2=\""
        << top + plot_h + 5 << "\" stroke=\"#666\"/>"
        << "<text x=\"" << fixed(x) << "\" y=\"" << top + plot_h + 19 << "\" text-anchor=\"middle\">"
        << (v == 0 ? std::string("0") : human_duration(v)) << "</text>\n";
  }
  svg << "<text x=\"" << left + plot_w / 2 << "\" y=\"" << chart_height - 8
      << "\" text-anchor=\"middle\">" << escape_html(opt.time_label) << "</text>\n</g>\n";

  // Stacked step areas, bottom group first.
  const std::size_t groups = tl.groups.size();
  std::vector<std::uint64_t> below(tl.points.size(), 0);
  for (std::size_t g = 0; g < groups; ++g) {
    std::ostringstream upper, lower;
    std::vector<std::uint64_t> top_of(tl.points.size());
    for (std::size_t i = 0; i < tl.points.size(); ++i) top_of[i] = below[i] + tl.points[i].live[g];
    bool any = false;
    for (std::size_t i = 0; i < tl.points.size(); ++i) any |= tl.points[i].live[g] > 0;
    if (any && !tl.points.empty()) {
      // Upper edge left to right as steps, lower edge right to left.
      for (std::size_t i = 0; i < tl.points.size(); ++i) {
        const double x = X(tl.points[i].t_ns);
        const double xn = i + 1 < tl.points.size() ? X(tl.points[i + 1].t_ns) : x_last;
        upper << (i == 0 ? "M" : "L") << fixed(x) << " " << fixed(Y(static_cast<double>(top_of[i]))) << " L"
              << fixed(xn) << " " << fixed(Y(static_cast<double>(top_of[i]))) << " ";
      }
      for (std::size_t k = tl.points.size(); k-- > 0;) {
        const double x = X(tl.points[k].t_ns);
        const double xn = k + 1 < tl.points.size() ? X(tl.points[k + 1].t_ns) : x_last;
        lower << "L" << fixed(xn) << " " << fixed(Y(static_cast<double>(below[k]))) << " L" << fixed(x) << " "
              << fixed(Y(static_cast<double>(below[k]))) << " ";
      }
      svg << "<path class=\"area\" data-group=\"" << escape_html(tl.groups[g]) << "\" fill=\""
          << colour(g) << "\" stroke=\"none\" d=\"" << upper.str() << lower.str()
          << "Z\"><title>" << escape_html(tl.groups[g]) << "</title></path>\n";
    }
    below = top_of;
  }

  // Reserved bytes.
  if (!tl.reserved.empty()) {
    std::ostringstream d;
    for (std::size_t i = 0; i < tl.reserved.size(); ++i) {
      const double x = X(tl.reserved[i].t_ns);
      const double xn = i + 1 < tl.reserved.size() ? X(tl.reserved[i + 1].t_ns) : x_last;
      const double y = Y(static_cast<double>(tl.reserved[i].bytes));
      d << (i == 0 ? "M" : "L") << fixed(x) << " " << fixed(y) << " L" << fixed(xn) << " " << fixed(y) << " ";
    }
    svg << "<path class=\"reserved\" fill=\"none\" stroke=\"" << reserved_colour
        << "\" stroke-width=\"2\" d=\"" << d.str() << "\"><title>reserved by the pool</title></path>\n";
  }

  // The peak.
  if (tl.peak_live > 0) {
    const double px = X(tl.peak_live_t), py = Y(static_cast<double>(tl.peak_live));
    svg << "<g class=\"peak\"><circle cx=\"" << fixed(px) << "\" cy=\"" << fixed(py)
        << "\" r=\"4\" fill=\"#000\"/><text x=\"" << fixed(std::min(px + 6, left + plot_w - 150)) << "\" y=\""
        << fixed(std::max(py - 8, top + 12)) << "\">peak live "
        << escape_html(human_bytes(static_cast<double>(tl.peak_live)))
        << "</text></g>\n";
  }

  // Out-of-memory markers.
  for (std::size_t i = 0; i < tl.ooms.size() && i < max_oom_markers; ++i) {
    const oom_marker& m = tl.ooms[i];
    const double x = X(m.t_ns);
    svg << "<g class=\"oom-marker\"><line x1=\"" << fixed(x) << "\" x2=\"" << fixed(x) << "\" y1=\"" << top
        << "\" y2=\"" << top + plot_h << "\" stroke=\"" << oom_colour
        << "\" stroke-width=\"1.5\" stroke-dasharray=\"4 3\"/><path d=\"M" << fixed(x - 6) << " " << top << " L"
        << fixed(x + 6) << " " << top << " L" << fixed(x) << " " << top + 10 << " Z\" fill=\"" << oom_colour
        << "\"/><title>out of memory: " << m.bytes << " bytes ("
        << escape_html(human_bytes(static_cast<double>(m.bytes)))
        << ") requested at " << human_duration(static_cast<double>(m.t_ns) - t0) << " by thread " << m.thread
        << (m.site.empty() ? "" : " at " + escape_html(m.site)) << "</title></g>\n";
  }
  if (!opt.log_name.empty()) {
    svg << "<text class=\"log-name\" x=\"" << left << "\" y=\"" << top - 7
        << "\" font-size=\"13\" font-weight=\"bold\">" << escape_html(opt.log_name) << "</text>\n";
  }
  svg << "</svg>\n";
  return svg.str();
}

std::string page_start(const std::string& title, const std::string& extra_css) {
  return "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" + escape_html(title) +
         "</title>\n<style>\n"
         "body{font-family:sans-serif;margin:24px;color:#222;background:#fff}\n"
         "h1{font-size:20px;margin:0 0 4px}\n.sub{color:#666;margin:0 0 12px;font-size:13px}\n"
         ".legend{list-style:none;padding:0;margin:8px 0 16px;display:flex;flex-wrap:wrap;gap:6px 18px;font-size:13px}\n"
         ".swatch{display:inline-block;width:12px;height:12px;margin-right:6px;vertical-align:-1px}\n"
         ".line{display:inline-block;width:18px;border-top:2px solid;margin-right:6px;vertical-align:3px}\n"
         ".line.dashed{border-top-style:dashed}\n"
         ".tables{display:flex;gap:40px;align-items:flex-start}\n"
         "table{border-collapse:collapse;font-size:13px}\nth,td{text-align:left;padding:3px 10px 3px 0}\n"
         "th{font-weight:600;color:#444}\n" +
         extra_css + "</style>\n</head>\n<body>\n";
}

std::string render_html(const timeline& tl, const page_options& opt) {
  const auto& palette = group_palette();
  const double t0 = static_cast<double>(tl.start_ns);
  const double span = std::max(1.0, static_cast<double>(tl.end_ns - tl.start_ns));
  const std::size_t groups = tl.groups.size();
  const std::string svg = render_chart(tl, chart_options{});

  // Legend.
  std::ostringstream legend;
  legend << "<ul class=\"legend\">\n";
  for (std::size_t g = 0; g < groups; ++g) {
    legend << "<li><span class=\"swatch\" style=\"background:" << palette[g % palette.size()] << "\"></span>"
           << escape_html(tl.groups[g]) << "</li>\n";
  }
  if (!tl.reserved.empty()) {
    legend << "<li><span class=\"line\" style=\"border-color:" << reserved_colour
           << "\"></span>reserved (what the pool holds)</li>\n";
  }
  if (!tl.ooms.empty()) {
    legend << "<li><span class=\"line dashed\" style=\"border-color:" << oom_colour << "\"></span>out of memory ("
           << tl.ooms.size() << (tl.ooms.size() > max_oom_markers ? ", first 100 drawn" : "") << ")</li>\n";
  }
  legend << "</ul>\n";

  // Summary.
  std::ostringstream summary;
  auto row = [&](const std::string& k, const std::string& v) {
    summary << "<tr><th>" << escape_html(k) << "</th><td>" << escape_html(v) << "</td></tr>\n";
  };
  summary << "<table class=\"summary\">\n";
  row("duration", human_duration(span));
  row("events", std::to_string(tl.events) + " (" + std::to_string(tl.allocations) + " allocations, " +
                    std::to_string(tl.frees) + " frees, " + std::to_string(tl.failed_calls) + " failed calls)");
  row("threads / streams", std::to_string(tl.threads) + " / " + std::to_string(tl.streams));
  row("peak live", human_bytes(static_cast<double>(tl.peak_live)) + " at " +
                       human_duration(static_cast<double>(tl.peak_live_t) - t0));
  if (!tl.reserved.empty()) {
    char util[64];
    std::snprintf(util, sizeof util, " (live / reserved at the peaks: %.0f%%)",
                  tl.peak_reserved > 0 ? 100.0 * static_cast<double>(tl.peak_live) / static_cast<double>(tl.peak_reserved) : 0.0);
    row("peak reserved", human_bytes(static_cast<double>(tl.peak_reserved)) + " at " +
                             human_duration(static_cast<double>(tl.peak_reserved_t) - t0) + util);
  }
  row("largest allocation", human_bytes(static_cast<double>(tl.largest_allocation)));
  row("out of memory", std::to_string(tl.ooms.size()) + " allocation(s)");
  summary << "</table>\n<table class=\"composition\"><tr><th>" << escape_html(opt.grouping_name)
          << "</th><th>live at the peak</th></tr>\n";
  for (std::size_t g = 0; g < groups; ++g) {
    summary << "<tr><td><span class=\"swatch\" style=\"background:" << palette[g % palette.size()] << "\"></span>"
            << escape_html(tl.groups[g]) << "</td><td>"
            << escape_html(human_bytes(static_cast<double>(tl.live_at_peak[g])))
            << "</td></tr>\n";
  }
  summary << "</table>\n";

  std::ostringstream page;
  page << page_start(opt.title) << "<h1>" << escape_html(opt.title) << "</h1>\n<p class=\"sub\">"
       << escape_html(opt.source_name) << (tl.snapshot ? " (a snapshot of live allocations)" : "")
       << " &middot; live bytes stacked by " << escape_html(opt.grouping_name) << "</p>\n"
       << svg << legend.str() << "<div class=\"tables\">\n" << summary.str() << "</div>\n</body>\n</html>\n";
  return page.str();
}

}  // namespace gpumem::tools
