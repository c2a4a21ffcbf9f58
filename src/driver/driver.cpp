// Backend selection and the driver() accessor every driver call goes through.
#include "driver/driver.hpp"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "driver/cuda_loader.hpp"
#include "gpumem/error.hpp"
#include "sim/sim_driver.hpp"

namespace gpumem::detail {
namespace {

std::mutex selection_mutex;

const driver_api& require_cuda() {
  const cuda_load_result& r = load_cuda_driver();
  if (r.table == nullptr) {
    throw driver_unavailable(r.result, "gpumem backend cuda", r.reason);
  }
  return *r.table;
}

backend_choice choice_from_environment(backend_choice fallback) {
  const char* env = std::getenv("GPUMEM_BACKEND");
  if (env == nullptr || *env == '\0') {
    return fallback;
  }
  std::string value(env);
  if (value == "cuda") return backend_choice::cuda;
  if (value == "sim") return backend_choice::sim;
  throw logic_error("GPUMEM_BACKEND='" + value + "' is not a backend: use 'cuda' or 'sim'");
}

const driver_api& resolve(backend_choice choice) {
  if (choice == backend_choice::from_environment) {
    choice = choice_from_environment(backend_choice::cuda);
  } else if (choice == backend_choice::cuda_or_sim) {
    choice = choice_from_environment(backend_choice::cuda_or_sim);
  }
  switch (choice) {
    case backend_choice::sim:
      return sim_driver_table();
    case backend_choice::cuda_or_sim:
      return load_cuda_driver().table != nullptr ? *load_cuda_driver().table : sim_driver_table();
    default:
      return require_cuda();
  }
}

}  // namespace

std::atomic<const driver_api*> selected_driver{nullptr};

const driver_api& select_driver() {
  std::lock_guard lock(selection_mutex);
  if (const driver_api* d = selected_driver.load(std::memory_order_acquire)) {
    return *d;
  }
  const driver_api& d = resolve(backend_choice::from_environment);
  selected_driver.store(&d, std::memory_order_release);
  return d;
}

backend_kind select(backend_choice choice) {
  std::lock_guard lock(selection_mutex);
  const driver_api* current = selected_driver.load(std::memory_order_acquire);
  auto already_in_use = [&] {
    return logic_error(std::string("gpumem::select_backend: backend '") + std::string(to_string(current->kind)) +
                       "' is already in use; select the backend before gpumem is first used");
  };
  const driver_api* resolved = nullptr;
  try {
    resolved = &resolve(choice);
  } catch (const driver_unavailable&) {
    // Asking for cuda where it cannot load, once the simulator is in use, is the
    // same mistake as any other change of backend: say that.
    if (current != nullptr) throw already_in_use();
    throw;
  }
  const driver_api& wanted = *resolved;
  if (current != nullptr && current != &wanted) throw already_in_use();
  selected_driver.store(&wanted, std::memory_order_release);
  return wanted.kind;
}

}  // namespace gpumem::detail
