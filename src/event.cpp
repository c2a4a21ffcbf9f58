// event (include/gpumem/event.hpp).
#include "gpumem/event.hpp"

#include <utility>

#include "driver/driver.hpp"
#include "gpumem/device.hpp"

namespace gpumem {

event::event(int device, bool timing) {
  device_ = device == -1 ? current_device() : device;
  detail::validate_device(device_, "gpumem::event");
  detail::device_context_guard guard(device_);
  GPUMEM_CU(cuEventCreate, &handle_, timing ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING);
}

event::~event() { reset(); }

event::event(event&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)), device_(other.device_) {}

event& event::operator=(event&& other) noexcept {
  if (this != &other) {
    reset();
    handle_ = std::exchange(other.handle_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

void event::reset() noexcept {
  if (handle_ != nullptr) {
    (void)detail::driver().cuEventDestroy(handle_);  // never throws from a destructor
    handle_ = nullptr;
  }
}

void event::record(stream_view s) {
  detail::device_context_guard guard(device_);
  GPUMEM_CU(cuEventRecord, handle_, s.handle());
}

bool event::ready() const {
  CUresult r = detail::driver().cuEventQuery(handle_);
  if (r == CUDA_ERROR_NOT_READY) return false;
  detail::check(r, "cuEventQuery", __FILE__, __LINE__);
  return true;
}

void event::synchronize() const { GPUMEM_CU(cuEventSynchronize, handle_); }

float event::elapsed_ms(const event& start, const event& end) {
  float ms = 0.0F;
  GPUMEM_CU(cuEventElapsedTime, &ms, start.handle_, end.handle_);
  return ms;
}

}  // namespace gpumem
