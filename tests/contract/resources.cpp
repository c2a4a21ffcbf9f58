// The resources the contract suite checks.
#include "contract/resources.hpp"

#include "gpumem/cuda_resource.hpp"
#include "gpumem/pool_resource.hpp"

namespace gpumem::test {

const std::vector<resource_factory>& all_resources() {
  static const std::vector<resource_factory> list = {
      {"cuda_resource", [](int device) { return std::make_shared<cuda_resource>(device); }},
      {"pool_resource", [](int device) {
         return std::make_shared<pool_resource>(std::make_shared<cuda_resource>(device));
       }},
      {"pool_resource_small_chunks", [](int device) {
         // Many small chunks and frequent fences: exercises growth, stealing and merging.
         pool_options o;
         o.min_chunk_bytes = 1 << 20;
         o.max_chunk_bytes = 4 << 20;
         o.fence_interval = 1;
         return std::make_shared<pool_resource>(std::make_shared<cuda_resource>(device), o);
       }},
  };
  return list;
}

}  // namespace gpumem::test
