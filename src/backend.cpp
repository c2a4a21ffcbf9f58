// Public face of backend selection (include/gpumem/backend.hpp).
#include "gpumem/backend.hpp"

#include "driver/cuda_loader.hpp"
#include "driver/driver.hpp"

namespace gpumem {
namespace detail {
backend_kind select(backend_choice choice);
}

backend_kind select_backend(backend_choice choice) { return detail::select(choice); }

backend_kind current_backend() { return detail::driver().kind; }

bool cuda_driver_usable() noexcept { return detail::load_cuda_driver().table != nullptr; }

std::string_view to_string(backend_kind kind) noexcept {
  return kind == backend_kind::sim ? "sim" : "cuda";
}

}  // namespace gpumem
