// Charts for gpumem-bench --plot DIR: self-contained SVG files, written by this
// program with no library and no script in the page, so that any browser or
// viewer opens them and they can sit in docs/ beside the tables.
//
// A workload says what to draw by overriding workload::charts(): lines over
// numeric x, one per subject (W3: throughput against threads; W6: time against
// size) or one per curve its cells recorded (W5: reserved bytes
// over a trace). lines_over_columns() builds the first kind from a table. A
// chart with bars is a horizontal bar chart, one bar per row (W8).
#pragma once

#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "bench.hpp"

namespace gpumem::bench {

// log2 for sizes and thread counts (ticks at powers of two), log10 for figures
// that span decades (ticks at 1, 2, 5 x 10^k).
enum class axis_scale { linear, log2, log10 };

// One bar of a bar chart (W8: a row's ratio).
struct bar {
  std::string name;
  double value = 0;
  bool emphasis = false;  // gpumem's rows
};

struct chart {
  std::string file;      // file name in the plot folder, e.g. "W3-threads.svg"
  std::string title;     // first line of the heading
  std::string subtitle;  // second line: device, backend, what a point is
  std::string x_label, y_label;
  axis_scale x_scale = axis_scale::linear;
  axis_scale y_scale = axis_scale::linear;
  bool y_from_zero = true;  // linear y axes start at 0 unless this is false
  // Ticks at these x values with these labels (W3: "1", "4", "16"); empty:
  // evenly spaced round numbers.
  std::vector<std::pair<double, std::string>> x_ticks;
  std::vector<series> lines;
  // A bar chart instead, when not empty: one horizontal bar per entry, top to
  // bottom, on a linear axis from 0 labelled x_label (x_scale, y_* and lines unused).
  std::vector<bar> bars;
  // Where a bar chart draws a dashed reference line (W8: 1, no interference); NaN: none.
  double bar_reference = std::numeric_limits<double>::quiet_NaN();
  std::vector<std::string> notes;  // small print under the plot
};

// The SVG text of `c` (UTF-8, one <svg> element with its own styles).
std::string render_svg(const chart& c);

// One line per subject through the medians of `columns` (ok cells only), at x
// positions `x` (same length). Rows with fewer than one ok cell are left out;
// gpumem's rows are emphasised.
std::vector<series> lines_over_columns(const workload_result& result,
                                       std::span<const std::size_t> columns,
                                       std::span<const double> x);

// Writes every chart of `charts` into `dir` (created if missing) and returns
// the paths written. Throws std::runtime_error when a file cannot be written.
std::vector<std::filesystem::path> write_charts(const std::filesystem::path& dir,
                                                const std::vector<chart>& charts);

// A file-name-safe version of `text`: letters, digits, '-', '.', '_' kept,
// anything else '-'.
std::string file_safe(const std::string& text);

}  // namespace gpumem::bench
