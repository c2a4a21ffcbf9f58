// resource_adaptor: what every gpumem adaptor shares. An adaptor is a
// memory_resource that adds one thing (statistics, tracking, a log, a limit,
// OOM retry, deferred frees, a lock) to any upstream resource and forwards the
// rest. Adaptors compose: statistics_adaptor over logging_adaptor over a pool.
//
// The upstream is either borrowed (a reference: it must outlive the adaptor) or
// shared (a shared_ptr: the adaptor keeps it alive), as pool_resource takes it.
// properties() are the upstream's unless the adaptor says otherwise (only
// thread_safe_adaptor changes them). An adaptor is equal only to itself: memory
// it handed out goes back through it, so that what it adds stays correct.
//
// Note [Adaptors call the upstream's do_allocate]
// memory_resource::allocate checks its arguments and then calls do_allocate. By
// the time an adaptor's do_allocate runs, its own allocate has checked the very
// arguments it passes on, and the checks depend on nothing else. So adaptors call
// the upstream's do_allocate / do_deallocate directly (upstream_allocate below):
// a virtual call, with neither the checks again nor the call through the shared
// library's symbol table that the exported allocate costs. That is half of what a
// statistics adaptor over a pool costs (docs/observability.md).
#pragma once

#include <cstddef>
#include <memory>

#include "gpumem/export.hpp"
#include "gpumem/memory_resource.hpp"

namespace gpumem {

class GPUMEM_EXPORT resource_adaptor : public memory_resource {
 public:
  memory_resource& upstream() const noexcept { return *upstream_; }
  // The upstream's owner when the adaptor was given a shared_ptr; null when borrowed.
  const std::shared_ptr<memory_resource>& shared_upstream() const noexcept { return owned_; }
  resource_properties properties() const noexcept override { return upstream_->properties(); }
  // Capabilities are the upstream's (memory_resource.hpp).
  std::optional<std::size_t> available_bytes() const override { return upstream_->available_bytes(); }
  std::size_t release_free_memory() override { return upstream_->release_free_memory(); }
  ipc_export_route ipc_route(const void* ptr, std::size_t bytes) const override;
  std::string_view layer_name() const noexcept override { return "adaptor"; }
  const memory_resource* next_layer() const noexcept override { return upstream_; }

 protected:
  // The upstream's do_allocate / do_deallocate, for arguments already checked
  // (see the note above). Taking the member pointer through resource_adaptor is
  // what the language allows a derived class to do with a protected member.
  void* upstream_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) {
    return (upstream_->*(&resource_adaptor::do_allocate))(bytes, stream, alignment);
  }
  void upstream_deallocate(void* ptr, std::size_t bytes, stream_view stream, std::size_t alignment) {
    (upstream_->*(&resource_adaptor::do_deallocate))(ptr, bytes, stream, alignment);
  }

  // `who` names the adaptor in the logic_error thrown for a null upstream.
  resource_adaptor(memory_resource& upstream, const char* who);
  resource_adaptor(std::shared_ptr<memory_resource> upstream, const char* who);

 private:
  memory_resource* upstream_;
  std::shared_ptr<memory_resource> owned_;
};

}  // namespace gpumem
