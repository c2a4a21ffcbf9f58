// Per-thread slots (per_thread.hpp, Note [Per-thread slots]).
#include "adaptors/per_thread.hpp"

#include <atomic>
#include <chrono>

namespace gpumem::detail {
namespace {

std::atomic<std::uint64_t> next_registry_id{1};
std::atomic<std::uint32_t> next_thread_id{1};

// The registries this thread holds a slot in; torn down when the thread exits.
struct attachments {
  struct entry {
    std::shared_ptr<slot_registry> registry;
    thread_slot* slot;
    slot_cache* cache;
  };
  std::vector<entry> entries;

  ~attachments();
  thread_slot* find(const slot_registry* r) const {
    for (const entry& e : entries) {
      if (e.registry.get() == r) return e.slot;
    }
    return nullptr;
  }
  void add(std::shared_ptr<slot_registry> r, thread_slot* s, slot_cache* c) {
    // Drop what closed registries left behind, so a long-lived thread that sees
    // many adaptors come and go does not keep them all.
    std::erase_if(entries, [](const entry& e) {
      if (!e.registry->closed()) return false;
      e.cache->forget(e.registry->id());
      return true;
    });
    entries.push_back({std::move(r), s, c});
  }
};

thread_local bool thread_exiting = false;
thread_local attachments this_thread_attachments;

attachments::~attachments() {
  thread_exiting = true;
  for (entry& e : entries) {
    e.cache->forget(e.registry->id());
    e.registry->detach(*e.slot);
  }
}

}  // namespace

std::shared_ptr<slot_registry> slot_registry::create(factory make) {
  return std::make_shared<slot_registry>(std::move(make));
}

slot_registry::slot_registry(factory make)
    : id_(next_registry_id.fetch_add(1, std::memory_order_relaxed)), make_(std::move(make)) {}

thread_slot& slot_registry::attach(slot_cache& cache) {
  if (!thread_exiting) {
    // Evicted from the cache by other registries: this thread has its slot already.
    if (thread_slot* mine = this_thread_attachments.find(this)) {
      cache.put(id_, mine);
      return *mine;
    }
  }
  thread_slot* slot = nullptr;
  {
    std::lock_guard lock(mutex_);
    if (!thread_exiting) {
      for (auto& s : slots_) {
        if (!s->owned_) {
          slot = s.get();
          break;
        }
      }
    }
    if (slot == nullptr) {
      slots_.push_back(make_());
      slot = slots_.back().get();
    }
    slot->owned_ = true;
  }
  if (thread_exiting) return *slot;  // never cached, never given back (see the note)
  this_thread_attachments.add(shared_from_this(), slot, &cache);
  cache.put(id_, slot);
  return *slot;
}

std::size_t slot_registry::slot_count() const {
  std::lock_guard lock(mutex_);
  return slots_.size();
}

void slot_registry::close() noexcept {
  std::lock_guard lock(mutex_);
  closed_ = true;
}

bool slot_registry::closed() const noexcept {
  std::lock_guard lock(mutex_);
  return closed_;
}

void slot_registry::detach(thread_slot& slot) noexcept {
  slot.on_thread_exit();
  std::lock_guard lock(mutex_);
  slot.owned_ = false;
}

std::uint32_t small_thread_id() noexcept {
  thread_local std::uint32_t id = next_thread_id.fetch_add(1, std::memory_order_relaxed);
  return id;
}

std::uint64_t steady_ns() noexcept {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

}  // namespace gpumem::detail
