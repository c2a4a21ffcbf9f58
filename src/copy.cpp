// gpumem::copy (include/gpumem/copy.hpp).
#include "gpumem/copy.hpp"

#include <cstdint>
#include <string>

#include "driver/driver.hpp"
#include "gpumem/error.hpp"

namespace gpumem {

void copy(void* destination, const void* source, std::size_t bytes, stream_view stream) {
  if (bytes == 0) return;
  if (destination == nullptr || source == nullptr) {
    throw logic_error("gpumem::copy: a null " + std::string(destination == nullptr ? "destination" : "source") +
                      " for " + std::to_string(bytes) + " bytes");
  }
  detail::device_context_guard guard(stream.device());
  GPUMEM_CU(cuMemcpyAsync, static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(destination)),
            static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(source)), bytes, stream.handle());
}

}  // namespace gpumem
