// Which driver backend gpumem talks to: the real CUDA driver (libcuda.so.1,
// loaded at run time) or the host simulator. Chosen once per process.
#pragma once

#include <string_view>

#include "gpumem/export.hpp"

namespace gpumem {

enum class backend_kind { cuda, sim };

enum class backend_choice {
  from_environment,  // GPUMEM_BACKEND=cuda|sim; cuda when unset
  cuda,
  sim,
  cuda_or_sim,  // GPUMEM_BACKEND if set, else cuda when a driver and a GPU are usable, else sim
};

// Selects the backend. Call before gpumem is first used; later calls that
// would change the selection throw gpumem::logic_error. Returns what is in use.
// Throws gpumem::driver_unavailable when cuda is asked for and cannot be used.
GPUMEM_EXPORT backend_kind select_backend(backend_choice choice = backend_choice::from_environment);

// The backend in use (selects from the environment if nothing was selected yet).
GPUMEM_EXPORT backend_kind current_backend();

// True when libcuda.so.1 loads, cuInit succeeds and at least one GPU exists.
// Does not select a backend.
GPUMEM_EXPORT bool cuda_driver_usable() noexcept;

GPUMEM_EXPORT std::string_view to_string(backend_kind kind) noexcept;

}  // namespace gpumem
