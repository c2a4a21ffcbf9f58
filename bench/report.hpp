// What gpumem-bench prints: the run header, one table per workload, and the
// JSON file with every repetition (report.cpp).
#pragma once

#include <cstddef>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "bench.hpp"

namespace gpumem::bench {

// Facts about the run that every table and the JSON carry.
struct run_info {
  std::string gpumem_version;
  std::string backend;  // "cuda" or "sim"
  int device = 0;
  std::string device_name;
  std::size_t total_bytes = 0;
  int driver_version = 0;       // CUDA version of the driver, e.g. 13000
  std::string kernel_driver;    // NVIDIA kernel driver, e.g. "580.159.04"; empty if unknown
  int cuda_header_version = 0;  // CUDA_VERSION of the cuda.h gpumem was built with
  std::string started_utc;      // ISO 8601
  unsigned host_threads = 0;
  // Peer libraries loaded from plugins, with their versions ("RMM 26.10.0").
  std::vector<std::string> peer_libraries;
  // Rows left out of this run, and why (a plugin not built, no GPU).
  std::vector<std::pair<std::string, std::string>> not_measured;
};

void print_header(std::ostream& out, const run_info& info);

// Rows = subjects, columns = the workload's variants; each cell is the median
// and its ratio to the best peer of the column. Failures are footnoted.
void print_table(std::ostream& out, const run_info& info, const options& opts,
                 const workload_result& result);

void write_json(std::ostream& out, const run_info& info, const options& opts,
                const std::vector<workload_result>& results);

// Row index of the best peer in `col` (lowest median, or highest where higher
// is better) among peers that succeeded; none when no peer did, and in derived
// columns. Reference rows are never the best peer.
std::optional<std::size_t> best_peer(const workload_result& result, std::size_t col);

// The cell against the best peer, oriented so that below 1 is better in every
// column: median / best peer's median where lower is better, best peer's
// median / median where higher is better. None without a best peer.
std::optional<double> ratio_to_best_peer(const workload_result& result, std::size_t row,
                                         std::size_t col);

// The run's last lines: per workload (and table), the default resource's ratio to
// the best peer in every column, and in how many it is better.
void print_verdict(std::ostream& out, const std::vector<workload_result>& results);

// Three significant figures or more: 4.04, 63.5, 208, 56,895; 0.833 below 1.
std::string format_figure(double v);
// A ratio: 0.03x, 1.46x, 93.8x, 146x.
std::string format_ratio(double r);

}  // namespace gpumem::bench
