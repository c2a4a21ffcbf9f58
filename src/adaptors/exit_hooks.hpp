// Work that must happen when the process exits even if the object that owns it
// is never destroyed (the current-resource registry is leaked on purpose): a log
// flushes, a tracking adaptor reports leaks, a statistics adaptor prints its summary.
#pragma once

#include <memory>

namespace gpumem::detail {

class exit_hook {
 public:
  virtual ~exit_hook() = default;
  // Runs once at exit() (std::atexit) for every hook still alive then. May run
  // while other threads still call the object: implementations lock what they read.
  virtual void at_exit() noexcept = 0;
};

// Holds `hook` weakly: a hook whose owner is destroyed first is simply skipped.
void run_at_exit(std::weak_ptr<exit_hook> hook);

}  // namespace gpumem::detail
