// W1 pair: allocate and free the same size over and over on one non-blocking
// stream; the figure is nanoseconds per allocate+deallocate pair. It measures
// an allocator's fast path: a cache that recycles the block just freed wins.
#include <cstdint>

#include "harness.hpp"
#include "workloads/registry.hpp"

namespace gpumem::bench {
namespace {

constexpr std::size_t sizes[] = {256, std::size_t{1} << 20, std::size_t{64} << 20};

// Bounds the calibrated count so a very fast subject cannot make a repetition
// run away when the clock's first reading was unlucky.
constexpr std::uint64_t max_pairs = std::uint64_t{1} << 24;

class pair_workload final : public workload {
 public:
  std::string_view id() const override { return "W1"; }
  std::string_view name() const override { return "pair"; }
  std::string_view figure() const override { return "ns per allocate+free pair"; }

  std::vector<column> columns(const options&) const override {
    std::vector<column> out;
    for (std::size_t bytes : sizes) out.push_back({size_label(bytes), "ns", true});
    return out;
  }

  std::vector<cell> measure(const subject& s, const context& ctx) const override {
    std::vector<cell> out;
    for (std::size_t bytes : sizes) {
      out.push_back(run_cell(s, ctx, [&](memory_resource& mr, stream& st) {
        // The stream is synchronized at the end of every run, inside the timed
        // region, so work a stream-ordered allocator deferred is paid for; over
        // thousands of pairs it costs next to nothing.
        auto body = [&](std::uint64_t n) {
          for (std::uint64_t i = 0; i < n; ++i) {
            void* p = mr.allocate(bytes, st);
            mr.deallocate(p, bytes, st);
          }
          st.synchronize();
        };
        cell c;
        c.iterations = calibrate(body, ctx.opts.rep_seconds, max_pairs);
        c.reps = repeat_ns_per_iteration(body, c.iterations, ctx.opts.reps);
        return c;
      }));
    }
    return out;
  }
};

}  // namespace

const workload& w1_pair() {
  static const pair_workload w;
  return w;
}

}  // namespace gpumem::bench
