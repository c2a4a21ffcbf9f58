// The OS threads a replay runs on, and how they hand the turn to one another.
#pragma once

#include <atomic>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace gpumem::tools {

// Threads a caller keeps across replays (replay_options::threads), so that the
// replays of a log on one resource run on the same OS threads, as a program's
// later steps do: what a resource keeps per thread (a thread's cache, its arena)
// is found again, and no replay pays for starting threads or for waking the
// caller when they end.
class replay_threads {
 public:
  replay_threads();
  ~replay_threads();
  replay_threads(const replay_threads&) = delete;
  replay_threads& operator=(const replay_threads&) = delete;

  // Runs body(k) on kept thread k, for every k < n at once, and returns when all
  // have returned; thread k is the same OS thread on every call. Starts the
  // threads that are missing first: std::system_error when the OS refuses one,
  // before any body runs. An exception a body lets out is rethrown here (the first).
  void run(std::size_t n, const std::function<void(std::size_t)>& body);

  std::size_t size() const noexcept { return workers_.size(); }

 private:
  struct worker;
  void work(worker& w);

  std::vector<std::unique_ptr<worker>> workers_;
  const std::function<void(std::size_t)>* body_ = nullptr;  // the job of the current run
  std::atomic<std::size_t> remaining_{0};                   // bodies of the current run still running
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

// Waits until `word` (which only grows) reaches `wanted`, and returns what it
// read. With may_spin (the replay's threads leave a core free) it spins for a
// while first (Note [Handing the turn over] in replay_threads.cpp), then yields,
// then sleeps on `word`: the one that raises it must notify it.
std::size_t await_at_least(const std::atomic<std::size_t>& word, std::size_t wanted, bool may_spin);

}  // namespace gpumem::tools
