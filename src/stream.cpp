// stream_view and stream (include/gpumem/stream.hpp).
#include "gpumem/stream.hpp"

#include <utility>

#include "driver/driver.hpp"
#include "gpumem/device.hpp"
#include "gpumem/event.hpp"

namespace gpumem {

int stream_view::device() const {
  CUdevice dev{};
  if (detail::is_default_stream(handle_)) {
    // The default streams belong to whichever context is current: make sure one is.
    detail::device_context_guard guard(current_device());
    GPUMEM_CU(cuStreamGetDevice, handle_, &dev);
  } else {
    GPUMEM_CU(cuStreamGetDevice, handle_, &dev);
  }
  return static_cast<int>(dev);
}

void stream_view::synchronize() const { GPUMEM_CU(cuStreamSynchronize, handle_); }

bool stream_view::ready() const {
  CUresult r = detail::driver().cuStreamQuery(handle_);
  if (r == CUDA_ERROR_NOT_READY) return false;
  detail::check(r, "cuStreamQuery", __FILE__, __LINE__);
  return true;
}

void stream_view::wait(const event& e) const { GPUMEM_CU(cuStreamWaitEvent, handle_, e.handle(), 0); }

stream::stream(int device, flags f, int priority) {
  device_ = device == -1 ? current_device() : device;
  detail::validate_device(device_, "gpumem::stream");
  detail::device_context_guard guard(device_);
  GPUMEM_CU(cuStreamCreateWithPriority, &handle_, static_cast<unsigned>(f), priority);
}

stream::~stream() { reset(); }

stream::stream(stream&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)), device_(other.device_) {}

stream& stream::operator=(stream&& other) noexcept {
  if (this != &other) {
    reset();
    handle_ = std::exchange(other.handle_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

void stream::reset() noexcept {
  if (handle_ != nullptr) {
    // Queued work still completes after cuStreamDestroy; a failure here means the
    // driver is shutting down, and a destructor must not throw.
    (void)detail::driver().cuStreamDestroy(handle_);
    handle_ = nullptr;
  }
}

}  // namespace gpumem
