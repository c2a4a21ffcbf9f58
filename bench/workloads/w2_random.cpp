// W2 random: up to 1000 live allocations of random sizes; each op allocates
// (p = 1/2, while fewer than 1000 are live) or frees a uniformly random live
// one. The figure is nanoseconds per op, over a fixed op sequence that ends by
// freeing everything and synchronizing the stream, all inside the timed region.
// It measures an allocator under churn: splitting, coalescing, size classes.
#include <cstdint>
#include <random>
#include <utility>

#include "harness.hpp"
#include "workloads/registry.hpp"

namespace gpumem::bench {
namespace {

constexpr std::size_t max_live = 1000;
constexpr std::uint64_t seed = 1;
constexpr std::size_t max_sizes[] = {std::size_t{4} << 10, std::size_t{4} << 20};

std::size_t op_count(const options& opts) { return opts.quick ? 4000 : 20000; }

// bytes > 0: allocate that many. bytes == 0: free live allocation number `index`
// (the live set is a vector; a free moves the last entry into the hole).
struct op {
  std::uint32_t bytes;
  std::uint32_t index;
};

// The op sequence, computed before any timing and identical for every row.
// Drawn with plain arithmetic on mt19937_64 rather than std::*_distribution,
// whose output differs between standard libraries, so that every build agrees.
std::vector<op> make_ops(std::size_t count, std::size_t max_bytes) {
  std::mt19937_64 rng(seed);
  std::vector<op> ops;
  ops.reserve(count);
  std::size_t live = 0;
  for (std::size_t k = 0; k < count; ++k) {
    const bool allocate = live == 0 || (live < max_live && (rng() >> 63) == 0);
    if (allocate) {
      ops.push_back({static_cast<std::uint32_t>(1 + rng() % max_bytes), 0});
      ++live;
    } else {
      ops.push_back({0, static_cast<std::uint32_t>(rng() % live)});
      --live;
    }
  }
  return ops;
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
      const std::vector<op> ops = make_ops(op_count(ctx.opts), max_bytes);
      out.push_back(run_cell(s, ctx, [&](memory_resource& mr, stream& st) {
        std::vector<std::pair<void*, std::size_t>> live;
        live.reserve(max_live);
        auto free_all = [&] {
          while (!live.empty()) {
            mr.deallocate(live.back().first, live.back().second, st);
            live.pop_back();
          }
        };
        auto body = [&](std::uint64_t) {
          try {
            for (const op& o : ops) {
              if (o.bytes != 0) {
                live.emplace_back(mr.allocate(o.bytes, st), o.bytes);
              } else {
                mr.deallocate(live[o.index].first, live[o.index].second, st);
                live[o.index] = live.back();
                live.pop_back();
              }
            }
            free_all();
            st.synchronize();
          } catch (...) {
            // Leave the resource empty before it is destroyed; the first error is the one reported.
            while (!live.empty()) {
              const auto [p, bytes] = live.back();
              live.pop_back();
              try {
                mr.deallocate(p, bytes, st);
              } catch (...) {
              }
            }
            throw;
          }
        };
        cell c;
        c.iterations = ops.size();
        body(c.iterations);  // warm-up repetition
        c.reps = repeat_ns_per_iteration(body, c.iterations, ctx.opts.reps);
        return c;
      }));
    }
    return out;
  }
};

}  // namespace

const workload& w2_random() {
  static const random_workload w;
  return w;
}

}  // namespace gpumem::bench
