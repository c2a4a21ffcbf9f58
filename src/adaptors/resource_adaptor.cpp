// resource_adaptor (include/gpumem/adaptors/resource_adaptor.hpp): holding the upstream.
#include "gpumem/adaptors/resource_adaptor.hpp"

#include <string>

#include "gpumem/error.hpp"
#include "gpumem/ipc.hpp"

namespace gpumem {

resource_adaptor::resource_adaptor(memory_resource& upstream, const char*) : upstream_(&upstream) {}

resource_adaptor::resource_adaptor(std::shared_ptr<memory_resource> upstream, const char* who)
    : upstream_(upstream.get()), owned_(std::move(upstream)) {
  if (upstream_ == nullptr) throw logic_error(std::string("gpumem::") + who + ": null upstream");
}

ipc_export_route resource_adaptor::ipc_route(const void* ptr, std::size_t bytes) const {
  return upstream_->ipc_route(ptr, bytes);
}

}  // namespace gpumem
