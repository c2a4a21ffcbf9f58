// Every gpumem resource, as the contract suite sees it. A new resource joins the
// suite by adding one entry to all_resources() in resources.cpp.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpumem/memory_resource.hpp"

namespace gpumem::test {

struct resource_factory {
  std::string name;
  // A fresh resource on `device`.
  std::function<std::shared_ptr<memory_resource>(int device)> make;
};

const std::vector<resource_factory>& all_resources();

}  // namespace gpumem::test
