// The run header, the tables and the JSON file of gpumem-bench (report.hpp).
#include "report.hpp"

#include <cmath>
#include <cstdio>
#include <string_view>

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

// Three significant figures or more: 4.04, 63.5, 208, 56,895.
std::string format_figure(double v) {
  if (std::abs(v) >= 999.5) return with_thousands(std::llround(v));
  char buf[32];
  std::snprintf(buf, sizeof buf,
                std::abs(v) >= 99.95   ? "%.0f"
                : std::abs(v) >= 9.995 ? "%.1f"
                                       : "%.2f",
                v);
  return buf;
}

std::string format_ratio(double r) {
  if (r >= 99.5) return with_thousands(std::llround(r)) + "x";
  char buf[32];
  std::snprintf(buf, sizeof buf, r >= 9.995 ? "%.1fx" : "%.2fx", r);
  return buf;
}

std::string format_bytes(std::size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024 * 1024));
  return buf;
}

std::string cuda_version_text(int v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

std::string_view kind_name(subject_kind k) { return k == subject_kind::peer ? "peer" : "gpumem"; }

std::string_view status_name(cell_status s) {
  switch (s) {
    case cell_status::ok:
      return "ok";
    case cell_status::failed:
      return "failed";
    default:
      return "error";
  }
}

std::string pad(const std::string& s, std::size_t width, bool right) {
  if (s.size() >= width) return s;
  const std::string fill(width - s.size(), ' ');
  return right ? fill + s : s + fill;
}

// ---- JSON: a writer just big enough for this file ----

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

}  // namespace

std::optional<std::size_t> best_peer(const workload_result& result, std::size_t col) {
  std::optional<std::size_t> best;
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
  return c.median() / b;
}

void print_header(std::ostream& out, const run_info& info) {
  out << "gpumem-bench " << info.gpumem_version << "  backend " << info.backend << "\n"
      << "device " << info.device << ": " << info.device_name << ", "
      << format_bytes(info.total_bytes) << "; CUDA driver "
      << cuda_version_text(info.driver_version) << " (" << info.driver_version << ")"
      << (info.kernel_driver.empty() ? "" : ", NVIDIA driver " + info.kernel_driver)
      << "; built against cuda.h " << cuda_version_text(info.cuda_header_version) << "\n"
      << "started " << info.started_utc << "; " << info.host_threads << " host threads\n\n";
}

void print_table(std::ostream& out, const run_info& info, const options& opts,
                 const workload_result& result) {
  const workload& w = *result.w;
  std::vector<std::string> footnotes;

  // Text of every cell first, so the columns can be sized to fit.
  std::vector<std::vector<std::string>> text(result.rows.size());
  for (std::size_t r = 0; r < result.rows.size(); ++r) {
    const auto& row = result.rows[r];
    for (std::size_t col = 0; col < result.columns.size(); ++col) {
      const cell& c = row.cells[col];
      if (c.status != cell_status::ok) {
        footnotes.push_back(std::string(row.s->name) + ", " + result.columns[col].label + ": " +
                            c.message);
        text[r].push_back(std::string(status_name(c.status)) + " [" +
                          std::to_string(footnotes.size()) + "]");
        continue;
      }
      std::string t = format_figure(c.median()) + " " + result.columns[col].unit;
      if (const auto ratio = ratio_to_best_peer(result, r, col))
        t += " (" + format_ratio(*ratio) + ")";
      text[r].push_back(std::move(t));
    }
  }

  std::size_t name_width = std::string_view("subject").size();
  for (const auto& row : result.rows) {
    name_width =
        std::max(name_width, row.s->name.size() + (row.s->kind == subject_kind::peer ? 7 : 0));
  }
  std::vector<std::size_t> widths;
  for (std::size_t col = 0; col < result.columns.size(); ++col) {
    std::size_t width = result.columns[col].label.size();
    for (const auto& row_text : text) width = std::max(width, row_text[col].size());
    widths.push_back(width);
  }

  out << w.id() << " " << w.name() << " on " << info.device_name << " (" << info.backend << ")\n";
  out << pad("subject", name_width, false);
  for (std::size_t col = 0; col < widths.size(); ++col) {
    out << " | " << pad(result.columns[col].label, widths[col], true);
  }
  out << "\n";
  std::size_t rule = name_width;
  for (std::size_t width : widths) rule += 3 + width;
  out << std::string(rule, '-') << "\n";
  for (std::size_t r = 0; r < result.rows.size(); ++r) {
    const subject& s = *result.rows[r].s;
    const std::string name = std::string(s.name) + (s.kind == subject_kind::peer ? " (peer)" : "");
    out << pad(name, name_width, false);
    for (std::size_t col = 0; col < widths.size(); ++col)
      out << " | " << pad(text[r][col], widths[col], true);
    out << "\n";
  }

  bool all_lower = true;
  for (const column& c : result.columns) all_lower = all_lower && c.lower_is_better;
  out << "figure: " << w.figure() << ", median of " << opts.reps << " repetition"
      << (opts.reps == 1 ? "" : "s") << " after a warm-up (host steady_clock)"
      << (opts.quick ? "; --quick run" : "") << "\n"
      << "(x): figure / the best peer's in the column; "
      << (all_lower ? "below 1 is faster than the best peer"
                    : "above 1 is better than the best peer")
      << "\n";
  for (std::size_t i = 0; i < footnotes.size(); ++i) {
    out << "[" << i + 1 << "] " << footnotes[i] << "\n";
  }
  out << "\n";
}

void write_json(std::ostream& out, const run_info& info, const options& opts,
                const std::vector<workload_result>& results) {
  out << "{\n"
      << "  \"tool\": \"gpumem-bench\",\n"
      << "  \"gpumem_version\": " << json_string(info.gpumem_version) << ",\n"
      << "  \"backend\": " << json_string(info.backend) << ",\n"
      << "  \"device\": {\"index\": " << info.device
      << ", \"name\": " << json_string(info.device_name)
      << ", \"total_bytes\": " << info.total_bytes << "},\n"
      << "  \"driver_version\": " << info.driver_version << ",\n"
      << "  \"kernel_driver\": "
      << (info.kernel_driver.empty() ? std::string("null") : json_string(info.kernel_driver))
      << ",\n"
      << "  \"cuda_header_version\": " << info.cuda_header_version << ",\n"
      << "  \"started_utc\": " << json_string(info.started_utc) << ",\n"
      << "  \"host_threads\": " << info.host_threads << ",\n"
      << "  \"options\": {\"reps\": " << opts.reps
      << ", \"quick\": " << (opts.quick ? "true" : "false")
      << ", \"rep_seconds\": " << json_number(opts.rep_seconds) << "},\n"
      << "  \"workloads\": [";
  for (std::size_t wi = 0; wi < results.size(); ++wi) {
    const workload_result& res = results[wi];
    out << (wi ? "," : "") << "\n    {\"id\": " << json_string(res.w->id())
        << ", \"name\": " << json_string(res.w->name())
        << ", \"figure\": " << json_string(res.w->figure()) << ",\n     \"columns\": [";
    for (std::size_t col = 0; col < res.columns.size(); ++col) {
      const column& c = res.columns[col];
      const auto best = best_peer(res, col);
      out << (col ? ", " : "") << "{\"variant\": " << json_string(c.label)
          << ", \"unit\": " << json_string(c.unit)
          << ", \"lower_is_better\": " << (c.lower_is_better ? "true" : "false")
          << ", \"best_peer\": " << (best ? json_string(res.rows[*best].s->name) : "null") << "}";
    }
    out << "],\n     \"subjects\": [";
    for (std::size_t r = 0; r < res.rows.size(); ++r) {
      const auto& row = res.rows[r];
      out << (r ? "," : "") << "\n      {\"name\": " << json_string(row.s->name)
          << ", \"kind\": " << json_string(kind_name(row.s->kind)) << ", \"results\": [";
      for (std::size_t col = 0; col < row.cells.size(); ++col) {
        const cell& c = row.cells[col];
        out << (col ? "," : "") << "\n        {\"variant\": " << json_string(res.columns[col].label)
            << ", \"status\": " << json_string(status_name(c.status));
        if (c.status != cell_status::ok) {
          out << ", \"message\": " << json_string(c.message) << "}";
          continue;
        }
        const auto ratio = ratio_to_best_peer(res, r, col);
        out << ", \"unit\": " << json_string(res.columns[col].unit)
            << ", \"median\": " << json_number(c.median()) << ", \"min\": " << json_number(c.min())
            << ", \"max\": " << json_number(c.max()) << ", \"iterations\": " << c.iterations
            << ", \"ratio_to_best_peer\": " << (ratio ? json_number(*ratio) : "null")
            << ", \"reps\": [";
        for (std::size_t i = 0; i < c.reps.size(); ++i)
          out << (i ? ", " : "") << json_number(c.reps[i]);
        out << "]}";
      }
      out << "]}";
    }
    out << "]}";
  }
  out << "\n  ]\n}\n";
}

}  // namespace gpumem::bench
