// The process-wide capture watch: its word, who holds it, and the public
// capture_watch (include/gpumem/capture_watch.hpp; Note [The capture watch word]).
#include "gpumem/capture_watch.hpp"
#include "diagnose.hpp"

#include <cstdio>
#include <mutex>

#include "driver/capture_watch_state.hpp"
#include "driver/driver.hpp"
#include "gpumem/backend.hpp"
#include "gpumem/error.hpp"
#include "sim/sim_state.hpp"

namespace gpumem {
namespace detail {

std::atomic<std::uint64_t> capture_watch_word{capture_watch_off};

std::uint64_t capture_watch_word_now() noexcept { return capture_watch_word.load(std::memory_order_acquire); }

void capture_watch_begin_entered() noexcept { capture_watch_word.fetch_add(1, std::memory_order_acq_rel); }

namespace {
void uncount() noexcept {
  std::uint64_t word = capture_watch_word.load(std::memory_order_relaxed);
  for (;;) {
    const std::uint64_t count = word & ~capture_watch_off;
    // Nothing counted: an end the watch never saw begin (see the note).
    const std::uint64_t next = count == 0 ? (word | capture_watch_off) : word - 1;
    if (capture_watch_word.compare_exchange_weak(word, next, std::memory_order_acq_rel)) return;
  }
}
}  // namespace

void capture_watch_begin_failed() noexcept { uncount(); }
void capture_watch_capture_ended() noexcept { uncount(); }
void capture_watch_distrust() noexcept { capture_watch_word.fetch_or(capture_watch_off, std::memory_order_acq_rel); }

void capture_watch_found_unseen(CUstream stream) {
  if (!watch_says_no_capture()) return;  // the word already asks the pools to query
  capture_watch_distrust();
  detail::diagnosef(diagnostic_level::warning,
               "gpumem: stream %p was already being captured when a pool first used it: the capture "
               "began before the capture watch started. The pools ask the driver on every call from "
               "now on; start gpumem::capture_watch before any capture\n",
               static_cast<void*>(stream));
}

namespace {

// Who holds the watch: the first holder starts it, the last one stops it.
struct watch_holders {
  std::mutex mutex;
  unsigned count = 0;
  std::string source;  // of the running watch
  std::string reason;  // why the last start failed
};
watch_holders& holders() {
  static watch_holders h;
  return h;
}

}  // namespace
}  // namespace detail

capture_watch::capture_watch() {
  auto& h = detail::holders();
  std::lock_guard lock(h.mutex);
  if (h.count == 0) {
    h.source.clear();
    h.reason.clear();
    try {
      // The driver (or the simulator) must be up before anything can watch it.
      (void)detail::driver();
      if (current_backend() == backend_kind::sim) {
        const detail::simulator::sim_state* sim = detail::simulator::simulator_state();
        if (sim != nullptr && !sim->capture_watch_available.load(std::memory_order_relaxed)) {
          h.reason = "CUPTI has another subscriber (simulated: gpumem::sim::set_capture_watch_available(false))";
        } else {
          h.source = "simulator";  // sim_stream.cpp reports its captures
        }
      } else {
        h.reason = detail::start_cupti_watch();
        if (h.reason.empty()) h.source = "CUPTI";
      }
    } catch (const std::exception& e) {
      h.reason = e.what();
    }
    // Counted from here: a capture in progress now was begun unseen (the note).
    if (!h.source.empty()) detail::capture_watch_word.store(0, std::memory_order_release);
  }
  ++h.count;
  source_ = h.source;
  reason_ = h.reason;
}

capture_watch::~capture_watch() {
  auto& h = detail::holders();
  std::lock_guard lock(h.mutex);
  if (--h.count != 0) return;
  detail::capture_watch_word.store(detail::capture_watch_off, std::memory_order_release);
  if (h.source == "CUPTI") detail::stop_cupti_watch();
  h.source.clear();
}

bool capture_watch::active() const noexcept {
  return !source_.empty() && (detail::capture_watch_word.load(std::memory_order_acquire) & detail::capture_watch_off) == 0;
}

}  // namespace gpumem
