// gpumem-adaptor-overhead: what the statistics adaptor (and, for reference, the
// other adaptors) add to pool_resource on W2, the random workload of
// gpumem-bench (docs/benchmarks-method.md): up to 1000 live allocations, each op
// allocates or frees a random live one, sizes uniform in [1, max]. Not a test and
// not part of gpumem-bench: a small program whose numbers go into
// docs/observability.md.
//
// Method: the same op sequence for every row; rows are run interleaved, round
// after round, so that drift of the machine (frequency, other load) hits every
// row alike; each figure is the median over rounds of ns per op. Every row gets a
// fresh pool, warmed by one untimed pass.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cli/command_line.hpp"
#include "gpumem/adaptors/limiting.hpp"
#include "gpumem/adaptors/logging.hpp"
#include "gpumem/adaptors/statistics.hpp"
#include "gpumem/adaptors/tracking.hpp"
#include "gpumem/backend.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/device.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/stream.hpp"
#include "workloads/random_ops.hpp"

namespace {

using gpumem::bench::random_op;

// W2's sequence (bench/workloads/random_ops.hpp, seed 1) and one timed replay: ns per op.
double run_once(gpumem::memory_resource& mr, gpumem::stream& s, const std::vector<random_op>& ops) {
  gpumem::bench::live_allocations live;
  live.reserve(gpumem::bench::random_max_live);
  const auto t0 = std::chrono::steady_clock::now();
  gpumem::bench::replay_random_ops(mr, s, ops, live);
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(ops.size());
}

// The floor: an adaptor that adds nothing, only the second virtual call and the
// upstream's argument checks that every adaptor pays.
class forwarding_adaptor final : public gpumem::resource_adaptor {
 public:
  explicit forwarding_adaptor(std::shared_ptr<gpumem::memory_resource> up)
      : resource_adaptor(std::move(up), "forwarding_adaptor") {}

 private:
  void* do_allocate(std::size_t bytes, gpumem::stream_view s, std::size_t alignment) override {
    return upstream_allocate(bytes, s, alignment);
  }
  void do_deallocate(void* p, std::size_t bytes, gpumem::stream_view s, std::size_t alignment) override {
    upstream_deallocate(p, bytes, s, alignment);
  }
};

struct row {
  std::string name;
  std::function<std::shared_ptr<gpumem::memory_resource>(std::shared_ptr<gpumem::memory_resource>)> wrap;
};

}  // namespace

int main(int argc, char** argv) {
  int rounds = 31;
  long long op_count_arg = 20000;
  bool all_rows = false;
  CLI::App app(
      "What the statistics adaptor (and, with --all, the other adaptors) add to pool_resource on\n"
      "W2, gpumem-bench's random workload: the median over interleaved rounds of ns per op.",
      "gpumem-adaptor-overhead");
  gpumem::tools::apply_conventions(
      app,
      "environment: GPUMEM_BACKEND=cuda|sim chooses the backend; unset, the CUDA driver when a\n"
      "GPU is usable, else the host simulator.\n"
      "exit status: 0 measured, 2 bad arguments");
  app.add_option("--rounds", rounds, "interleaved rounds, the figure is their median\n(default 31)")
      ->type_name("N")
      ->check(gpumem::tools::whole_number(1, 100000));
  app.add_option("--ops", op_count_arg, "W2 ops per round (default 20000)")
      ->type_name("N")
      ->check(gpumem::tools::whole_number(1, 100000000));
  app.add_flag("--all", all_rows, "also the limiting, tracking and logging adaptors");
  if (const auto stop = gpumem::tools::parse_command_line(app, argc, argv)) return *stop;
  const auto op_count = static_cast<std::size_t>(op_count_arg);
  const auto kind = gpumem::select_backend(gpumem::backend_choice::cuda_or_sim);
  std::printf("backend %s, device 0: %s; W2 (%zu ops), median of %d interleaved rounds\n",
              std::string(gpumem::to_string(kind)).c_str(), gpumem::device_name(0).c_str(),
              op_count, rounds);

  std::vector<row> rows = {
      {"pool_resource", [](auto pool) { return pool; }},
      {"forwarding(pool) [floor]", [](auto pool) { return std::make_shared<forwarding_adaptor>(pool); }},
      {"statistics(pool)", [](auto pool) { return std::make_shared<gpumem::statistics_adaptor>(pool); }},
  };
  if (all_rows) {
    rows.push_back({"limiting(pool)", [](auto pool) {
                      return std::make_shared<gpumem::limiting_adaptor>(pool, std::size_t{64} << 30);
                    }});
    rows.push_back({"tracking(pool)", [](auto pool) { return std::make_shared<gpumem::tracking_adaptor>(pool); }});
    rows.push_back({"logging(pool) to /dev/null", [](auto pool) {
                      return std::make_shared<gpumem::logging_adaptor>(pool, "/dev/null");
                    }});
  }

  for (std::size_t max_bytes : {std::size_t{4} << 10, std::size_t{4} << 20}) {
    const std::vector<random_op> ops = gpumem::bench::make_random_ops(op_count, max_bytes, 1);
    std::vector<std::vector<double>> samples(rows.size());
    gpumem::stream s(0);
    std::vector<std::shared_ptr<gpumem::memory_resource>> subjects;
    for (const row& r : rows) {
      auto pool = std::make_shared<gpumem::pool_resource>(std::make_shared<gpumem::cuda_resource>(0));
      subjects.push_back(r.wrap(pool));
      run_once(*subjects.back(), s, ops);  // warm-up
    }
    for (int k = 0; k < rounds; ++k) {
      for (std::size_t i = 0; i < rows.size(); ++i) samples[i].push_back(run_once(*subjects[i], s, ops));
    }
    std::printf("\nW2 max %s\n", max_bytes == (4 << 10) ? "4 KiB" : "4 MiB");
    double base = 0;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      auto& v = samples[i];
      std::sort(v.begin(), v.end());
      const double median = v[v.size() / 2];
      if (i == 0) base = median;
      std::printf("  %-28s %8.2f ns/op  (min %.2f, max %.2f)  %+6.1f%%\n", rows[i].name.c_str(),
                  median, v.front(), v.back(), 100.0 * (median - base) / base);
    }
  }
  return 0;
}
