// host_registration: existing host memory page-locked (cuMemHostRegister) for
// as long as the object lives, so that copies to and from it run at full speed
// and, when mapped, device work reads and writes it in place.
//
// The memory stays the caller's: it must outlive the registration, and must not
// overlap another registration or pinned allocation (logic_error naming
// CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED). The destructor unregisters and
// never throws; release() unregisters at once and reports failures.
// Thread safety: one object is not to be used from several threads at once;
// different objects are independent.
#pragma once

#include <cstddef>

#include "gpumem/export.hpp"

namespace gpumem {

struct registration_options {
  bool mapped = false;     // CU_MEMHOSTREGISTER_DEVICEMAP: device_pointer() is available
  bool portable = false;   // CU_MEMHOSTREGISTER_PORTABLE: page-locked for every context
  bool read_only = false;  // CU_MEMHOSTREGISTER_READ_ONLY: the device only reads it
};

class GPUMEM_EXPORT host_registration {
 public:
  // Nothing registered.
  host_registration() noexcept = default;
  // Registers [ptr, ptr + bytes) in `device`'s context (-1: the current device).
  // A null pointer or zero bytes: logic_error.
  host_registration(void* ptr, std::size_t bytes, registration_options options = {}, int device = -1);
  ~host_registration();
  host_registration(host_registration&& other) noexcept;
  host_registration& operator=(host_registration&& other) noexcept;
  host_registration(const host_registration&) = delete;
  host_registration& operator=(const host_registration&) = delete;

  bool registered() const noexcept { return ptr_ != nullptr; }
  void* data() const noexcept { return ptr_; }
  std::size_t size() const noexcept { return bytes_; }
  int device() const noexcept { return device_; }
  const registration_options& options() const noexcept { return options_; }

  // The address device work uses for the start of the range (mapped
  // registrations only; logic_error otherwise).
  void* device_pointer() const;

  // Unregisters now. logic_error if nothing is registered, or if the driver no
  // longer knows the range (it was unregistered behind gpumem's back).
  void release();

 private:
  void unregister_noexcept() noexcept;

  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  int device_ = -1;
  registration_options options_{};
};

}  // namespace gpumem
