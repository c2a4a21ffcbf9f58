// The run header, the tables and the JSON file of gpumem-bench (report.hpp).
#include "report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

namespace gpumem::bench {
namespace {

std::string with_thousands(long long v) {
  std::string digits = std::to_string(v < 0 ? -v : v);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string format_bytes(std::size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024 * 1024));
  return buf;
}

std::string cuda_version_text(int v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

std::string_view kind_name(subject_kind k) {
  switch (k) {
    case subject_kind::peer:
      return "peer";
    case subject_kind::reference:
      return "reference";
    default:
      return "gpumem";
  }
}

std::string_view status_name(cell_status s) {
  switch (s) {
    case cell_status::ok:
      return "ok";
    case cell_status::failed:
      return "failed";
    case cell_status::skipped:
      return "skipped";
    default:
      return "error";
  }
}

// A row's name in the tables: peers are marked; a reference row says so in its name.
std::string row_name(const subject& s) {
  return std::string(s.name) + (s.kind == subject_kind::peer ? " (peer)" : "");
}

// A figure with its unit: "63.5 ns", "4.04 Mops/s", "0.833"; ratios ("x") as ratios.
std::string figure_text(double v, const std::string& unit) {
  if (unit == "x") return format_ratio(v);
  if (unit == "failed") return with_thousands(std::llround(v)) + " failed";  // a count (W5)
  return unit.empty() ? format_figure(v) : format_figure(v) + " " + unit;
}

std::string pad(const std::string& s, std::size_t width, bool right) {
  if (s.size() >= width) return s;
  const std::string fill(width - s.size(), ' ');
  return right ? fill + s : s + fill;
}

}  // namespace

std::string format_figure(double v) {
  const double a = std::abs(v);
  if (a >= 999.5) return with_thousands(std::llround(v));
  char buf[32];
  std::snprintf(buf, sizeof buf,
                a >= 99.95    ? "%.0f"
                : a >= 9.995  ? "%.1f"
                : a >= 0.9995 ? "%.2f"
                : a >= 0.01   ? "%.3f"
                              : "%.2g",
                v);
  return buf;
}

std::string format_ratio(double r) {
  if (r >= 99.5) return with_thousands(std::llround(r)) + "x";
  char buf[32];
  std::snprintf(buf, sizeof buf, r >= 9.995 ? "%.1fx" : "%.2fx", r);
  return buf;
}

std::optional<std::size_t> best_peer(const workload_result& result, std::size_t col) {
  std::optional<std::size_t> best;
  if (result.columns[col].derived) return best;
  const bool lower = result.columns[col].lower_is_better;
  for (std::size_t r = 0; r < result.rows.size(); ++r) {
    const auto& row = result.rows[r];
    const cell& c = row.cells[col];
    if (row.s->kind != subject_kind::peer || c.status != cell_status::ok || c.reps.empty())
      continue;
    if (!best) {
      best = r;
      continue;
    }
    const double b = result.rows[*best].cells[col].median();
    if (lower ? c.median() < b : c.median() > b) best = r;
  }
  return best;
}

std::optional<double> ratio_to_best_peer(const workload_result& result, std::size_t row,
                                         std::size_t col) {
  const cell& c = result.rows[row].cells[col];
  const auto best = best_peer(result, col);
  if (!best || c.status != cell_status::ok || c.reps.empty()) return std::nullopt;
  const double b = result.rows[*best].cells[col].median();
  if (b <= 0) return std::nullopt;
  if (result.columns[col].lower_is_better) return c.median() / b;
  // Higher is better (a throughput, a fraction): inverted, so below 1 stays better.
  if (c.median() <= 0) return std::nullopt;
  return b / c.median();
}

void print_verdict(std::ostream& out, const std::vector<workload_result>& results) {
  out << "verdict: " << default_subject_name
      << " against the best peer of each column (below 1: better; the tables above have the figures)\n";
  bool any = false;
  for (const workload_result& res : results) {
    std::size_t row = res.rows.size();
    for (std::size_t r = 0; r < res.rows.size(); ++r) {
      if (res.rows[r].s->name == default_subject_name) row = r;
    }
    if (row == res.rows.size()) continue;
    // One line per table: W5's groups are tables of their own.
    std::vector<std::string> groups;
    for (const column& c : res.columns) {
      if (std::find(groups.begin(), groups.end(), c.group) == groups.end()) groups.push_back(c.group);
    }
    for (const std::string& group : groups) {
      std::string cells;
      std::size_t better = 0, compared = 0;
      for (std::size_t col = 0; col < res.columns.size(); ++col) {
        if (res.columns[col].group != group) continue;
        const auto ratio = ratio_to_best_peer(res, row, col);
        if (!ratio) continue;
        ++compared;
        better += *ratio < 1.0;
        cells += (cells.empty() ? "" : ", ") + res.columns[col].label + " " + format_ratio(*ratio);
      }
      if (compared == 0) continue;
      any = true;
      out << "  " << res.w->id() << " " << res.w->name() << (group.empty() ? "" : ", " + group) << ": better in "
          << better << " of " << compared << " (" << cells << ")\n";
    }
  }
  if (!any) out << "  no column had both " << default_subject_name << " and a peer measured\n";
}

void print_header(std::ostream& out, const run_info& info) {
  out << "gpumem-bench " << info.gpumem_version << "  backend " << info.backend << "\n"
      << "device " << info.device << ": " << info.device_name << ", "
      << format_bytes(info.total_bytes) << "; CUDA driver "
      << cuda_version_text(info.driver_version) << " (" << info.driver_version << ")"
      << (info.kernel_driver.empty() ? "" : ", NVIDIA driver " + info.kernel_driver)
      << "; built against cuda.h " << cuda_version_text(info.cuda_header_version) << "\n"
      << "started " << info.started_utc << "; " << info.host_threads << " host threads\n";
  if (!info.peer_libraries.empty()) {
    out << "peer libraries:";
    for (std::size_t i = 0; i < info.peer_libraries.size(); ++i)
      out << (i ? "; " : " ") << info.peer_libraries[i];
    out << "\n";
  }
  // Rows left out, one line per reason.
  std::vector<std::pair<std::string, std::string>> by_reason;  // reason, rows
  for (const auto& left_out : info.not_measured) {
    const std::string& row = left_out.first;
    const std::string& why = left_out.second;
    auto it = std::find_if(by_reason.begin(), by_reason.end(),
                           [&](const auto& r) { return r.first == why; });
    if (it == by_reason.end()) {
      by_reason.emplace_back(why, row);
    } else {
      it->second += ", " + row;
    }
  }
  for (const auto& [why, rows] : by_reason) out << "not measured: " << rows << " (" << why << ")\n";
  out << "\n";
}

namespace {

// One table: `result` holds the columns of one group (all of them for most
// workloads); `title` follows the workload's id and name; the workload's notes
// are printed when `with_notes`.
void print_one_table(std::ostream& out, const run_info& info, const options& opts,
                     const workload_result& result, const std::string& title, bool with_notes) {
  const workload& w = *result.w;
  std::vector<std::string> footnotes;

  // Text of every cell first, so the columns can be sized to fit.
  std::vector<std::vector<std::string>> text(result.rows.size());
  for (std::size_t r = 0; r < result.rows.size(); ++r) {
    const auto& row = result.rows[r];
    // One footnote per reason in a row: a row skipped as a whole, or failing the
    // same way in several columns, says so once.
    std::vector<std::pair<std::string, std::size_t>> notes_of_row;  // message, footnote number
    auto footnote = [&](const cell& c) {
      const std::string key = std::string(status_name(c.status)) + ": " + c.message;
      for (const auto& [k, n] : notes_of_row) {
        if (k == key) return n;
      }
      std::string where;
      for (std::size_t col = 0; col < result.columns.size(); ++col) {
        const cell& other = row.cells[col];
        if (other.status == c.status && other.message == c.message) {
          where += ", " + result.columns[col].label;
        }
      }
      const bool whole_row = std::all_of(row.cells.begin(), row.cells.end(), [&](const cell& o) {
        return o.status == c.status && o.message == c.message;
      });
      footnotes.push_back(std::string(row.s->name) + (whole_row ? "" : where) + ": " + c.message);
      notes_of_row.emplace_back(key, footnotes.size());
      return footnotes.size();
    };
    for (std::size_t col = 0; col < result.columns.size(); ++col) {
      const cell& c = row.cells[col];
      const std::string& unit = result.columns[col].unit;
      if (c.status != cell_status::ok && result.columns[col].derived &&
          std::none_of(row.cells.begin(), row.cells.end(), [&](const cell& o) {
            return &o != &c && o.status == c.status && o.message == c.message;
          })) {
        // A derived figure that lacks an input: the input's own cell has the footnote.
        text[r].push_back("n/a");
        continue;
      }
      if (c.status != cell_status::ok) {
        const std::string mark = " [" + std::to_string(footnote(c)) + "]";
        // A timed failure (W4's OOM) shows how long failing took.
        text[r].push_back(!c.outcome.empty() && !c.reps.empty()
                              ? c.outcome + " " + figure_text(c.median(), unit) + mark
                              : std::string(status_name(c.status)) + mark);
        continue;
      }
      std::string t = figure_text(c.median(), unit);
      if (const auto ratio = ratio_to_best_peer(result, r, col))
        t += " (" + format_ratio(*ratio) + ")";
      text[r].push_back(std::move(t));
    }
  }

  std::size_t name_width = std::string_view("subject").size();
  for (const auto& row : result.rows) name_width = std::max(name_width, row_name(*row.s).size());
  std::vector<std::size_t> widths;
  for (std::size_t col = 0; col < result.columns.size(); ++col) {
    std::size_t width = result.columns[col].label.size();
    for (const auto& row_text : text) width = std::max(width, row_text[col].size());
    widths.push_back(width);
  }

  out << w.id() << " " << w.name() << (title.empty() ? "" : ": " + title) << " on "
      << info.device_name << " (" << info.backend << ")\n";
  out << pad("subject", name_width, false);
  for (std::size_t col = 0; col < widths.size(); ++col) {
    out << " | " << pad(result.columns[col].label, widths[col], true);
  }
  out << "\n";
  std::size_t rule = name_width;
  for (std::size_t width : widths) rule += 3 + width;
  out << std::string(rule, '-') << "\n";
  for (std::size_t r = 0; r < result.rows.size(); ++r) {
    out << pad(row_name(*result.rows[r].s), name_width, false);
    for (std::size_t col = 0; col < widths.size(); ++col)
      out << " | " << pad(text[r][col], widths[col], true);
    out << "\n";
  }

  // Which way the ratios were taken: below 1 is better than the best peer in
  // every column, whichever way its figure points.
  std::string lower, higher;
  for (const column& c : result.columns) {
    if (c.derived) continue;
    std::string& list = c.lower_is_better ? lower : higher;
    list += (list.empty() ? "" : ", ") + c.label;
  }
  out << "figure: " << w.figure() << "; " << w.method(opts);
  if (opts.rounds > 1) {
    out << "; in " << opts.rounds << " rounds over the rows, the figure over every round's repetitions";
  }
  out << (opts.quick ? "; --quick run" : "") << "\n";
  if (higher.empty()) {
    out << "(x): figure / the best peer's in the column; below 1 is faster than the best peer\n";
  } else if (lower.empty()) {
    out << "(x): the best peer's figure / this one (higher is better here, so the ratio is "
           "inverted); below 1 is better than the best peer\n";
  } else {
    out << "(x): figure / the best peer's in " << lower << "; the best peer's / figure in "
        << higher << " (higher is better there); below 1 is better than the best peer in "
        << "all columns\n";
  }
  // Cells whose repetitions were cut to fit --cell-budget-s, or that a later
  // round skipped once the run reached --time-limit-s.
  std::string cut;
  for (const auto& row : result.rows) {
    for (std::size_t col = 0; col < result.columns.size(); ++col) {
      const cell& c = row.cells[col];
      if (!c.cut_by_budget) continue;
      cut += (cut.empty() ? "" : ", ") + std::string(row.s->name) + " " + result.columns[col].label +
             " (" + std::to_string(c.reps.size()) + ")";
    }
  }
  if (!cut.empty()) {
    std::string bounds;
    if (opts.cell_budget_seconds > 0) bounds = "--cell-budget-s " + std::to_string(std::llround(opts.cell_budget_seconds));
    if (opts.time_limit_seconds > 0) {
      bounds += (bounds.empty() ? "" : " and ") + std::string("--time-limit-s ") +
                std::to_string(std::llround(opts.time_limit_seconds));
    }
    out << "fewer repetitions, to fit " << bounds << ": " << cut << "\n";
  }
  if (with_notes) {
    for (const std::string& note : w.notes(result)) out << note << "\n";
  }
  for (std::size_t i = 0; i < footnotes.size(); ++i) {
    out << "[" << i + 1 << "] " << footnotes[i] << "\n";
  }
  out << "\n";
}

}  // namespace

void print_table(std::ostream& out, const run_info& info, const options& opts,
                 const workload_result& result) {
  std::vector<std::string> groups;
  for (const column& c : result.columns) {
    if (std::find(groups.begin(), groups.end(), c.group) == groups.end()) groups.push_back(c.group);
  }
  if (groups.size() <= 1) {
    print_one_table(out, info, opts, result, groups.empty() ? "" : groups.front(), true);
    return;
  }
  // One table per group, the workload's notes under the last.
  for (std::size_t g = 0; g < groups.size(); ++g) {
    workload_result part;
    part.w = result.w;
    std::vector<std::size_t> cols;
    for (std::size_t col = 0; col < result.columns.size(); ++col) {
      if (result.columns[col].group != groups[g]) continue;
      cols.push_back(col);
      part.columns.push_back(result.columns[col]);
    }
    for (const auto& row : result.rows) {
      workload_result::row r{row.s, {}};
      for (std::size_t col : cols) r.cells.push_back(row.cells[col]);
      part.rows.push_back(std::move(r));
    }
    print_one_table(out, info, opts, part, groups[g], g + 1 == groups.size());
  }
}

// ---- the JSON file ----------------------------------------------------------
// Keys in the order written here (ordered_json); numbers that are not finite are
// written as null; strings are escaped, and bytes that are not UTF-8 (a device or
// file name) are replaced rather than failing the write.

namespace {

using json = nlohmann::ordered_json;

json number_or_null(std::optional<double> v) { return v ? json(*v) : json(nullptr); }

json cell_json(const workload_result& res, std::size_t r, std::size_t col) {
  const cell& c = res.rows[r].cells[col];
  json out;
  out["variant"] = res.columns[col].label;
  out["status"] = std::string(status_name(c.status));
  if (c.status != cell_status::ok) {
    out["message"] = c.message;
    if (c.outcome.empty() || c.reps.empty()) return out;
    out["outcome"] = c.outcome;  // and the time it took, below
  }
  out["unit"] = res.columns[col].unit;
  out["median"] = c.median();
  out["min"] = c.min();
  out["max"] = c.max();
  out["iterations"] = c.iterations;
  out["ratio_to_best_peer"] = number_or_null(ratio_to_best_peer(res, r, col));
  out["reps"] = c.reps;
  if (c.cut_by_budget) out["cut_by_budget"] = true;
  if (!c.curves.empty()) {
    json curves = json::array();
    for (const series& cv : c.curves) curves.push_back(json{{"name", cv.name}, {"x", cv.x}, {"y", cv.y}});
    out["curves"] = std::move(curves);
  }
  return out;
}

json workload_json(const options& opts, const workload_result& res) {
  json out;
  out["id"] = std::string(res.w->id());
  out["name"] = std::string(res.w->name());
  out["figure"] = std::string(res.w->figure());
  out["method"] = res.w->method(opts);
  out["notes"] = res.w->notes(res);
  json columns = json::array();
  for (std::size_t col = 0; col < res.columns.size(); ++col) {
    const column& c = res.columns[col];
    const auto best = best_peer(res, col);
    columns.push_back(json{{"variant", c.label},
                           {"unit", c.unit},
                           {"lower_is_better", c.lower_is_better},
                           {"derived", c.derived},
                           {"group", c.group},
                           {"best_peer", best ? json(std::string(res.rows[*best].s->name)) : json(nullptr)}});
  }
  out["columns"] = std::move(columns);
  json subjects = json::array();
  for (std::size_t r = 0; r < res.rows.size(); ++r) {
    json results = json::array();
    for (std::size_t col = 0; col < res.rows[r].cells.size(); ++col) results.push_back(cell_json(res, r, col));
    subjects.push_back(json{{"name", std::string(res.rows[r].s->name)},
                            {"kind", std::string(kind_name(res.rows[r].s->kind))},
                            {"results", std::move(results)}});
  }
  out["subjects"] = std::move(subjects);
  return out;
}

}  // namespace

void write_json(std::ostream& out, const run_info& info, const options& opts,
                const std::vector<workload_result>& results) {
  json doc;
  doc["tool"] = "gpumem-bench";
  doc["gpumem_version"] = info.gpumem_version;
  doc["backend"] = info.backend;
  doc["device"] = json{{"index", info.device}, {"name", info.device_name}, {"total_bytes", info.total_bytes}};
  doc["driver_version"] = info.driver_version;
  doc["kernel_driver"] = info.kernel_driver.empty() ? json(nullptr) : json(info.kernel_driver);
  doc["cuda_header_version"] = info.cuda_header_version;
  doc["started_utc"] = info.started_utc;
  doc["host_threads"] = info.host_threads;
  doc["options"] = json{{"reps", opts.reps},
                        {"rounds", opts.rounds},
                        {"quick", opts.quick},
                        {"rep_seconds", opts.rep_seconds},
                        {"cell_budget_seconds", opts.cell_budget_seconds}};
  doc["peer_libraries"] = info.peer_libraries;
  json not_measured = json::array();
  for (const auto& [subject, why] : info.not_measured) {
    not_measured.push_back(json{{"subject", subject}, {"why", why}});
  }
  doc["not_measured"] = std::move(not_measured);
  json workloads = json::array();
  for (const workload_result& res : results) workloads.push_back(workload_json(opts, res));
  doc["workloads"] = std::move(workloads);
  out << doc.dump(1, ' ', false, json::error_handler_t::replace) << "\n";
}

}  // namespace gpumem::bench
