// gpumem-example-training: a small program shaped like a training loop, using
// whatever the current resource is, so that GPUMEM_CONF switches it without code
// changes (docs/configuration.md). It is what docs/report-example.png was made
// from:
//   GPUMEM_CONF=pool,log=run.csv,sites gpumem-example-training
//   gpumem-report run.csv --png docs/report-example.png
//
// Two threads, each with its own stream, hold "weights", then run steps that
// allocate activations that grow through a forward pass and are freed through a
// backward pass, with workspace buffers in between; a larger batch every few
// steps asks for more than the device has (a limit, when GPUMEM_CONF sets one),
// which shows up as out-of-memory markers.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <thread>
#include <vector>

#include "cli/command_line.hpp"
#include "gpumem/backend.hpp"
#include "gpumem/current_resource.hpp"
#include "gpumem/device.hpp"
#include "gpumem/stream.hpp"

// Named allocation sites: default visibility (the project builds with hidden
// visibility), and the executable is linked with -rdynamic, so that the log's
// site column names them.
namespace example {

__attribute__((noinline, visibility("default"))) void* allocate_weights(gpumem::memory_resource& mr, std::size_t n, gpumem::stream& s) {
  void* p = mr.allocate(n, s);
  asm volatile("" ::: "memory");  // not a tail call: this function is the site
  return p;
}
__attribute__((noinline, visibility("default"))) void* allocate_activation(gpumem::memory_resource& mr, std::size_t n, gpumem::stream& s) {
  void* p = mr.allocate(n, s);
  asm volatile("" ::: "memory");  // not a tail call: this function is the site
  return p;
}
__attribute__((noinline, visibility("default"))) void* allocate_workspace(gpumem::memory_resource& mr, std::size_t n, gpumem::stream& s) {
  void* p = mr.allocate(n, s);
  asm volatile("" ::: "memory");  // not a tail call: this function is the site
  return p;
}

}  // namespace example

namespace {

using example::allocate_activation;
using example::allocate_weights;
using example::allocate_workspace;

constexpr std::size_t KiB = 1024, MiB = KiB * 1024;

void worker(int id, int steps, std::size_t scale) {
  auto mr = gpumem::get_current_resource(0);
  gpumem::stream s(0);
  std::vector<std::pair<void*, std::size_t>> weights;
  for (int layer = 0; layer < 12; ++layer) {
    const std::size_t n = scale * (4 + static_cast<std::size_t>(layer % 4)) * MiB / 4;
    weights.emplace_back(allocate_weights(*mr, n, s), n);
  }
  for (int step = 0; step < steps; ++step) {
    const bool big_batch = step % 5 == 4;
    std::vector<std::pair<void*, std::size_t>> activations;
    for (int layer = 0; layer < 12; ++layer) {  // forward
      std::size_t n = scale * (6 + static_cast<std::size_t>(layer)) * MiB / 2;
      if (big_batch && id == 0) n *= 12;
      try {
        activations.emplace_back(allocate_activation(*mr, n, s), n);
      } catch (const std::bad_alloc&) {
        std::printf("thread %d step %d: out of memory for %zu bytes; skipping the rest of the step\n", id, step, n);
        break;
      }
      void* ws = allocate_workspace(*mr, 64 * KiB + static_cast<std::size_t>(layer) * 32 * KiB, s);
      std::this_thread::sleep_for(std::chrono::microseconds(300));
      mr->deallocate(ws, 64 * KiB + static_cast<std::size_t>(layer) * 32 * KiB, s);
    }
    while (!activations.empty()) {  // backward
      void* g = allocate_workspace(*mr, 2 * MiB, s);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      mr->deallocate(g, 2 * MiB, s);
      mr->deallocate(activations.back().first, activations.back().second, s);
      activations.pop_back();
    }
    s.synchronize();
  }
  for (auto [p, n] : weights) mr->deallocate(p, n, s);
  s.synchronize();
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 20;
  int scale_arg = 8;
  CLI::App app(
      "A small program shaped like a training loop on the current resource (GPUMEM_CONF):\n"
      "two threads, each with its own stream, hold weights and run STEPS steps of\n"
      "activations and workspaces; every fifth step asks for a larger batch.",
      "gpumem-example-training");
  gpumem::tools::apply_conventions(
      app,
      "environment: GPUMEM_CONF chooses the resource (docs/configuration.md), e.g.\n"
      "GPUMEM_CONF=pool,log=run.csv,sites to log it for gpumem-report; GPUMEM_BACKEND=cuda|sim\n"
      "the backend.\n"
      "exit status: 0 ran, 1 error (a bad GPUMEM_CONF included), 2 bad arguments");
  app.add_option("STEPS", steps, "steps each thread runs (default 20)")
      ->check(gpumem::tools::whole_number(0, 1000000));
  app.add_option("SCALE", scale_arg, "a multiplier of every buffer's size (default 8; the\nsecond thread uses half)")
      ->check(gpumem::tools::whole_number(1, 4096));
  if (const auto stop = gpumem::tools::parse_command_line(app, argc, argv)) return *stop;
  const auto scale = static_cast<std::size_t>(scale_arg);
  try {
    const auto kind = gpumem::select_backend(gpumem::backend_choice::cuda_or_sim);
    std::printf("gpumem-example-training: %s, device 0: %s, %d steps, scale %zu\n",
                std::string(gpumem::to_string(kind)).c_str(), gpumem::device_name(0).c_str(), steps, scale);
    // The device's resource is made here, from GPUMEM_CONF: a bad one is reported
    // below, not in a thread (where it would end the program with std::terminate).
    (void)gpumem::get_current_resource(0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpumem-example-training: %s\n", e.what());
    return 1;
  }
  std::atomic<bool> failed{false};
  auto run = [&failed](int id, int n, std::size_t s) {
    try {
      worker(id, n, s);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gpumem-example-training: thread %d: %s\n", id, e.what());
      failed = true;
    }
  };
  std::thread a(run, 0, steps, scale);
  std::thread b(run, 1, steps, scale / 2 > 0 ? scale / 2 : 1);
  a.join();
  b.join();
  return failed ? 1 : 0;
}
