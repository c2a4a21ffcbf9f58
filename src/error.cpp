// The error family (include/gpumem/error.hpp) and the driver-error thrower.
#include "gpumem/error.hpp"


#include "driver/cuda_loader.hpp"
#include "driver/driver.hpp"
#include "text.hpp"

namespace gpumem {

error::~error() = default;  // the key function: one vtable and typeinfo, in the library
namespace {

std::string describe(CUresult result, const std::string& api, const std::string& where) {
  std::string out = api + " failed: " + std::string(detail::error_name(result)) + " (" +
                    std::to_string(static_cast<int>(result)) + "): " +
                    std::string(detail::error_string(result));
  if (!where.empty()) out += " at " + where;
  return out;
}

std::string describe(const out_of_memory_info& i) {
  using detail::human_bytes;
  std::string out = "gpumem: out of memory: " + (i.resource.empty() ? std::string("a resource") : i.resource) +
                    " could not allocate " + std::to_string(i.requested_bytes) + " bytes (" +
                    human_bytes(i.requested_bytes) + ") on " +
                    (i.device < 0 ? std::string("the host") : "device " + std::to_string(i.device)) +
                    "; the resource holds " + human_bytes(i.resource_held_bytes);
  if (i.device >= 0 && i.device_total_bytes > 0) {
    out += "; the device has " + human_bytes(i.device_free_bytes) + " free of " + human_bytes(i.device_total_bytes);
  }
  if (!i.reason.empty()) out += "; " + i.reason;
  return out;
}

}  // namespace

cuda_error::cuda_error(CUresult result, std::string api, std::string file, int line)
    : std::runtime_error(describe(result, api, file + ":" + std::to_string(line))),
      result_(result),
      api_(std::move(api)),
      file_(std::move(file)),
      line_(line) {}

cuda_error::cuda_error(CUresult result, std::string api, std::string message)
    : std::runtime_error(api + ": " + message), result_(result), api_(std::move(api)) {}

out_of_memory::out_of_memory(out_of_memory_info info)
    : info_(std::move(info)), message_(describe(info_)) {}

namespace detail {

void throw_cuda_error(CUresult result, const char* api, const char* file, int line) {
  throw cuda_error(result, api, file, line);
}

namespace {
// The table to name errors with. Never driver(): an error raised while the backend
// is being selected (under its lock) must not select again.
const driver_api* naming_table() noexcept {
  if (const driver_api* d = driver_if_selected()) return d;
  return load_cuda_driver().table;
}
}  // namespace

std::string_view error_name(CUresult result) noexcept {
  const char* s = nullptr;
  const driver_api* d = naming_table();
  if (d != nullptr && d->cuGetErrorName(result, &s) == CUDA_SUCCESS && s != nullptr) return s;
  return "CUDA_ERROR_UNKNOWN_CODE";
}

std::string_view error_string(CUresult result) noexcept {
  const char* s = nullptr;
  const driver_api* d = naming_table();
  if (d != nullptr && d->cuGetErrorString(result, &s) == CUDA_SUCCESS && s != nullptr) return s;
  return "no description available";
}

}  // namespace detail
}  // namespace gpumem
