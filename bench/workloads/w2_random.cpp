// W2 random: up to 1000 live allocations of random sizes; each op allocates
// (p = 1/2, while fewer than 1000 are live) or frees a uniformly random live
// one. The figure is nanoseconds per op, over a fixed op sequence that ends by
// freeing everything and synchronizing the stream, all inside the timed region.
// It measures an allocator under churn: splitting, coalescing, size classes.
// The sequence and its replay live in random_ops.hpp, which W3 shares.
#include <chrono>
#include <cstdint>

#include "harness.hpp"
#include "report.hpp"
#include "workloads/random_ops.hpp"
#include "workloads/registry.hpp"

namespace gpumem::bench {
namespace {

constexpr std::uint64_t seed = 1;
constexpr std::size_t max_sizes[] = {std::size_t{4} << 10, std::size_t{4} << 20};

std::size_t op_count(const options& opts) { return opts.quick ? 4000 : 20000; }

const workload_result::row* find_row(const workload_result& result, std::string_view name) {
  for (const auto& row : result.rows) {
    if (row.s->name == name) return &row;
  }
  return nullptr;
}

class random_workload final : public workload {
 public:
  std::string_view id() const override { return "W2"; }
  std::string_view name() const override { return "random"; }
  std::string_view figure() const override { return "ns per op (allocate or free)"; }

  std::vector<column> columns(const options&) const override {
    std::vector<column> out;
    for (std::size_t bytes : max_sizes) out.push_back({"max " + size_label(bytes), "ns", true});
    return out;
  }

  std::vector<cell> measure(const subject& s, const context& ctx) const override {
    std::vector<cell> out;
    for (std::size_t max_bytes : max_sizes) {
      const std::vector<random_op> ops = make_random_ops(op_count(ctx.opts), max_bytes, seed);
      out.push_back(run_cell(s, ctx, [&](memory_resource& mr, stream& st) {
        live_allocations live;
        live.reserve(random_max_live);
        auto body = [&](std::uint64_t) { replay_random_ops(mr, st, ops, live); };
        cell c;
        c.iterations = ops.size();
        const auto t0 = std::chrono::steady_clock::now();
        body(c.iterations);  // warm-up repetition
        const double warm_up = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        c.reps = repeat_ns_per_iteration(body, c.iterations, reps_within_budget(ctx.opts, warm_up, c));
        return c;
      }));
    }
    return out;
  }

  // The pool's host cost against glibc malloc on the same op sequence: the
  // simulator's figures are host code, so this is where that criterion is read.
  std::vector<std::string> notes(const workload_result& result) const override {
    const auto* pool = find_row(result, pool_subject_name);
    const auto* host = find_row(result, malloc_subject_name);
    if (pool == nullptr || host == nullptr) return {};
    std::string line;
    for (std::size_t col = 0; col < result.columns.size(); ++col) {
      const cell& p = pool->cells[col];
      const cell& m = host->cells[col];
      if (p.status != cell_status::ok || m.status != cell_status::ok || m.median() <= 0) continue;
      line += (line.empty() ? "" : ", ") + format_ratio(p.median() / m.median()) + " (" +
              result.columns[col].label + ")";
    }
    if (line.empty()) return {};
    return {"pool_resource / malloc: " + line + "; below 1: the pool costs the host less"};
  }
};

}  // namespace

const workload& w2_random() {
  static const random_workload w;
  return w;
}

}  // namespace gpumem::bench
