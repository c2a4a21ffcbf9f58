// The measuring machinery shared by the workloads: host steady_clock timing,
// calibration of iteration counts, repetitions, and running one cell with a
// fresh resource and stream so that expected failures become failed cells.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "bench.hpp"
#include "gpumem/stream.hpp"

namespace gpumem::bench {

// Runs `body(1)` once untimed (first use), then times `body(n)` for n = 1, 2,
// 4, ... (multiplying by 8 while runs are very short) until two runs in a row
// last a fifth of `target_seconds` or n reaches `max_iterations`; returns the n
// for which one run should last about `target_seconds`. These pilot runs are
// the cell's warm-up. Slow subjects (cuMemAlloc, about 60 us a pair on an H100)
// get few iterations, fast ones many.
std::uint64_t calibrate(const std::function<void(std::uint64_t)>& body, double target_seconds,
                        std::uint64_t max_iterations);

// Runs `body(n)` `reps` times and returns, per repetition, nanoseconds per
// iteration (elapsed / n).
std::vector<double> repeat_ns_per_iteration(const std::function<void(std::uint64_t)>& body,
                                            std::uint64_t n, int reps);

// The run's warm-up, before its first cell: allocate+free pairs of a few sizes
// through `s`'s resource (discarded) for `seconds`. A process's first second
// on a fresh context ran every call slower (W1's and W5's first row read up to
// 1.7 x the same row later in the run on H100 hosts), and the first row of every
// run is gpumem's default. Errors are ignored: the row itself reports them.
void warm_up(const subject& s, const context& ctx, double seconds);

// Builds `s`'s resource on ctx.device and a non-blocking stream there, and
// returns fn(resource, stream). Exceptions become a cell: out_of_memory (any
// std::bad_alloc) and cuda_error give `failed`, anything else `error`. The
// stream is synchronized before the resource is destroyed. Past ctx.deadline
// (--time-limit-s) nothing is built or run: the cell is skipped, saying so
// (time_limit_cell).
cell run_cell(const subject& s, const context& ctx,
              const std::function<cell(memory_resource&, stream&)>& fn);

// The same for one experiment that fills several columns (W4): fn's cells, or
// `columns` copies of the cell an exception became.
std::vector<cell> run_cells(const subject& s, const context& ctx, std::size_t columns,
                            const std::function<std::vector<cell>(memory_resource&, stream&)>& fn);

// The cell of a run that reached --time-limit-s before it began (skipped).
cell time_limit_cell(const options& opts);

// A cell that did not measure, saying why (its status: failed, error or skipped).
cell failed_cell(cell_status status, std::string message);

// A cell for a subject the workload does not apply to, saying why.
cell skipped_cell(std::string why);

// Adds round `round` (counted from 1) of a cell to what the earlier rounds gave
// (--rounds): the repetitions join, so the figure is the median of every round's;
// a round that failed or errored makes the cell say so (the first such round's
// status, message naming the round, and outcome with its time where the failure
// is the timed result); a round that skipped the cell leaves
// the earlier rounds' figure, marked as having fewer repetitions than asked;
// the charts and the outcome stay the first round's.
void add_round(cell& so_far, cell round_cell, int round);

// How many of the cell's timed repetitions fit in --cell-budget-s when one
// lasts `seconds_per_rep` (the warm-up's time): opts.reps without a budget,
// else as many as fit, at least one. Sets c.cut_by_budget when it cuts.
int reps_within_budget(const options& opts, double seconds_per_rep, cell& c);

// Runs fn and, when it runs out of memory, returns the message instead of
// throwing: gpumem's out_of_memory (any std::bad_alloc) or a driver call's
// CUDA_ERROR_OUT_OF_MEMORY (as the raw peers throw it). Anything else
// propagates. For workloads where running out is a result (W4).
std::optional<std::string> out_of_memory_from(const std::function<void()>& fn);

// "256 B", "1 MiB", "64 MiB", "4 KiB": exact binary units for the column labels.
std::string size_label(std::size_t bytes);

}  // namespace gpumem::bench
