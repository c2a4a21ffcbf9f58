// The resources the contract suite checks.
#include "contract/resources.hpp"

#include "gpumem/cuda_resource.hpp"

namespace gpumem::test {

const std::vector<resource_factory>& all_resources() {
  static const std::vector<resource_factory> list = {
      {"cuda_resource", [](int device) { return std::make_shared<cuda_resource>(device); }},
  };
  return list;
}

}  // namespace gpumem::test
