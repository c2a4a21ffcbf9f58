// The replay's threads: kept threads are the same OS threads from replay to
// replay, hand the turn over in the log's order, and an error in one of them ends
// the replay instead of leaving the others waiting for a turn that never comes.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/event_log_reader.hpp"
#include "gpumem/memory_resource.hpp"
#include "replay/replay.hpp"
#include "replay/replay_threads.hpp"

namespace gpumem::test {
namespace {

using tools::logged_event;
using tools::replay_events_on;
using tools::replay_options;
using tools::replay_order;
using tools::replay_threads;

// Hands out addresses from a counter, notes which OS thread made each call and
// in what order the calls came, and throws on the free of `poisoned` (and, when
// `fails_after_poison`, on every free after that one, as a resource left broken
// by its first error would).
class recording_resource final : public memory_resource {
 public:
  resource_properties properties() const noexcept override {
    return {.device = 0, .device_accessible = true, .host_accessible = false, .thread_safe = true};
  }
  std::set<std::thread::id> threads() const {
    std::lock_guard lock(mutex_);
    return threads_;
  }
  std::vector<std::size_t> order() const {
    std::lock_guard lock(mutex_);
    return order_;
  }
  void* poisoned = nullptr;
  bool fails_after_poison = false;

 private:
  void note(std::size_t bytes) {
    std::lock_guard lock(mutex_);
    threads_.insert(std::this_thread::get_id());
    order_.push_back(bytes);
  }
  void* do_allocate(std::size_t bytes, stream_view, std::size_t) override {
    note(bytes);
    return reinterpret_cast<void*>(next_.fetch_add(1 << 20));
  }
  void do_deallocate(void* p, std::size_t bytes, stream_view, std::size_t) override {
    note(bytes);
    if (fails_after_poison && poison_seen_.load()) throw std::runtime_error("a free after the poisoned one");
    if (p == poisoned) {
      poison_seen_.store(true);
      throw std::runtime_error("the poisoned pointer");
    }
  }
  mutable std::mutex mutex_;
  std::set<std::thread::id> threads_;
  std::vector<std::size_t> order_;
  std::atomic<std::uintptr_t> next_{std::uintptr_t{1} << 40};
  std::atomic<bool> poison_seen_{false};
};

// `threads` logged threads taking turns, each allocating then freeing; the k-th
// call of the log asks for k + 1 bytes, so the order the resource sees is checkable.
std::vector<logged_event> turns_log(std::uint32_t threads, std::size_t rounds) {
  std::vector<logged_event> events;
  std::uint64_t seq = 0;
  for (std::size_t r = 0; r < rounds; ++r) {
    for (std::uint32_t t = 1; t <= threads; ++t) {
      const std::uint64_t ptr = 0x1000 * (r * threads + t);
      for (const bool allocate : {true, false}) {
        events.push_back(logged_event{.seq = ++seq, .thread = t, .source = "app", .allocate = allocate,
                                      .ptr = ptr, .bytes = seq, .outcome = "ok", .site = {}, .line = 0});
      }
    }
  }
  return events;
}

TEST(ReplayThreads, KeptThreadsAreTheSameOsThreadsInEveryReplay) {
  const auto events = turns_log(3, 50);
  recording_resource first, second;
  replay_threads kept;
  replay_options o;
  o.threads = &kept;
  replay_events_on(events, first, o);
  replay_events_on(events, second, o);
  EXPECT_EQ(kept.size(), 3U);
  EXPECT_EQ(first.threads().size(), 3U);
  EXPECT_EQ(first.threads(), second.threads()) << "the second replay ran on other threads";
  EXPECT_EQ(first.threads().count(std::this_thread::get_id()), 0U);
}

TEST(ReplayThreads, TheResourceSeesTheLogsOrderWithKeptThreads) {
  const auto events = turns_log(4, 200);
  replay_threads kept;
  replay_options o;
  o.threads = &kept;
  for (int replay = 0; replay < 3; ++replay) {
    recording_resource mr;
    const auto r = replay_events_on(events, mr, o);
    EXPECT_EQ(r.replayed, events.size());
    const std::vector<std::size_t> order = mr.order();
    ASSERT_EQ(order.size(), events.size());
    for (std::size_t k = 0; k < order.size(); ++k) ASSERT_EQ(order[k], k + 1) << "call " << k << ", replay " << replay;
    EXPECT_GT(r.seconds, 0.0);
  }
}

// Before, a thread whose call threw left the others waiting for their turn for
// ever; now the replay ends and says what went wrong.
TEST(ReplayThreads, AnErrorInOneThreadEndsTheReplay) {
  const auto events = turns_log(3, 20);
  for (const bool keep : {false, true}) {
    recording_resource mr;
    mr.poisoned = reinterpret_cast<void*>((std::uintptr_t{1} << 40) + 7 * (1 << 20));  // the 8th allocation
    replay_threads kept;
    replay_options o;
    o.order = replay_order::seq;
    if (keep) o.threads = &kept;
    EXPECT_THROW(replay_events_on(events, mr, o), std::runtime_error) << "keep " << keep;
    EXPECT_LT(mr.order().size(), events.size()) << "the replay went on after the error";
  }
}

// After a worker's error the replay frees what the log left live; a resource
// that fails again there must not hide the first error behind its second.
TEST(ReplayThreads, TheWorkersErrorIsReportedWhenTheCleanUpFailsToo) {
  const auto events = turns_log(3, 20);
  for (const bool keep : {false, true}) {
    recording_resource mr;
    mr.poisoned = reinterpret_cast<void*>((std::uintptr_t{1} << 40) + 7 * (1 << 20));  // the 8th allocation
    mr.fails_after_poison = true;
    replay_threads kept;
    replay_options o;
    o.order = replay_order::seq;
    if (keep) o.threads = &kept;
    try {
      replay_events_on(events, mr, o);
      ADD_FAILURE() << "the replay did not report the error, keep " << keep;
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "the poisoned pointer") << "keep " << keep;
    }
    // The clean-up still tried to free what was live: the poisoned allocation,
    // the log's 15th call (its free was the 16th).
    ASSERT_FALSE(mr.order().empty());
    EXPECT_EQ(mr.order().back(), 15U) << "keep " << keep;
  }
}

TEST(ReplayThreads, RunCallsEveryBodyOnceOnItsOwnThreadAndRethrows) {
  replay_threads kept;
  std::mutex mutex;
  std::vector<std::pair<std::size_t, std::thread::id>> seen;
  const std::function<void(std::size_t)> note = [&](std::size_t k) {
    std::lock_guard lock(mutex);
    seen.emplace_back(k, std::this_thread::get_id());
  };
  kept.run(4, note);
  ASSERT_EQ(seen.size(), 4U);
  std::set<std::size_t> indices;
  std::set<std::thread::id> ids;
  for (const auto& [k, id] : seen) {
    indices.insert(k);
    ids.insert(id);
  }
  EXPECT_EQ(indices, (std::set<std::size_t>{0, 1, 2, 3}));
  EXPECT_EQ(ids.size(), 4U);
  // Fewer bodies than kept threads: the first ones run, on the same threads as before.
  const auto before = seen;
  seen.clear();
  kept.run(2, note);
  ASSERT_EQ(seen.size(), 2U);
  for (const auto& [k, id] : seen) {
    for (const auto& [k0, id0] : before) {
      if (k0 == k) {
        EXPECT_EQ(id0, id) << "body " << k;
      }
    }
  }
  // An exception out of a body comes back from run(), and the threads stay usable.
  const std::function<void(std::size_t)> throws = [](std::size_t k) {
    if (k == 1) throw std::logic_error("body 1");
  };
  EXPECT_THROW(kept.run(3, throws), std::logic_error);
  seen.clear();
  kept.run(4, note);
  EXPECT_EQ(seen.size(), 4U);
  EXPECT_EQ(kept.size(), 4U);
}

TEST(ReplayThreads, AwaitReturnsOnceTheWordIsReachedSpinningOrNot) {
  for (const bool may_spin : {true, false}) {
    std::atomic<std::size_t> word{0};
    std::thread raiser([&] {
      for (std::size_t v = 1; v <= 5; ++v) {
        std::this_thread::sleep_for(std::chrono::microseconds(v * 200));  // past the spin, at the end
        word.store(v, std::memory_order_release);
        word.notify_all();
      }
    });
    EXPECT_GE(tools::await_at_least(word, 3, may_spin), 3U);
    EXPECT_EQ(tools::await_at_least(word, 5, may_spin), 5U);
    EXPECT_EQ(tools::await_at_least(word, 2, may_spin), 5U) << "already reached: returns at once";
    raiser.join();
  }
}

}  // namespace
}  // namespace gpumem::test
