// Per-thread slots: the machinery that keeps the statistics and logging
// adaptors' hot paths free of shared locks and atomic read-modify-writes.
//
// Note [Per-thread slots]
// An adaptor that counts or records every call keeps its hot-path state in one
// slot per thread. Only the owning thread writes its slot (relaxed loads and
// stores, no lock prefix); readers (statistics(), a log flush) visit every slot
// under the registry's mutex and read the slots' atomics. A thread finds its slot
// through a one-entry thread-local cache keyed by the registry's id, which is
// unique for the process's life (never an address, which a later adaptor may reuse).
//
// Lifetime. The registry is shared: the adaptor holds it, and so does every
// thread that has a slot in it (through a thread-local list of attachments). The
// slot a cached pointer names therefore lives as long as the thread can use the
// cache. When a thread exits, its attachments call on_thread_exit() on each slot
// (a log flushes its buffer) and mark the slot free; the next new thread adopts it
// instead of growing the registry, so programs that start and end many threads
// keep a registry as large as their most threads alive at once. Ownership passes
// from the old thread to the new one under the registry mutex, which orders the
// old owner's plain writes before the new owner's.
//
// A thread that uses an adaptor from a thread-local destructor after its
// attachments were torn down gets a fresh slot each time, never cached and
// never reused (rare; it keeps those calls correct).
#pragma once

#include <cstdint>
#include <utility>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace gpumem::detail {

class thread_slot {
 public:
  virtual ~thread_slot() = default;
  // On the owning thread as it exits (and for every slot when the registry closes).
  virtual void on_thread_exit() noexcept {}

 private:
  friend class slot_registry;
  bool owned_ = true;  // guarded by the registry's mutex
};

// What a thread caches to find its slots without a lock: the two registries it
// used last (two, so that stacked adaptors of one kind, statistics over a pool
// over statistics, do not evict each other on every call).
struct slot_cache {
  std::uint64_t registry_id[2] = {0, 0};
  thread_slot* slot[2] = {nullptr, nullptr};

  thread_slot* find(std::uint64_t id) noexcept {
    if (registry_id[0] == id) [[likely]] return slot[0];
    if (registry_id[1] == id) {
      std::swap(registry_id[0], registry_id[1]);
      std::swap(slot[0], slot[1]);
      return slot[0];
    }
    return nullptr;
  }
  void put(std::uint64_t id, thread_slot* s) noexcept {
    registry_id[1] = registry_id[0];
    slot[1] = slot[0];
    registry_id[0] = id;
    slot[0] = s;
  }
  void forget(std::uint64_t id) noexcept {
    for (int i = 0; i < 2; ++i) {
      if (registry_id[i] == id) {
        registry_id[i] = 0;
        slot[i] = nullptr;
      }
    }
  }
};

class slot_registry : public std::enable_shared_from_this<slot_registry> {
 public:
  using factory = std::function<std::unique_ptr<thread_slot>()>;
  static std::shared_ptr<slot_registry> create(factory make);

  std::uint64_t id() const noexcept { return id_; }

  // The calling thread's slot (the slow path): the one it already has, else one
  // adopted or made under the mutex. `cache` is the caller's thread-local cache;
  // it is filled, and cleared when the thread exits.
  thread_slot& attach(slot_cache& cache);

  // f(slot) for every slot, under the mutex.
  template <class F>
  void for_each(F&& f) {
    std::lock_guard lock(mutex_);
    for (auto& s : slots_) f(*s);
  }
  // Slots ever made (threads that used it, less those adopted).
  std::size_t slot_count() const;

  // The owner is gone: threads drop their attachments to it when they next attach anything.
  void close() noexcept;
  bool closed() const noexcept;

  // Called by a thread's attachments as it exits.
  void detach(thread_slot& slot) noexcept;

  explicit slot_registry(factory make);  // use create()

 private:
  const std::uint64_t id_;
  factory make_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<thread_slot>> slots_;
  bool closed_ = false;
};

// Looks the calling thread's slot up: the cache first, then the registry.
template <class Slot>
inline Slot& local_slot(slot_registry& r, slot_cache& cache) {
  if (thread_slot* s = cache.find(r.id())) [[likely]] return static_cast<Slot&>(*s);
  return static_cast<Slot&>(r.attach(cache));
}

// A small number for the calling thread, 1, 2, 3... in order of first use; never reused.
std::uint32_t small_thread_id() noexcept;

// Nanoseconds on the steady clock.
std::uint64_t steady_ns() noexcept;

}  // namespace gpumem::detail
