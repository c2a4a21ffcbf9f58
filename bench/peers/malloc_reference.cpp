// Reference row "malloc (host reference)": std::malloc / std::free behind the
// memory_resource interface. Not a peer (it hands out host memory, and is never
// the best peer): it is the host cost a device allocator's bookkeeping is held
// to, read off W2 on the same op sequence. It calls malloc as a program would,
// so it returns malloc's alignment (16 bytes with glibc on x86-64), not the
// 256 the workloads ask for; the workloads never touch the memory.
#include <cstdlib>

#include "gpumem/error.hpp"
#include "peers/peers.hpp"

namespace gpumem::bench::peers {
namespace {

class malloc_reference final : public memory_resource {
 public:
  resource_properties properties() const noexcept override {
    return {.device = -1, .device_accessible = false, .host_accessible = true, .thread_safe = true};
  }

 private:
  void* do_allocate(std::size_t bytes, stream_view, std::size_t) override {
    void* p = std::malloc(bytes);
    if (p == nullptr) [[unlikely]] {
      throw out_of_memory({.requested_bytes = bytes,
                           .device = -1,
                           .resource = "malloc (host reference)",
                           .reason = "std::malloc returned null"});
    }
    return p;
  }

  void do_deallocate(void* ptr, std::size_t, stream_view, std::size_t) override { std::free(ptr); }
};

}  // namespace

std::shared_ptr<memory_resource> make_malloc_reference(int) {
  return std::make_unique<malloc_reference>();
}

}  // namespace gpumem::bench::peers
