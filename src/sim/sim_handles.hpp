// Registry of live handles (streams, events): a handle is the address of its sim
// object, but it is only ever dereferenced after being found here, so a stale or
// made-up handle is reported as CUDA_ERROR_INVALID_HANDLE instead of crashing.
#pragma once

#include <memory>
#include <mutex>
#include <unordered_map>

namespace gpumem::detail::simulator {

template <class Object>
class handle_registry {
 public:
  void add(std::shared_ptr<Object> object) {
    std::lock_guard lock(mutex_);
    const void* key = object.get();
    live_.emplace(key, std::move(object));
  }

  // The object behind a live handle, or null. Shared, so a concurrent destroy
  // cannot free it while the caller uses it.
  std::shared_ptr<Object> find(const void* handle) const {
    std::lock_guard lock(mutex_);
    auto it = live_.find(handle);
    return it == live_.end() ? nullptr : it->second;
  }

  // Removes a handle; returns the object, or null if the handle was not live.
  std::shared_ptr<Object> remove(const void* handle) {
    std::lock_guard lock(mutex_);
    auto it = live_.find(handle);
    if (it == live_.end()) return nullptr;
    std::shared_ptr<Object> object = std::move(it->second);
    live_.erase(it);
    return object;
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<const void*, std::shared_ptr<Object>> live_;
};

}  // namespace gpumem::detail::simulator
