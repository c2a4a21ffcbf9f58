// growth_mutex_type (growth_mutex.hpp).
#include "pool/growth_mutex.hpp"

#include <system_error>

namespace gpumem::detail {

growth_mutex_type::growth_mutex_type() {
  pthread_rwlockattr_t attributes;
  pthread_rwlockattr_init(&attributes);
  pthread_rwlockattr_setkind_np(&attributes, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  const int rc = pthread_rwlock_init(&lock_, &attributes);
  pthread_rwlockattr_destroy(&attributes);
  if (rc != 0) throw std::system_error(rc, std::generic_category(), "gpumem: the pool's growth mutex");
}

growth_mutex_type::~growth_mutex_type() { pthread_rwlock_destroy(&lock_); }

void growth_mutex_type::lock() {
  if (const int rc = pthread_rwlock_wrlock(&lock_); rc != 0) {
    throw std::system_error(rc, std::generic_category(), "gpumem: the pool's growth mutex");
  }
}

void growth_mutex_type::unlock() noexcept { pthread_rwlock_unlock(&lock_); }

void growth_mutex_type::lock_shared() {
  if (const int rc = pthread_rwlock_rdlock(&lock_); rc != 0) {
    throw std::system_error(rc, std::generic_category(), "gpumem: the pool's growth mutex");
  }
}

void growth_mutex_type::unlock_shared() noexcept { pthread_rwlock_unlock(&lock_); }

}  // namespace gpumem::detail
