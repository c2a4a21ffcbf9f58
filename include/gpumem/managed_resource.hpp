// managed_resource: managed (unified) memory from cuMemAllocManaged, usable
// from the host and from every device that supports managed memory; freed with
// cuMemFree, which waits for the device, so frees are stream-ordered.
//
// A request larger than the device's total memory is out_of_memory at once
// (the contract's rule), although a GPU with concurrent managed access could
// oversubscribe it; several allocations may still add up to more.
// Thread safety: all members may be called concurrently.
#pragma once

#include <cstddef>
#include <memory>

#include "gpumem/export.hpp"
#include "gpumem/memory_resource.hpp"

namespace gpumem {

// The default stream association of new allocations (cuMemAllocManaged's flags).
enum class managed_attach {
  global,  // CU_MEM_ATTACH_GLOBAL: any stream on any device may use it
  host,    // CU_MEM_ATTACH_HOST: devices without concurrent managed access must attach it first
};

class GPUMEM_EXPORT managed_resource final : public memory_resource {
 public:
  // Memory associated with `device` (-1: the current device). The device must
  // support managed memory, else cuda_error (CUDA_ERROR_NOT_SUPPORTED).
  explicit managed_resource(int device = -1, managed_attach attach = managed_attach::global);
  ~managed_resource() override;

  int device() const noexcept;
  managed_attach attach() const noexcept;
  // Bytes handed out and not yet returned (as requested), and how many allocations.
  std::size_t allocated_bytes() const noexcept;
  std::size_t allocation_count() const noexcept;

  resource_properties properties() const noexcept override;
  std::string_view layer_name() const noexcept override { return "managed"; }
  ipc_export_route ipc_route(const void* ptr, std::size_t bytes) const override;  // refused

 private:
  void* do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) override;
  void do_deallocate(void* ptr, std::size_t bytes, stream_view stream,
                     std::size_t alignment) override;

  struct state;
  std::unique_ptr<state> state_;
};

}  // namespace gpumem
