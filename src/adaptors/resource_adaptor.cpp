// resource_adaptor (include/gpumem/adaptors/resource_adaptor.hpp): holding the upstream.
#include "gpumem/adaptors/resource_adaptor.hpp"

#include <string>

#include "gpumem/error.hpp"

namespace gpumem {

resource_adaptor::resource_adaptor(memory_resource& upstream, const char*) : upstream_(&upstream) {}

resource_adaptor::resource_adaptor(std::shared_ptr<memory_resource> upstream, const char* who)
    : upstream_(upstream.get()), owned_(std::move(upstream)) {
  if (upstream_ == nullptr) throw logic_error(std::string("gpumem::") + who + ": null upstream");
}

}  // namespace gpumem
