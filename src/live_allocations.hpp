// A resource's record of the allocations it handed out, so that a foreign,
// interior, double-freed or resized pointer is a logic_error instead of
// undefined behaviour in the driver. Sharded by address: threads freeing
// different pointers rarely meet on a lock, and no lock is held across a
// driver call (callers take an entry out, call the driver, and put it back if
// the driver refused).
#pragma once

#include "text.hpp"

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpumem/error.hpp"

namespace gpumem::detail {

class live_allocations {
 public:
  struct entry {
    void* base = nullptr;  // what the driver handed out (before alignment padding)
    std::size_t bytes = 0;  // what the caller asked for
  };

  void insert(void* user, entry e) {
    shard& s = shard_of(user);
    {
      std::lock_guard lock(s.mutex);
      s.map.emplace(reinterpret_cast<std::uintptr_t>(user), e);
    }
    bytes_.fetch_add(e.bytes, std::memory_order_relaxed);
    count_.fetch_add(1, std::memory_order_relaxed);
  }

  // Records `user`, dropping a record already there (whose allocation the caller
  // knows is gone: graph_allocations.cpp, Note [Freeing a graph's allocation]).
  void replace(void* user, entry e) {
    shard& s = shard_of(user);
    std::size_t dropped_bytes = 0;
    bool dropped = false;
    {
      std::lock_guard lock(s.mutex);
      auto [it, inserted] = s.map.try_emplace(reinterpret_cast<std::uintptr_t>(user), e);
      if (!inserted) {
        dropped = true;
        dropped_bytes = it->second.bytes;
        it->second = e;
      }
    }
    bytes_.fetch_add(e.bytes, std::memory_order_relaxed);
    if (dropped) {
      bytes_.fetch_sub(dropped_bytes, std::memory_order_relaxed);
    } else {
      count_.fetch_add(1, std::memory_order_relaxed);
    }
  }

  // Takes the entry of `user` out; logic_error (prefixed with `where`) for a
  // pointer that is not live here or whose size is not `bytes`.
  entry take(void* user, std::size_t bytes, const char* where) {
    shard& s = shard_of(user);
    entry e;
    {
      std::lock_guard lock(s.mutex);
      auto it = s.map.find(reinterpret_cast<std::uintptr_t>(user));
      if (it == s.map.end()) {
        throw logic_error(std::string(where) + ": pointer " + hex(user) +
                          " was not allocated by this resource, or was already freed");
      }
      if (it->second.bytes != bytes) {
        throw logic_error(std::string(where) + ": pointer " + hex(user) + " has " +
                          std::to_string(it->second.bytes) + " bytes, not " + std::to_string(bytes));
      }
      e = it->second;
      s.map.erase(it);
    }
    bytes_.fetch_sub(e.bytes, std::memory_order_relaxed);
    count_.fetch_sub(1, std::memory_order_relaxed);
    return e;
  }

  // Whether `user` is live here (for queries that need no size).
  bool contains(const void* user) const {
    const shard& s = shard_of(user);
    std::lock_guard lock(s.mutex);
    return s.map.count(reinterpret_cast<std::uintptr_t>(user)) != 0;
  }

  std::size_t bytes() const noexcept { return bytes_.load(std::memory_order_relaxed); }
  std::size_t count() const noexcept { return count_.load(std::memory_order_relaxed); }

  // Everything still live, removed (for destructors).
  std::vector<entry> drain() {
    std::vector<entry> out;
    for (shard& s : shards_) {
      std::lock_guard lock(s.mutex);
      for (auto& [user, e] : s.map) out.push_back(e);
      s.map.clear();
    }
    bytes_.store(0, std::memory_order_relaxed);
    count_.store(0, std::memory_order_relaxed);
    return out;
  }

  static std::string hex(const void* p) { return pointer_text(p); }

 private:
  static constexpr std::size_t shard_count = 16;
  struct shard {
    mutable std::mutex mutex;
    std::unordered_map<std::uintptr_t, entry> map;
  };
  shard& shard_of(const void* p) { return shards_[index(p)]; }
  const shard& shard_of(const void* p) const { return shards_[index(p)]; }
  static std::size_t index(const void* p) {
    // Allocations are at least 256-byte aligned: the low bits carry nothing.
    const auto a = reinterpret_cast<std::uintptr_t>(p) >> 8;
    return (a ^ (a >> 4) ^ (a >> 12)) % shard_count;
  }

  std::array<shard, shard_count> shards_;
  std::atomic<std::size_t> bytes_{0};
  std::atomic<std::size_t> count_{0};
};

}  // namespace gpumem::detail
