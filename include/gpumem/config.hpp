// Building a resource stack from one line of text, the grammar of GPUMEM_CONF
// (docs/configuration.md):
//
//   pool,initial=50%,maximum=80%,stats,log=/tmp/gpumem-%p.csv
//
// The first token names the base resource (cuda | pool | async | managed | vmm);
// the others are options, `name` or `name=value`, in any order. Adaptors are
// layered in one fixed order, whatever order they are written in (outermost first):
//   log -> stats -> track -> defer -> limit -> base
// With log=PATH over a pool, a second logging adaptor below the pool (source
// "upstream") records what the pool reserves, in the same file.
//
// When GPUMEM_CONF is set, the default current resource of every device is made
// from it (docs/current-resource.md), so a program switches without code changes.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "gpumem/export.hpp"
#include "gpumem/memory_resource.hpp"

namespace gpumem {

struct config_hooks {
  // When set, wraps the resource that takes device memory from the driver before
  // anything is built on it (gpumem-replay puts a counting adaptor there to
  // measure what the stack reserved): cuda_resource under the bases cuda and
  // pool, managed_resource for managed. Not called for async and vmm, whose pools
  // take memory from the driver inside the resource (their own statistics say
  // what they hold).
  std::function<std::shared_ptr<memory_resource>(std::shared_ptr<memory_resource>)> wrap_device_memory;
};

// The stack `conf` describes, on `device` (-1: the current device). A malformed
// string, an unknown or repeated option, or an option the base does not take is a
// logic_error that names the token; so is what the base resource refuses of its
// options (initial above maximum).
GPUMEM_EXPORT std::shared_ptr<memory_resource> make_resource_from_config(
    std::string_view conf, int device = -1, const config_hooks& hooks = {});

// What make_resource_from_config would build, as text: "log(stats(pool(cuda)))".
// Checks the string as make_resource_from_config does, without building anything
// (percentages are not resolved).
GPUMEM_EXPORT std::string describe_config(std::string_view conf);

}  // namespace gpumem
