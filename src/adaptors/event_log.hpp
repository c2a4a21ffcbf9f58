// event_log's machinery (include/gpumem/adaptors/logging.hpp): per-thread rings
// of binary events, turned into CSV text by whoever drains them.
//
// Note [Log rings]
// Each thread that logs owns one ring (a slot, Note [Per-thread slots]). Only the
// owner pushes: it writes the record at head, then publishes head with a release
// store. Draining may happen on any thread (the owner when its ring is full or a
// second has passed since it last drained, flush(), the log's destructor, the
// exit hook), always under the ring's drain mutex: the drainer reads head with
// acquire, formats records [tail, head), and only then releases tail. The owner
// reads tail with acquire before reusing a cell, so a cell is never overwritten
// while it is being formatted. The owner never takes the drain mutex except to
// drain its own full ring, so the hot path has no lock and no shared write but
// the sequence counter.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "adaptors/exit_hooks.hpp"
#include "adaptors/log_format.hpp"
#include "adaptors/per_thread.hpp"
#include "gpumem/adaptors/logging.hpp"

namespace gpumem {

struct log_event {
  std::uint64_t seq;
  std::uint64_t time_ns;
  std::uintptr_t stream;
  std::uintptr_t ptr;
  std::uint64_t bytes;
  std::uint64_t alignment;
  void* site;
  std::uint32_t thread;
  std::int32_t device;
  std::uint16_t source;
  detail::log_op op;
  detail::log_outcome outcome;
};

struct event_log::impl final : detail::exit_hook, std::enable_shared_from_this<event_log::impl> {
  static constexpr std::size_t ring_capacity = 4096;  // events; 256 KiB per thread and log
  static constexpr std::uint64_t drain_interval_ns = 1'000'000'000;

  struct ring final : detail::thread_slot {
    explicit ring(std::weak_ptr<impl> o) : owner(std::move(o)), cells(ring_capacity) {}
    void on_thread_exit() noexcept override {
      if (auto o = owner.lock()) o->drain(*this);
    }
    std::weak_ptr<impl> owner;
    std::vector<log_event> cells;
    alignas(64) std::atomic<std::uint64_t> head{0};  // owner writes
    alignas(64) std::atomic<std::uint64_t> tail{0};  // drainers write, under drain_mutex
    std::mutex drain_mutex;
    std::uint64_t last_drain_ns = 0;  // owner's
  };

  impl(std::string path, int fd);
  ~impl() override;

  // The calling thread's ring.
  ring& local();
  std::uint64_t next_seq() noexcept { return seq.fetch_add(1, std::memory_order_relaxed) + 1; }
  std::uint64_t now() const noexcept { return detail::steady_ns() - start_ns; }
  // Owner only.
  void push(ring& r, const log_event& e);
  void drain(ring& r) noexcept;
  void drain_all() noexcept;
  std::uint16_t intern_source(const std::string& name);
  void write(const std::string& text) noexcept;
  void at_exit() noexcept override { drain_all(); }

  const std::string path;
  int fd;
  const std::uint64_t start_ns;
  alignas(64) std::atomic<std::uint64_t> seq{0};
  std::shared_ptr<detail::slot_registry> rings;
  std::mutex file_mutex;  // the file, write_failed
  bool write_failed = false;
  std::mutex sources_mutex;
  std::vector<std::string> sources;
};

}  // namespace gpumem
