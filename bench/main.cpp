// gpumem-bench: measures gpumem's resources and the peers (raw driver
// allocators; RMM and PyTorch's caching allocator from plugins) on the standard workloads of
// docs/benchmarks-method.md, in one run, and prints each figure beside its ratio to the
// best peer. docs/benchmarks-method.md says how it measures.
//
// Exit status: 0 success (a row that ran out of memory or hit a driver error is
// a result, reported as failed); 1 a workload errored unexpectedly or the
// device could not be used; 2 bad arguments.
#include <cuda.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench.hpp"
#include "cli/command_line.hpp"
#include "gpumem/backend.hpp"
#include "harness.hpp"
#include "gpumem/device.hpp"
#include "peers/plugin_peers.hpp"
#include "plot.hpp"
#include "report.hpp"

namespace gpumem::bench {
namespace {

constexpr int exit_ok = 0;
constexpr int exit_failure = 1;
constexpr int quick_cell_budget_seconds = 3;  // --quick without --cell-budget-s

struct usage_error {
  std::string message;
};

// The command line (tools/cli/command_line.hpp: --opt value or --opt=value, --help,
// --version, exit status 2 for a usage error).
constexpr const char* description =
    "Measures gpumem's resources and peer allocators on the standard workloads\n"
    "(docs/benchmarks-method.md, Workloads) on device 0 and prints one table per\n"
    "workload: each cell is the median over the repetitions and, in parentheses, its\n"
    "ratio to the best peer in that column, taken so that below 1 is better than the\n"
    "best peer in every column (inverted where higher is better, as ops/s). Progress\n"
    "goes to stderr (a line per row on a terminal, per workload otherwise); a verdict\n"
    "closes the run.";
constexpr const char* epilog =
    "environment: GPUMEM_BACKEND=cuda|sim chooses the backend; unset, gpumem-bench uses\n"
    "the CUDA driver when a GPU is usable and the host simulator otherwise.\n"
    "exit status: 0 ok (rows that ran out of memory are reported, not fatal),\n"
    "1 a workload errored unexpectedly, 2 bad arguments.";

void print_list(std::ostream& out) {
  out << "workloads:\n";
  for (const workload* w : all_workloads()) {
    out << "  " << w->id() << "  " << w->name() << ": " << w->figure() << "\n";
  }
  out << "subjects:\n";
  for (const subject& s : all_subjects()) {
    // A reference row's name says that it is one.
    out << "  " << s.name << (s.kind == subject_kind::peer ? "  (peer)" : "") << "\n";
  }
}

bool iequals(std::string_view a, std::string_view b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    return std::tolower(static_cast<unsigned char>(x)) ==
           std::tolower(static_cast<unsigned char>(y));
  });
}

std::vector<std::string> split_list(const std::string& flag, const std::string& value) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= value.size()) {
    const std::size_t comma = std::min(value.find(',', start), value.size());
    std::string item = value.substr(start, comma - start);
    const auto first = item.find_first_not_of(' ');
    item = first == std::string::npos ? ""
                                      : item.substr(first, item.find_last_not_of(' ') - first + 1);
    if (item.empty()) throw usage_error{flag + ": empty name in '" + value + "'"};
    out.push_back(item);
    start = comma + 1;
  }
  return out;
}

// Parses the command line into `opts`; an exit status when the program is to stop
// (--help, --version, --list, a usage error).
std::optional<int> parse_arguments(int argc, char** argv, options& opts) {
  CLI::App app(description, "gpumem-bench");
  tools::apply_conventions(app, epilog);
  std::string workloads, subjects, traces;
  std::optional<int> reps, rep_ms;
  int rounds = 1;
  int cell_budget_seconds = 0, time_limit_seconds = 0;
  bool list = false;
  app.add_option("--workloads", workloads,
                 "comma-separated ids or names to run (default: all), e.g. W1,W3")
      ->type_name("LIST");
  app.add_option("--subjects", subjects,
                 "comma-separated rows to run (default: all), e.g.\n"
                 "\"gpumem cuda_resource,cuMemAllocAsync\"")
      ->type_name("LIST");
  app.add_option("--reps", reps,
                 "timed repetitions per cell, after a warm-up (default 5;\n2 with --quick)")
      ->type_name("N")
      ->check(tools::whole_number(1, 1000));
  app.add_option("--rounds", rounds,
                 "measure each workload's rows N times, row after row, and\n"
                 "take each cell's figure over the repetitions of all N\n"
                 "(default 1): ratios between rows then rest on the same\n"
                 "stretches of the host's time")
      ->type_name("N")
      ->check(tools::whole_number(1, 100));
  app.add_option("--rep-ms", rep_ms,
                 "what a calibrated repetition aims to last (default 100;\n10 with --quick)")
      ->type_name("MS")
      ->check(tools::whole_number(1, 60000));
  app.add_flag("--quick", opts.quick,
               "smoke run for CI: fewer ops and repetitions,\n--cell-budget-s 3");
  app.add_option("--cell-budget-s", cell_budget_seconds,
                 "bound each cell's time: fewer repetitions where one is\n"
                 "long (at least one), W3 thread counts estimated not to\nfit are skipped")
      ->type_name("S")
      ->check(tools::whole_number(1, 86400));
  app.add_option("--time-limit-s", time_limit_seconds,
                 "stop measuring after S seconds: what is left is skipped,\n"
                 "and the tables, JSON and charts are written all the same")
      ->type_name("S")
      ->check(tools::whole_number(1, 86400));
  app.add_option("--traces", traces,
                 "W5's allocation logs: comma-separated CSV files or\n"
                 "folders of them (default: the logs kept in the source\ntree, bench/traces)")
      ->type_name("LIST");
  app.add_option("--json", opts.json_path, "also write every result, with all repetitions, to FILE")
      ->type_name("FILE");
  app.add_option("--plot", opts.plot_dir,
                 "also write charts (SVG) into DIR: W3 throughput against\n"
                 "threads, W5 reserved and live bytes over each trace, W8\n"
                 "kernel throughput with / without an allocating thread\nper row")
      ->type_name("DIR");
  app.add_flag("--list", list, "list the workloads and subjects and exit");
  if (auto stop = tools::parse_command_line(app, argc, argv)) return stop;
  try {
    if (app.count("--json") > 0 && opts.json_path.empty()) throw usage_error{"--json needs a file name"};
    if (app.count("--plot") > 0 && opts.plot_dir.empty()) throw usage_error{"--plot needs a folder"};
    if (app.count("--workloads") > 0) opts.workloads = split_list("--workloads", workloads);
    if (app.count("--subjects") > 0) opts.subjects = split_list("--subjects", subjects);
    if (app.count("--traces") > 0) opts.traces = split_list("--traces", traces);
  } catch (const usage_error& e) {
    return tools::usage_error(app, e.message);
  }
  if (list) {
    print_list(std::cout);
    return exit_ok;
  }
  opts.cell_budget_seconds = cell_budget_seconds;
  opts.time_limit_seconds = time_limit_seconds;
  // The quick run bounds its cells too: a row a hundred times slower than the
  // rest (pinned host memory at 16 threads) would otherwise be most of its time.
  if (opts.quick && opts.cell_budget_seconds <= 0) opts.cell_budget_seconds = quick_cell_budget_seconds;
  opts.reps = reps.value_or(opts.quick ? 2 : 5);
  opts.rounds = rounds;
  opts.rep_seconds = rep_ms.value_or(opts.quick ? 10 : 100) / 1000.0;
  return std::nullopt;
}

std::vector<const workload*> select_workloads(const options& opts) {
  std::vector<const workload*> out;
  for (const workload* w : all_workloads()) {
    const bool wanted =
        opts.workloads.empty() ||
        std::any_of(opts.workloads.begin(), opts.workloads.end(), [&](const std::string& n) {
          return iequals(n, w->id()) || iequals(n, w->name());
        });
    if (wanted) out.push_back(w);
  }
  for (const std::string& n : opts.workloads) {
    if (std::none_of(out.begin(), out.end(), [&](const workload* w) {
          return iequals(n, w->id()) || iequals(n, w->name());
        })) {
      std::string known;
      for (const workload* w : all_workloads()) {
        known += ' ';
        known += w->id();
      }
      throw usage_error{"--workloads: no workload '" + n + "' (known:" + known + ")"};
    }
  }
  return out;
}

// Drops the rows that cannot run here (a plugin peer that was not built, or that
// needs a GPU), noting why in `info`.
std::vector<const subject*> available_subjects(const std::vector<const subject*>& wanted,
                                               run_info& info) {
  std::vector<const subject*> out;
  for (const subject* s : wanted) {
    std::string why;
    if (s->available != nullptr && !s->available(why)) {
      info.not_measured.emplace_back(std::string(s->name), why);
      continue;
    }
    out.push_back(s);
  }
  return out;
}

std::vector<const subject*> select_subjects(const options& opts) {
  std::vector<const subject*> out;
  for (const subject& s : all_subjects()) {
    const bool wanted = opts.subjects.empty() ||
                        std::any_of(opts.subjects.begin(), opts.subjects.end(),
                                    [&](const std::string& n) { return iequals(n, s.name); });
    if (wanted) out.push_back(&s);
  }
  for (const std::string& n : opts.subjects) {
    if (std::none_of(out.begin(), out.end(),
                     [&](const subject* s) { return iequals(n, s->name); })) {
      std::string known;
      for (const subject& s : all_subjects()) {
        known += known.empty() ? "'" : ", '";
        known += s.name;
        known += '\'';
      }
      throw usage_error{"--subjects: no subject '" + n + "' (known: " + known + ")"};
    }
  }
  return out;
}

// The NVIDIA kernel driver's version (e.g. "580.159.04"), which docs/benchmarks-method.md's
// figures quote beside the CUDA version; empty where there is none (simulator).
std::string kernel_driver_version() {
  std::ifstream in("/proc/driver/nvidia/version");
  std::string word;
  while (in >> word) {
    const bool versionlike = !word.empty() && std::isdigit(static_cast<unsigned char>(word[0])) &&
                             word.find('.') != std::string::npos &&
                             word.find_first_not_of("0123456789.") == std::string::npos;
    if (versionlike) return word;
  }
  return {};
}

std::string utc_now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Chooses the backend and says so first when it is the simulator, so that no
// one reads simulator timings as a GPU's.
run_info open_device(int device) {
  const char* env = std::getenv("GPUMEM_BACKEND");
  const bool env_set = env != nullptr && *env != '\0';
  const backend_kind kind = select_backend(backend_choice::cuda_or_sim);
  if (kind == backend_kind::sim) {
    std::cout << (env_set ? "gpumem-bench: GPUMEM_BACKEND=sim; running on the host simulator."
                          : "gpumem-bench: no usable CUDA driver or GPU here; running on the host "
                            "simulator (GPUMEM_BACKEND=sim).")
              << " Timings are of the simulator, not of a GPU.\n\n";
  }
  if (device_count() <= device) {
    throw std::runtime_error("no device " + std::to_string(device) + " (" +
                             std::to_string(device_count()) + " device(s))");
  }
  set_current_device(device);
  run_info info;
  info.gpumem_version = GPUMEM_VERSION;
  info.backend = std::string(to_string(kind));
  info.device = device;
  info.device_name = device_name(device);
  info.total_bytes = device_memory_info(device).total_bytes;
  info.driver_version = driver_version();
  if (kind == backend_kind::cuda) info.kernel_driver = kernel_driver_version();
  info.cuda_header_version = CUDA_VERSION;
  info.started_utc = utc_now();
  info.host_threads = std::thread::hardware_concurrency();
  return info;
}

int run(int argc, char** argv) {
  options opts;
  std::vector<const workload*> workloads;
  std::vector<const subject*> subjects;
  std::ofstream json;
  if (const auto stop = parse_arguments(argc, argv, opts)) return *stop;
  try {
    workloads = select_workloads(opts);
    subjects = select_subjects(opts);
    if (!opts.json_path.empty()) {
      // Opened now, so a bad path costs no benchmark time.
      json.open(opts.json_path);
      if (!json) throw usage_error{"--json: cannot write '" + opts.json_path + "'"};
    }
    if (!opts.plot_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(opts.plot_dir, ec);
      if (ec || !std::filesystem::is_directory(opts.plot_dir)) {
        throw usage_error{"--plot: cannot make the folder '" + opts.plot_dir + "'"};
      }
    }
  } catch (const usage_error& e) {
    std::cerr << "gpumem-bench: " << e.message << "\nTry 'gpumem-bench --help'.\n";
    return tools::exit_usage;
  }

  run_info info;
  try {
    info = open_device(0);
  } catch (const std::exception& e) {
    std::cerr << "gpumem-bench: cannot use the device: " << e.what() << "\n";
    return exit_failure;
  }
  info.peer_libraries = peers::loaded_peer_libraries();
  subjects = available_subjects(subjects, info);
  print_header(std::cout, info);
  std::cout.flush();

  std::vector<workload_result> results;
  bool errored = false;
  const auto run_start = std::chrono::steady_clock::now();
  context ctx{opts, info.device};
  if (opts.time_limit_seconds > 0) {
    ctx.deadline = run_start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                   std::chrono::duration<double>(opts.time_limit_seconds));
  }
  std::size_t cells_done = 0;
  const bool progress_per_row = ::isatty(STDERR_FILENO) != 0;
  std::size_t cells_total = 0;
  for (const workload* w : workloads) {
    cells_total += static_cast<std::size_t>(opts.rounds) *
                   static_cast<std::size_t>(std::count_if(subjects.begin(), subjects.end(),
                                                          [&](const subject* s) { return w->has_row_for(*s); }));
  }
  if (!subjects.empty()) warm_up(*subjects.front(), ctx, opts.quick ? 0.05 : 1.0);
  // Note [Rounds]
  // Hosts change speed for seconds at a time (docs/benchmarks-method.md, "Timing",
  // has the figures), so a row measured in a slow stretch and the next in a quick
  // one compare the host, not the allocators. With --rounds N each workload measures every row, then every
  // row again, N times: each row's repetitions come from N stretches spread over
  // the same span as the other rows', and its figure is the median of them all.
  // Each round makes its own resource (a row's memory figures are per round too),
  // so no two rows hold device memory at once, as with one round.
  for (const workload* w : workloads) {
    workload_result res;
    res.w = w;
    res.columns = w->columns(opts);
    for (int round = 1; round <= opts.rounds; ++round) {
      std::size_t row_index = 0;
      for (const subject* s : subjects) {
        if (!w->has_row_for(*s)) continue;
        const std::size_t row = row_index++;
        // Progress on stderr (the tables go to stdout): a line per row on a terminal,
        // a line per workload in a log.
        ++cells_done;
        if (progress_per_row || (round == 1 && row == 0)) {
          const double so_far = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
          std::cerr << "gpumem-bench: [" << cells_done << "/" << cells_total << ", " << static_cast<long long>(so_far)
                    << " s] " << w->id() << " " << w->name();
          if (progress_per_row) std::cerr << ": " << s->name;
          if (progress_per_row && opts.rounds > 1) std::cerr << " (round " << round << " of " << opts.rounds << ")";
          std::cerr << "\n";
        }
        auto error_cell = [](std::string message) {
          cell c;
          c.status = cell_status::error;
          c.message = std::move(message);
          return c;
        };
        std::vector<cell> cells;
        if (ctx.out_of_time()) {
          // A later round out of time keeps what the earlier ones measured.
          if (round == 1) {
            cells.assign(res.columns.size(), time_limit_cell(opts));
            res.rows.push_back({s, std::move(cells)});
          }
          continue;
        }
        try {
          cells = w->measure(*s, ctx);
        } catch (const std::exception& e) {  // workloads catch what they expect; this is a bug
          cells.assign(res.columns.size(), error_cell(e.what()));
        }
        cells.resize(res.columns.size(), error_cell("workload returned no cell"));
        for (const cell& c : cells) errored = errored || c.status == cell_status::error;
        if (round == 1) {
          res.rows.push_back({s, std::move(cells)});
        } else {
          for (std::size_t k = 0; k < cells.size(); ++k) add_round(res.rows[row].cells[k], std::move(cells[k]), round);
        }
      }
    }
    print_table(std::cout, info, opts, res);
    if (!opts.plot_dir.empty()) {
      try {
        const std::string where = info.device_name + " (" + info.backend + ")";
        for (const auto& path : write_charts(opts.plot_dir, w->charts(res, where))) {
          std::cout << "chart written to " << path.string() << "\n";
        }
      } catch (const std::exception& e) {
        std::cerr << "gpumem-bench: --plot: " << e.what() << "\n";
        errored = true;
      }
      std::cout << "\n";
    }
    std::cout.flush();
    results.push_back(std::move(res));
  }

  print_verdict(std::cout, results);
  std::cout << "ran in " << static_cast<long long>(std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count())
            << " s" << (opts.quick ? " (--quick: fewer ops and repetitions)" : "") << "\n";
  if (json.is_open()) {
    write_json(json, info, opts, results);
    json.close();
    if (!json) {
      std::cerr << "gpumem-bench: writing '" << opts.json_path << "' failed\n";
      return exit_failure;
    }
    std::cout << "results written to " << opts.json_path << "\n";
  }
  if (errored) {
    std::cerr << "gpumem-bench: a workload errored unexpectedly (see the tables' footnotes)\n";
    return exit_failure;
  }
  return exit_ok;
}

}  // namespace
}  // namespace gpumem::bench

int main(int argc, char** argv) { return gpumem::bench::run(argc, argv); }
