// A thread of its own that runs calls one at a time, each to completion before
// run() returns: for tests where which host thread makes a call matters (a
// pool's streams driven by one thread or by several).
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

namespace gpumem::test {

class worker {
 public:
  worker() : thread_([this] { serve(); }) {}
  ~worker() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    ready_.notify_all();
    thread_.join();
  }
  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;

  // Runs f on the worker's thread and returns what it returns (or throws what it threw).
  template <class F>
  auto run(F f) -> decltype(f()) {
    std::packaged_task<decltype(f())()> task(std::move(f));
    auto result = task.get_future();
    {
      std::lock_guard lock(mutex_);
      job_ = [&task] { task(); };
    }
    ready_.notify_all();
    return result.get();
  }

 private:
  void serve() {
    std::unique_lock lock(mutex_);
    for (;;) {
      ready_.wait(lock, [&] { return done_ || job_ != nullptr; });
      if (job_ == nullptr) return;
      std::function<void()> job = std::move(job_);
      job_ = nullptr;
      lock.unlock();
      job();
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::function<void()> job_;
  bool done_ = false;
  std::thread thread_;  // last: starts once the rest is built
};

}  // namespace gpumem::test
