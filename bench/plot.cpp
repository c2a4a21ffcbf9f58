// SVG charts for gpumem-bench --plot (plot.hpp). Everything is computed here:
// axis ranges, round tick values, a legend beside the plot; the file holds one
// <svg> element with its styles inline and no script.
#include "plot.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace gpumem::bench {
namespace {

constexpr double width = 960, height = 560;
constexpr double margin_left = 88, margin_top = 72, legend_width = 300, margin_right = 16;
constexpr double note_line = 16;

// Ten colours that stay apart for most readers (the Tableau 10 set); after ten
// lines the dash pattern changes too.
constexpr const char* palette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                   "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
constexpr const char* dashes[] = {"", "7 4", "2 3", "10 3 2 3"};

std::string xml(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

// A tick label: up to three significant figures, thousands separated.
std::string tick_label(double v) {
  if (v == 0) return "0";
  const double a = std::abs(v);
  char buf[48];
  if (a >= 1000) {
    const long long r = std::llround(v);
    std::string digits = std::to_string(r < 0 ? -r : r), out;
    for (std::size_t i = 0; i < digits.size(); ++i) {
      if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
      out += digits[i];
    }
    return (r < 0 ? "-" : "") + out;
  }
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

double transform(double v, axis_scale s) {
  switch (s) {
    case axis_scale::log2: return std::log2(v);
    case axis_scale::log10: return std::log10(v);
    default: return v;
  }
}

bool usable(double v, axis_scale s) { return std::isfinite(v) && (s == axis_scale::linear || v > 0); }

// Round tick values covering [lo, hi] on a linear axis: steps of 1, 2, 2.5 or 5
// times a power of ten, about six of them.
std::vector<double> linear_ticks(double lo, double hi) {
  std::vector<double> out;
  const double span = hi - lo;
  if (!(span > 0)) return {lo};
  const double raw = span / 6;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (raw <= m * mag) {
      step = m * mag;
      break;
    }
  }
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) {
    out.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  }
  return out;
}

// Powers of two covering [lo, hi] (given as log2 values), at most about eight:
// every k-th power when the range is wide.
std::vector<double> log2_ticks(double lo, double hi) {
  std::vector<double> out;
  const double first = std::ceil(lo), last = std::floor(hi);
  const double every = std::max(1.0, std::ceil((last - first + 1) / 8));
  for (double e = first; e <= last; e += every) out.push_back(std::exp2(e));
  if (out.empty()) out.push_back(std::exp2(std::round((lo + hi) / 2)));
  return out;
}

// 1, 2 and 5 times the powers of ten covering [lo, hi] (given as log10 values);
// only the powers of ten when the range spans more than three decades.
std::vector<double> log10_ticks(double lo, double hi) {
  std::vector<double> out;
  const bool fine = hi - lo <= 3;
  for (double e = std::floor(lo); e <= std::ceil(hi); e += 1) {
    for (double m : {1.0, 2.0, 5.0}) {
      if (!fine && m != 1.0) continue;
      const double v = m * std::pow(10.0, e);
      const double lv = std::log10(v);
      if (lv >= lo - 1e-9 && lv <= hi + 1e-9) out.push_back(v);
    }
  }
  if (out.empty()) out.push_back(std::pow(10.0, std::round((lo + hi) / 2)));
  return out;
}

struct range {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  bool empty() const { return !(lo <= hi); }
};

// A horizontal bar chart: names on the left, bars from 0, the value at each bar's
// end, a dashed line at the reference.
std::string render_bars(const chart& c) {
  constexpr double name_width = 300, bar_height = 18, bar_step = 26;
  const double notes_height = note_line * static_cast<double>(c.notes.size());
  const double plot_left = name_width, plot_right = width - 80, plot_top = margin_top;
  const double plot_bottom = plot_top + bar_step * static_cast<double>(c.bars.size()) + 8;
  const double total_height = plot_bottom + 56 + notes_height;
  double hi = 0;
  for (const bar& b : c.bars) {
    if (std::isfinite(b.value)) hi = std::max(hi, b.value);
  }
  if (std::isfinite(c.bar_reference)) hi = std::max(hi, c.bar_reference);
  if (!(hi > 0)) hi = 1;
  std::vector<double> ticks = linear_ticks(0, hi);
  const double step = ticks.size() > 1 ? ticks[1] - ticks[0] : hi;
  if (ticks.empty() || ticks.back() < hi - step * 1e-9) ticks.push_back((ticks.empty() ? 0 : ticks.back()) + step);
  hi = std::max(hi, ticks.back());
  auto px = [&](double v) { return plot_left + std::clamp(v, 0.0, hi) / hi * (plot_right - plot_left); };

  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << num(total_height)
    << "\" viewBox=\"0 0 " << width << " " << num(total_height) << "\" font-family=\"Helvetica, Arial, sans-serif\">\n"
    << "<title>" << xml(c.title) << "</title>\n"
    << "<style>.t{font-size:17px;font-weight:bold}.s{font-size:12px;fill:#555}"
       ".k{font-size:11px;fill:#333}.l{font-size:12px;fill:#222}.n{font-size:11px;fill:#666}"
       ".g{stroke:#e3e3e3;stroke-width:1}.a{stroke:#444;stroke-width:1}</style>\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text class=\"t\" x=\"16\" y=\"26\">" << xml(c.title) << "</text>\n"
    << "<text class=\"s\" x=\"16\" y=\"46\">" << xml(c.subtitle) << "</text>\n";
  for (double t : ticks) {
    const double x = px(t);
    o << "<line class=\"g\" x1=\"" << num(x) << "\" x2=\"" << num(x) << "\" y1=\"" << num(plot_top)
      << "\" y2=\"" << num(plot_bottom) << "\"/>"
      << "<text class=\"k\" text-anchor=\"middle\" x=\"" << num(x) << "\" y=\"" << num(plot_bottom + 16)
      << "\">" << xml(tick_label(t)) << "</text>\n";
  }
  for (std::size_t i = 0; i < c.bars.size(); ++i) {
    const bar& b = c.bars[i];
    const double y = plot_top + 4 + bar_step * static_cast<double>(i);
    const double end = std::isfinite(b.value) ? px(b.value) : plot_left;
    const char* fill = b.emphasis ? palette[0] : palette[9];
    o << "<text class=\"l\" text-anchor=\"end\" x=\"" << num(plot_left - 8) << "\" y=\""
      << num(y + bar_height - 5) << "\">" << xml(b.name) << "</text>"
      << "<rect x=\"" << num(plot_left) << "\" y=\"" << num(y) << "\" width=\"" << num(end - plot_left)
      << "\" height=\"" << num(bar_height) << "\" fill=\"" << fill << "\"><title>" << xml(b.name) << ": "
      << xml(tick_label(b.value)) << "</title></rect>"
      << "<text class=\"k\" x=\"" << num(end + 4) << "\" y=\"" << num(y + bar_height - 5) << "\">"
      << xml(tick_label(b.value)) << "</text>\n";
  }
  if (std::isfinite(c.bar_reference)) {
    const double x = px(c.bar_reference);
    o << "<line x1=\"" << num(x) << "\" x2=\"" << num(x) << "\" y1=\"" << num(plot_top - 6) << "\" y2=\""
      << num(plot_bottom) << "\" stroke=\"#111\" stroke-width=\"1.4\" stroke-dasharray=\"5 4\"/>\n";
  }
  o << "<line class=\"a\" x1=\"" << num(plot_left) << "\" x2=\"" << num(plot_right) << "\" y1=\""
    << num(plot_bottom) << "\" y2=\"" << num(plot_bottom) << "\"/>"
    << "<line class=\"a\" x1=\"" << num(plot_left) << "\" x2=\"" << num(plot_left) << "\" y1=\""
    << num(plot_top) << "\" y2=\"" << num(plot_bottom) << "\"/>\n"
    << "<text class=\"l\" text-anchor=\"middle\" x=\"" << num((plot_left + plot_right) / 2) << "\" y=\""
    << num(plot_bottom + 38) << "\">" << xml(c.x_label) << "</text>\n";
  for (std::size_t i = 0; i < c.notes.size(); ++i) {
    o << "<text class=\"n\" x=\"16\" y=\""
      << num(total_height - 10 - note_line * static_cast<double>(c.notes.size() - 1 - i)) << "\">"
      << xml(c.notes[i]) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace

std::string render_svg(const chart& c) {
  if (!c.bars.empty()) return render_bars(c);
  // Data ranges, in axis units (log2 of the value on a log axis).
  range xr, yr;
  for (const series& s : c.lines) {
    for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!usable(s.x[i], c.x_scale) || !usable(s.y[i], c.y_scale)) continue;
      xr.add(transform(s.x[i], c.x_scale));
      yr.add(transform(s.y[i], c.y_scale));
    }
  }
  for (const auto& [x, label] : c.x_ticks) {
    if (usable(x, c.x_scale)) xr.add(transform(x, c.x_scale));
  }
  const bool no_data = xr.empty() || yr.empty();
  if (no_data) {
    xr = {0, 1};
    yr = {0, 1};
  }
  if (c.y_scale == axis_scale::linear && c.y_from_zero) yr.add(0);
  if (xr.hi - xr.lo <= 0) {
    xr.lo -= 0.5;
    xr.hi += 0.5;
  }
  if (yr.hi - yr.lo <= 0) {
    const double pad = yr.hi == 0 ? 1 : std::abs(yr.hi) * 0.1;
    yr.lo = c.y_scale == axis_scale::linear && c.y_from_zero ? yr.lo : yr.lo - pad;
    yr.hi += pad;
  }
  // Y ticks first: a linear axis is stretched to whole ticks.
  std::vector<double> yticks;
  if (c.y_scale == axis_scale::linear) {
    yticks = linear_ticks(yr.lo, yr.hi);
    const double step = yticks.size() > 1 ? yticks[1] - yticks[0] : 1;
    if (!yticks.empty() && yticks.back() < yr.hi - step * 1e-9) yticks.push_back(yticks.back() + step);
    if (!yticks.empty()) yr.hi = std::max(yr.hi, yticks.back());
  } else if (c.y_scale == axis_scale::log2) {
    yr.lo = std::floor(yr.lo);
    yr.hi = std::ceil(yr.hi);
    if (yr.hi <= yr.lo) yr.hi = yr.lo + 1;
    yticks = log2_ticks(yr.lo, yr.hi);
  } else {
    // Whole decades, or the 1-2-5 steps around a narrow range.
    const double lo = std::floor(yr.lo * 3) / 3, hi = std::ceil(yr.hi * 3) / 3;
    yr.lo = hi - lo < 1 ? lo : std::floor(yr.lo);
    yr.hi = hi - lo < 1 ? hi : std::ceil(yr.hi);
    if (yr.hi <= yr.lo) yr.hi = yr.lo + 1;
    yticks = log10_ticks(yr.lo, yr.hi);
  }
  // A little air left and right of the first and last points.
  const double xpad = (xr.hi - xr.lo) * 0.03;
  xr.lo -= xpad;
  xr.hi += xpad;

  const double notes_height = note_line * static_cast<double>(c.notes.size());
  const double plot_left = margin_left, plot_top = margin_top;
  const double plot_right = width - legend_width - margin_right;
  const double plot_bottom = height - 56 - notes_height;
  auto px = [&](double v) {
    return plot_left + (transform(v, c.x_scale) - xr.lo) / (xr.hi - xr.lo) * (plot_right - plot_left);
  };
  auto py = [&](double v) {
    return plot_bottom - (transform(v, c.y_scale) - yr.lo) / (yr.hi - yr.lo) * (plot_bottom - plot_top);
  };

  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" viewBox=\"0 0 " << width << " " << height << "\" font-family=\"Helvetica, Arial, sans-serif\">\n"
    << "<title>" << xml(c.title) << "</title>\n"
    << "<style>.t{font-size:17px;font-weight:bold}.s{font-size:12px;fill:#555}"
       ".k{font-size:11px;fill:#333}.l{font-size:12px;fill:#222}.n{font-size:11px;fill:#666}"
       ".g{stroke:#e3e3e3;stroke-width:1}.a{stroke:#444;stroke-width:1}</style>\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text class=\"t\" x=\"" << plot_left << "\" y=\"26\">" << xml(c.title) << "</text>\n"
    << "<text class=\"s\" x=\"" << plot_left << "\" y=\"46\">" << xml(c.subtitle) << "</text>\n";

  // Grid and ticks.
  for (double t : yticks) {
    const double y = py(t);
    o << "<line class=\"g\" x1=\"" << num(plot_left) << "\" x2=\"" << num(plot_right) << "\" y1=\""
      << num(y) << "\" y2=\"" << num(y) << "\"/>"
      << "<text class=\"k\" text-anchor=\"end\" x=\"" << num(plot_left - 6) << "\" y=\"" << num(y + 4)
      << "\">" << xml(tick_label(t)) << "</text>\n";
  }
  std::vector<std::pair<double, std::string>> xticks = c.x_ticks;
  if (xticks.empty()) {
    const bool log = c.x_scale != axis_scale::linear;
    const double lo = log ? xr.lo : xr.lo + xpad;
    const double hi = log ? xr.hi : xr.hi - xpad;
    const std::vector<double> ticks = c.x_scale == axis_scale::log2    ? log2_ticks(lo, hi)
                                      : c.x_scale == axis_scale::log10 ? log10_ticks(lo, hi)
                                                                       : linear_ticks(lo, hi);
    for (double t : ticks) {
      xticks.emplace_back(t, tick_label(t));
    }
  }
  for (const auto& [t, label] : xticks) {
    if (!usable(t, c.x_scale)) continue;
    const double x = px(t);
    if (x < plot_left - 0.5 || x > plot_right + 0.5) continue;
    o << "<line class=\"g\" x1=\"" << num(x) << "\" x2=\"" << num(x) << "\" y1=\"" << num(plot_top)
      << "\" y2=\"" << num(plot_bottom) << "\"/>"
      << "<text class=\"k\" text-anchor=\"middle\" x=\"" << num(x) << "\" y=\"" << num(plot_bottom + 16)
      << "\">" << xml(label) << "</text>\n";
  }
  o << "<line class=\"a\" x1=\"" << num(plot_left) << "\" x2=\"" << num(plot_right) << "\" y1=\""
    << num(plot_bottom) << "\" y2=\"" << num(plot_bottom) << "\"/>"
    << "<line class=\"a\" x1=\"" << num(plot_left) << "\" x2=\"" << num(plot_left) << "\" y1=\""
    << num(plot_top) << "\" y2=\"" << num(plot_bottom) << "\"/>\n";
  o << "<text class=\"l\" text-anchor=\"middle\" x=\"" << num((plot_left + plot_right) / 2) << "\" y=\""
    << num(plot_bottom + 38) << "\">" << xml(c.x_label) << "</text>\n"
    << "<text class=\"l\" text-anchor=\"middle\" transform=\"translate(22 "
    << num((plot_top + plot_bottom) / 2) << ") rotate(-90)\">" << xml(c.y_label) << "</text>\n";
  if (no_data) {
    o << "<text class=\"l\" text-anchor=\"middle\" x=\"" << num((plot_left + plot_right) / 2)
      << "\" y=\"" << num((plot_top + plot_bottom) / 2) << "\">no data</text>\n";
  }

  // The lines, then the legend in the same order.
  std::size_t colour = 0;
  struct key {
    std::string name, stroke, dash;
    double weight;
  };
  std::vector<key> keys;
  for (const series& s : c.lines) {
    // The reference is drawn dashed, over lines that may follow it exactly.
    std::string stroke = "#111", dash = "5 4";
    double weight = 1.6;
    if (s.look != series::style::reference) {
      stroke = palette[colour % std::size(palette)];
      dash = dashes[(colour / std::size(palette)) % std::size(dashes)];
      weight = s.look == series::style::emphasis ? 2.6 : 1.6;
      ++colour;
    }
    keys.push_back({s.name, stroke, dash, weight});
    std::ostringstream pts;
    std::size_t n = 0;
    for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!usable(s.x[i], c.x_scale) || !usable(s.y[i], c.y_scale)) continue;
      pts << (n++ ? " " : "") << num(px(s.x[i])) << "," << num(py(s.y[i]));
    }
    if (n == 0) continue;
    o << "<g><title>" << xml(s.name) << "</title><polyline fill=\"none\" stroke=\"" << stroke
      << "\" stroke-width=\"" << weight << "\" stroke-linejoin=\"round\""
      << (dash.empty() ? "" : " stroke-dasharray=\"" + dash + "\"") << " points=\"" << pts.str()
      << "\"/>";
    if (n <= 24) {  // few points: mark them
      for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
        if (!usable(s.x[i], c.x_scale) || !usable(s.y[i], c.y_scale)) continue;
        o << "<circle cx=\"" << num(px(s.x[i])) << "\" cy=\"" << num(py(s.y[i])) << "\" r=\"3\" fill=\""
          << stroke << "\"><title>" << xml(s.name) << ": " << xml(tick_label(s.y[i])) << "</title></circle>";
      }
    }
    o << "</g>\n";
  }
  const double legend_x = plot_right + 24;
  const double row =
      std::min(20.0, (plot_bottom - plot_top) / static_cast<double>(std::max<std::size_t>(keys.size(), 1)));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const double y = plot_top + 6 + row * static_cast<double>(i);
    o << "<line x1=\"" << num(legend_x) << "\" x2=\"" << num(legend_x + 26) << "\" y1=\"" << num(y)
      << "\" y2=\"" << num(y) << "\" stroke=\"" << keys[i].stroke << "\" stroke-width=\""
      << keys[i].weight << "\"" << (keys[i].dash.empty() ? "" : " stroke-dasharray=\"" + keys[i].dash + "\"")
      << "/><text class=\"k\" x=\"" << num(legend_x + 32) << "\" y=\"" << num(y + 4) << "\">"
      << xml(keys[i].name) << "</text>\n";
  }
  for (std::size_t i = 0; i < c.notes.size(); ++i) {
    o << "<text class=\"n\" x=\"" << num(plot_left) << "\" y=\""
      << num(height - 10 - note_line * static_cast<double>(c.notes.size() - 1 - i)) << "\">"
      << xml(c.notes[i]) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

std::vector<series> lines_over_columns(const workload_result& result,
                                       std::span<const std::size_t> columns,
                                       std::span<const double> x) {
  std::vector<series> out;
  for (const auto& row : result.rows) {
    series s;
    s.name = std::string(row.s->name);
    s.look = row.s->kind == subject_kind::gpumem ? series::style::emphasis : series::style::plain;
    for (std::size_t i = 0; i < columns.size() && i < x.size(); ++i) {
      const cell& c = row.cells[columns[i]];
      if (c.status != cell_status::ok || c.reps.empty()) continue;
      s.x.push_back(x[i]);
      s.y.push_back(c.median());
    }
    if (!s.x.empty()) out.push_back(std::move(s));
  }
  return out;
}

std::vector<std::filesystem::path> write_charts(const std::filesystem::path& dir,
                                                const std::vector<chart>& charts) {
  std::vector<std::filesystem::path> written;
  if (charts.empty()) return written;
  std::filesystem::create_directories(dir);
  for (const chart& c : charts) {
    const std::filesystem::path path = dir / c.file;
    std::ofstream out(path);
    out << render_svg(c);
    out.close();
    if (!out) throw std::runtime_error("cannot write " + path.string());
    written.push_back(path);
  }
  return written;
}

std::string file_safe(const std::string& text) {
  std::string out;
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    out += std::isalnum(c) || ch == '-' || ch == '.' || ch == '_' ? ch : '-';
  }
  return out;
}

}  // namespace gpumem::bench
