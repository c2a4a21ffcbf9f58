// The threads a replay runs on (replay_threads.hpp).
//
// Note [Handing the turn over]
// In seq order (Note [Replaying in order] in replay.cpp) the replay hands a turn
// from thread to thread at every event of another logged thread: example-training
// does so 671 times in its 2,928 calls. Whatever that costs lies between the
// resource's calls, inside the timed region, and was counted as the resource's:
// - A thread that sleeps while it waits costs microseconds to wake (a futex wake,
//   or a sched_yield that returns late; on a virtual machine over 100 us). So a
//   waiting thread spins (a pause instruction a look) for up to spin_for, then
//   yields, then sleeps: within one replay's length of a few milliseconds, it
//   never sleeps.
// - A thread that spins on a word that the running thread writes at every call
//   takes the word's cache line from it at every call. So each worker waits on a
//   word of its own (replay.cpp), raised once, by the worker whose event comes
//   just before the waiter's.
// Spinning takes a core for each waiting thread, so it is done only when the
// replay's threads leave a core free; beyond that (a log of hundreds of threads)
// spinning threads would take the core that the thread whose turn it is needs,
// and the waits yield and sleep at once.
#include "replay/replay_threads.hpp"

#include <chrono>
#include <thread>
#include <utility>

namespace gpumem::tools {
namespace {

constexpr auto spin_for = std::chrono::milliseconds(20);
constexpr int yields_before_sleep = 256;

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

std::size_t await_at_least(const std::atomic<std::size_t>& word, std::size_t wanted, bool may_spin) {
  std::size_t v = word.load(std::memory_order_acquire);
  if (v >= wanted) return v;
  if (may_spin) {
    const auto deadline = std::chrono::steady_clock::now() + spin_for;
    for (unsigned looks = 1;; ++looks) {
      cpu_relax();
      v = word.load(std::memory_order_acquire);
      if (v >= wanted) return v;
      if (looks % 64 == 0 && std::chrono::steady_clock::now() >= deadline) break;
    }
  }
  for (int i = 0; i < yields_before_sleep; ++i) {
    std::this_thread::yield();
    v = word.load(std::memory_order_acquire);
    if (v >= wanted) return v;
  }
  for (;;) {
    word.wait(v, std::memory_order_acquire);
    v = word.load(std::memory_order_acquire);
    if (v >= wanted) return v;
  }
}

struct replay_threads::worker {
  std::size_t index = 0;
  std::atomic<std::size_t> posted{0};  // runs posted to this thread; raised to wake it
  std::atomic<bool> stop{false};
  std::thread thread;
};

replay_threads::replay_threads() = default;

replay_threads::~replay_threads() {
  for (auto& w : workers_) {
    w->stop.store(true, std::memory_order_relaxed);
    w->posted.fetch_add(1, std::memory_order_release);
    w->posted.notify_one();
    w->thread.join();
  }
}

void replay_threads::work(worker& w) {
  std::size_t seen = 0;
  for (;;) {
    while (w.posted.load(std::memory_order_acquire) == seen) w.posted.wait(seen, std::memory_order_acquire);
    seen = w.posted.load(std::memory_order_acquire);
    if (w.stop.load(std::memory_order_relaxed)) return;
    try {
      (*body_)(w.index);
    } catch (...) {
      std::lock_guard lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) remaining_.notify_all();
  }
}

void replay_threads::run(std::size_t n, const std::function<void(std::size_t)>& body) {
  workers_.reserve(n);  // a thread never starts without its place
  while (workers_.size() < n) {
    auto w = std::make_unique<worker>();
    w->index = workers_.size();
    worker& started = *w;
    w->thread = std::thread([this, &started] { work(started); });  // std::system_error: none started
    workers_.push_back(std::move(w));
  }
  body_ = &body;
  error_ = nullptr;
  remaining_.store(n, std::memory_order_relaxed);
  for (std::size_t k = 0; k < n; ++k) {
    workers_[k]->posted.fetch_add(1, std::memory_order_release);  // publishes body_
    workers_[k]->posted.notify_one();
  }
  for (std::size_t r = remaining_.load(std::memory_order_acquire); r != 0;
       r = remaining_.load(std::memory_order_acquire)) {
    remaining_.wait(r, std::memory_order_acquire);
  }
  body_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

}  // namespace gpumem::tools
