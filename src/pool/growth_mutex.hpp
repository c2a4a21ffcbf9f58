// The pools' growth mutex (stream_ordered_pool.hpp).
#pragma once

#include <pthread.h>

namespace gpumem::detail {

// The growth mutex: held exclusively to grow and give back, shared only to
// reuse a slot with swaps across streams after an absorb (a slot that needs
// swaps within its arena takes none: Note [Reusing a slot on the hot path],
// src/vmm/page_slots.cpp). A read-write lock that prefers writers: one that prefers
// readers (std::shared_mutex on glibc) lets new shared holders in past a
// waiting exclusive one, so threads that keep reusing slots would starve a
// thread that must grow or trim (docs/vmm.md, "Slots"). Shared holds are never
// nested, as a writer-preferring lock requires.
class growth_mutex_type {
 public:
  growth_mutex_type();
  ~growth_mutex_type();
  growth_mutex_type(const growth_mutex_type&) = delete;
  growth_mutex_type& operator=(const growth_mutex_type&) = delete;
  void lock();
  void unlock() noexcept;
  void lock_shared();
  void unlock_shared() noexcept;

 private:
  pthread_rwlock_t lock_;
};

}  // namespace gpumem::detail
