// Exit hooks (exit_hooks.hpp): one std::atexit handler for every adaptor.
#include "adaptors/exit_hooks.hpp"

#include <cstdlib>
#include <mutex>
#include <vector>

namespace gpumem::detail {
namespace {

struct hook_list {
  std::mutex mutex;
  std::vector<std::weak_ptr<exit_hook>> hooks;
  bool ran = false;
};

// Leaked: the handler runs after static destructors may have begun.
hook_list& hooks() {
  static auto* h = new hook_list;
  return *h;
}

void run_all() {
  std::vector<std::shared_ptr<exit_hook>> alive;
  {
    hook_list& h = hooks();
    std::lock_guard lock(h.mutex);
    h.ran = true;
    for (auto& w : h.hooks) {
      if (auto s = w.lock()) alive.push_back(std::move(s));
    }
    h.hooks.clear();
  }
  for (auto& s : alive) s->at_exit();
}

}  // namespace

void run_at_exit(std::weak_ptr<exit_hook> hook) {
  static std::once_flag registered;
  std::call_once(registered, [] { std::atexit(run_all); });
  hook_list& h = hooks();
  std::lock_guard lock(h.mutex);
  if (h.ran) return;
  std::erase_if(h.hooks, [](const std::weak_ptr<exit_hook>& w) { return w.expired(); });
  h.hooks.push_back(std::move(hook));
}

}  // namespace gpumem::detail
