// Resource stacks from the GPUMEM_CONF grammar (include/gpumem/config.hpp,
// docs/configuration.md); gpumem.make_resource and gpumem.reinitialize build on these.
#include <optional>
#include <string>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>

#include "bindings.hpp"
#include "gpumem/config.hpp"

namespace gpumem::python {

void bind_config(nb::module_& m) {
  m.def(
      "make_resource",
      [](const std::string& conf, std::optional<int> device) {
        nb::gil_scoped_release release;
        return make_resource_from_config(conf, device.value_or(-1));
      },
      nb::arg("conf"), nb::arg("device") = nb::none(),
      "The resource stack `conf` describes (GPUMEM_CONF grammar, docs/configuration.md) on "
      "`device` (None: the current device). LogicError naming the token for a bad string.");
  m.def(
      "describe_config", [](const std::string& conf) { return describe_config(conf); }, nb::arg("conf"),
        "What make_resource would build, as text (\"log(stats(pool(cuda)))\"), checking the "
        "string as it does, building nothing.");
}

}  // namespace gpumem::python
