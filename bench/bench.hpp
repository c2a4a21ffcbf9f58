// gpumem-bench's vocabulary: subjects (the rows: gpumem resources and peers),
// workloads (the tables: W1..W8 of docs/benchmarks-method.md), columns (a
// workload's variants) and cells (one subject measured on one column).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpumem/memory_resource.hpp"

namespace gpumem::bench {

// ---- subjects ---------------------------------------------------------------

enum class subject_kind { gpumem, peer };

// One row of every table. `make` builds a fresh resource on `device` for each
// cell, so no row inherits another row's (or another column's) cached memory.
struct subject {
  std::string_view name;
  subject_kind kind;
  std::unique_ptr<memory_resource> (*make)(int device);
};

// Every row this build knows, in table order (subjects.cpp).
std::span<const subject> all_subjects();

// ---- options ----------------------------------------------------------------

struct options {
  int reps = 5;                        // timed repetitions per cell; the figure is their median
  bool quick = false;                  // CI smoke run: fewer ops, shorter repetitions
  double rep_seconds = 0.1;            // what a calibrated repetition aims to last
  std::string json_path;               // empty: no JSON
  std::vector<std::string> workloads;  // empty: all
  std::vector<std::string> subjects;   // empty: all
};

struct context {
  const options& opts;
  int device = 0;
};

// ---- results ----------------------------------------------------------------

// A column: one variant of a workload, with the unit of its figure.
struct column {
  std::string label;  // e.g. "256 B", "max 4 MiB"
  std::string unit;   // e.g. "ns"
  bool lower_is_better = true;
};

enum class cell_status {
  ok,
  failed,  // the subject ran out of memory or a driver call failed: a result, not a bug
  error,   // anything else (logic_error, ...): the run exits 1
};

struct cell {
  cell_status status = cell_status::ok;
  std::string message;           // why, when not ok
  std::vector<double> reps;      // the figure of each timed repetition, in the column's unit
  std::uint64_t iterations = 0;  // operations timed per repetition

  double median() const;
  double min() const;
  double max() const;
};

// ---- workloads --------------------------------------------------------------

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
