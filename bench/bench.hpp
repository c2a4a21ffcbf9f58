// gpumem-bench's vocabulary: subjects (the rows: gpumem resources and peers),
// workloads (the tables: W1..W9 of docs/benchmarks-method.md), columns (a
// workload's variants) and cells (one subject measured on one column).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpumem/memory_resource.hpp"

namespace gpumem::bench {

// ---- subjects ---------------------------------------------------------------

// A reference row is measured like the others but never is the best peer: it
// is there to be read against (malloc: the host cost an allocator should match).
enum class subject_kind { gpumem, peer, reference };

// One row of every table. `make` builds a fresh resource on `device` for each
// cell, so no row inherits another row's (or another column's) cached memory.
// `available`, when set, says whether the row can run here at all (a peer
// loaded from a plugin library that was not built, or that needs a GPU); a row
// that cannot is left out of the run, and the header and the JSON say why.
struct subject {
  std::string_view name;
  subject_kind kind;
  std::shared_ptr<memory_resource> (*make)(int device);
  bool (*available)(std::string& why) = nullptr;
  // The same resource as another row but for how the hot path checks for CUDA graph
  // captures: workloads that time no hot path (W4) leave such a row out.
  bool capture_check_variant = false;
};

// Every row this build knows, in table order (subjects.cpp).
std::span<const subject> all_subjects();

// The stack a program gets with GPUMEM_CONF unset (make_default_resource).
inline constexpr std::string_view default_subject_name = "gpumem default";
// Rows that a workload's notes compare by name (W2: pool_resource / malloc).
inline constexpr std::string_view pool_subject_name = "gpumem pool_resource";
inline constexpr std::string_view malloc_subject_name = "malloc (host reference)";
// W6 grows a growable_buffer in this row (the virtual-memory row).
inline constexpr std::string_view vmm_pool_subject_name = "gpumem vmm_pool_resource";
// W9 measures peer access in these rows (and the default and vmm_pool_resource rows).
inline constexpr std::string_view async_subject_name = "gpumem async_resource";
inline constexpr std::string_view cumemalloc_subject_name = "cuMemAlloc";

// ---- options ----------------------------------------------------------------

struct options {
  int reps = 5;                        // timed repetitions per cell; the figure is their median
  // Each workload's rows are measured this many times, row after row, and a
  // cell's repetitions are those of every round (Note [Rounds] in main.cpp).
  int rounds = 1;
  bool quick = false;                  // CI smoke run: fewer ops, shorter repetitions
  double rep_seconds = 0.1;            // what a calibrated repetition aims to last
  // Bounds a cell's time: the repetitions a cell runs after its warm-up are cut
  // to what fits (at least one), and W3 skips a thread count whose estimate
  // does not fit. 0: no bound.
  double cell_budget_seconds = 0;
  // Bounds the whole run: once it has lasted this long, the cells not yet
  // begun are skipped (saying so), so that the tables, the JSON and the charts
  // are still written. 0: no bound.
  double time_limit_seconds = 0;
  std::string json_path;               // empty: no JSON
  std::string plot_dir;                // empty: no charts
  std::vector<std::string> workloads;  // empty: all
  std::vector<std::string> subjects;   // empty: all
  std::vector<std::string> traces;     // W5's logs: files, or folders of *.csv
};

struct context {
  const options& opts;
  int device = 0;
  // When --time-limit-s runs out (run_cells skips every cell begun after it).
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  bool out_of_time() const { return std::chrono::steady_clock::now() >= deadline; }
};

// ---- results ----------------------------------------------------------------

// A column: one variant of a workload, with the unit of its figure.
struct column {
  std::string label;  // e.g. "256 B", "max 4 MiB"
  std::string unit;   // e.g. "ns"; empty for a plain number
  bool lower_is_better = true;
  // Computed from other columns' medians (W3's scaling), not measured: no
  // repetitions of its own and no ratio to the best peer.
  bool derived = false;
  // Columns of one group print as one table; a workload whose columns have
  // several groups (W5: time, memory, out-of-memory, one column per trace each)
  // prints one table per group, titled with it. Empty: the workload's one table.
  std::string group = {};
};

// A curve a cell recorded beside its figure, for the charts (W5: reserved bytes
// over a trace's events). x and y have the same length.
struct series {
  std::string name;
  std::vector<double> x, y;
  // How a chart draws it: a plain line; emphasised (gpumem's rows); or the
  // reference the others are read against (a trace's live bytes), in black.
  enum class style { plain, emphasis, reference } look = style::plain;
};

enum class cell_status {
  ok,
  failed,   // the subject ran out of memory or a driver call failed: a result, not a bug
  error,    // anything else (logic_error, ...): the run exits 1
  skipped,  // the workload does not apply to the subject (message says why)
};

struct cell {
  cell_status status = cell_status::ok;
  std::string message;           // why, when not ok
  std::vector<double> reps;      // the figure of each timed repetition, in the column's unit
  std::uint64_t iterations = 0;  // operations timed per repetition
  // A failure that is itself the result and was timed (W4's 25% allocation:
  // "OOM" and how long failing took): a short word for the table; reps hold the time.
  std::string outcome;
  std::vector<series> curves;  // what --plot draws for this cell; none for most workloads
  // Fewer repetitions than --reps, cut to fit --cell-budget-s; the table says so.
  bool cut_by_budget = false;

  double median() const;
  double min() const;
  double max() const;
};

// ---- workloads --------------------------------------------------------------

struct workload_result;
struct chart;

class workload {
 public:
  virtual ~workload() = default;
  virtual std::string_view id() const = 0;      // "W1"
  virtual std::string_view name() const = 0;    // "pair"
  virtual std::string_view figure() const = 0;  // what a cell's number is, in words
  virtual std::vector<column> columns(const options& opts) const = 0;
  // One cell per column, for one subject. Expected failures (out of memory,
  // cuda_error) come back as failed cells; the workload never lets them escape.
  virtual std::vector<cell> measure(const subject& s, const context& ctx) const = 0;
  // Whether the workload has a row for `s` at all (W9: only the rows that can
  // grant another device access); rows it has none for are left out of its table.
  virtual bool has_row_for(const subject& s) const;
  // How a figure comes from the repetitions, for the table's footer; by
  // default "median of N repetitions after a warm-up (host steady_clock)".
  virtual std::string method(const options& opts) const;
  // Lines the table prints under its footer and the JSON keeps (W2: pool_resource
  // against malloc); none by default.
  virtual std::vector<std::string> notes(const workload_result& result) const;
  // The charts --plot writes for this workload (plot.hpp), none by default.
  // `where` names the device and backend, for the titles.
  virtual std::vector<chart> charts(const workload_result& result, const std::string& where) const;
};

// Every workload this build knows, in run order (workloads/registry.cpp).
std::span<const workload* const> all_workloads();

struct workload_result {
  const workload* w = nullptr;
  std::vector<column> columns;
  struct row {
    const subject* s = nullptr;
    std::vector<cell> cells;  // one per column
  };
  std::vector<row> rows;
};

}  // namespace gpumem::bench
