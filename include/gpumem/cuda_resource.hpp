// cuda_resource: device memory straight from cuMemAlloc / cuMemFree.
//
// Slow (a driver call per operation, and cuMemFree may synchronize the device)
// but simple; the upstream other resources build on. It records every live
// allocation, so foreign and double-freed pointers and size mismatches are
// reported as logic_error, and it can say what it holds.
// Thread safety: all members may be called concurrently.
#pragma once

#include <cstddef>
#include <memory>

#include "gpumem/export.hpp"
#include "gpumem/memory_resource.hpp"

namespace gpumem {

class GPUMEM_EXPORT cuda_resource final : public memory_resource {
 public:
  // Memory of `device` (-1: the current device).
  explicit cuda_resource(int device = -1);
  ~cuda_resource() override;

  int device() const noexcept;
  // Bytes handed out and not yet returned (as requested, before alignment padding).
  std::size_t allocated_bytes() const noexcept;
  std::size_t allocation_count() const noexcept;

  resource_properties properties() const noexcept override;
  std::string_view layer_name() const noexcept override { return "cuda"; }
  std::optional<std::size_t> available_bytes() const override;  // the device's free memory

 private:
  void* do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) override;
  void do_deallocate(void* ptr, std::size_t bytes, stream_view stream,
                     std::size_t alignment) override;

  struct state;
  std::unique_ptr<state> state_;
};

}  // namespace gpumem
