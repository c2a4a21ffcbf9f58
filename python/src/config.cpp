// Resource stacks from the GPUMEM_CONF grammar (include/gpumem/config.hpp,
// docs/configuration.md); gpumem.make_resource and gpumem.reinitialize build on these,
// and gpumem.stack_report / gpumem.flush_logs read what such a stack has counted
// and logged (the per-worker figures of gpumem.dask, docs/distributed.md).
#include <optional>
#include <string>
#include <vector>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"
#include "gpumem/adaptors/deferred_free.hpp"
#include "gpumem/adaptors/limiting.hpp"
#include "gpumem/adaptors/logging.hpp"
#include "gpumem/adaptors/oom_retry.hpp"
#include "gpumem/adaptors/statistics.hpp"
#include "gpumem/adaptors/thread_safe.hpp"
#include "gpumem/adaptors/tracking.hpp"
#include "gpumem/async_resource.hpp"
#include "gpumem/config.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/managed_resource.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/vmm_pool_resource.hpp"

namespace gpumem::python {
namespace {

// What one walk down a stack finds, outermost layer first. Read without the GIL;
// turned into a dict with it.
struct stack_view {
  std::vector<std::string> layers;  // GPUMEM_CONF's names: log, stats, limit, pool, cuda, ...
  std::optional<allocation_counters> counters;  // the outermost statistics adaptor's
  std::optional<std::size_t> limit_bytes, limit_used_bytes;  // the innermost limit's
  std::optional<std::size_t> used_bytes, reserved_bytes, maximum_bytes;  // the base's
  std::optional<std::size_t> peak_reserved_bytes;  // the base's, where it keeps one
  std::vector<std::shared_ptr<event_log>> logs;  // each log once, outermost first
};

void add_log(stack_view& v, const std::shared_ptr<event_log>& log) {
  for (const auto& l : v.logs) {
    if (l == log) return;
  }
  v.logs.push_back(log);
}

// Walks the layers (memory_resource::next_layer: adaptors, then a pool's
// upstream) down to the resource that takes memory from the driver. The first
// layer that is not an adaptor is the base whose figures are reported (a pool's
// upstream adds only its log and its name). Reading each layer's own figures
// (counters, a limit, a pool's statistics) needs its type; the walk does not.
stack_view walk(const memory_resource& top) {
  stack_view v;
  bool base_seen = false;
  for (const memory_resource* r = &top; r != nullptr; r = r->next_layer()) {
    v.layers.emplace_back(r->layer_name());
    if (const auto* a = dynamic_cast<const resource_adaptor*>(r)) {
      if (const auto* log = dynamic_cast<const logging_adaptor*>(a)) add_log(v, log->log());
      if (const auto* st = dynamic_cast<const statistics_adaptor*>(a); st && !v.counters && !base_seen) {
        v.counters = st->statistics();
      }
      if (const auto* lim = dynamic_cast<const limiting_adaptor*>(a); lim && !base_seen) {
        v.limit_bytes = lim->limit_bytes();
        v.limit_used_bytes = lim->used_bytes();
      }
    } else if (base_seen) {
      continue;  // under the base: only logs and names
    } else if (const auto* pool = dynamic_cast<const pool_resource*>(r)) {
      const pool_statistics s = pool->statistics();
      v.used_bytes = s.used_bytes;
      v.reserved_bytes = s.reserved_bytes;
      v.peak_reserved_bytes = s.peak_reserved_bytes;
      if (pool->options().maximum_bytes != 0) v.maximum_bytes = pool->options().maximum_bytes;
      base_seen = true;
    } else if (const auto* vmm = dynamic_cast<const vmm_pool_resource*>(r)) {
      const vmm_pool_statistics s = vmm->statistics();
      v.used_bytes = s.used_bytes;
      v.reserved_bytes = s.mapped_bytes;
      v.peak_reserved_bytes = s.peak_mapped_bytes;
      if (vmm->options().maximum_bytes != 0) v.maximum_bytes = vmm->options().maximum_bytes;
      base_seen = true;
    } else if (const auto* as = dynamic_cast<const async_resource*>(r)) {
      const async_statistics s = as->statistics();
      v.used_bytes = s.used_bytes;
      v.reserved_bytes = s.reserved_bytes;
      v.peak_reserved_bytes = s.reserved_high_bytes;
      base_seen = true;
    } else if (const auto* cu = dynamic_cast<const cuda_resource*>(r)) {
      v.used_bytes = v.reserved_bytes = cu->allocated_bytes();
      base_seen = true;
    } else if (const auto* ma = dynamic_cast<const managed_resource*>(r)) {
      v.used_bytes = v.reserved_bytes = ma->allocated_bytes();
      base_seen = true;
    } else {
      base_seen = true;  // a resource without figures here
    }
  }
  return v;
}

nb::object optional_int(const std::optional<std::size_t>& x) {
  return x ? nb::object(nb::int_(*x)) : nb::none();
}

std::string nested(const std::vector<std::string>& layers) {
  std::string text;
  for (const auto& l : layers) text += (text.empty() ? "" : "(") + l;
  if (!layers.empty()) text += std::string(layers.size() - 1, ')');
  return text;
}

// Restarts the peak of what the stack's base resource holds from what it holds now;
// false where the base keeps no peak. The base as walk() finds it: the first layer
// that is not an adaptor.
bool reset_reserved_peak(memory_resource& top) {
  nb::gil_scoped_release release;
  for (const memory_resource* r = &top; r != nullptr; r = r->next_layer()) {
    if (dynamic_cast<const resource_adaptor*>(r) != nullptr) continue;
    // The layers below `top` are reached through const pointers; none of them is a
    // const object, so resetting a statistic through a const_cast is sound.
    auto* base = const_cast<memory_resource*>(r);
    if (auto* pool = dynamic_cast<pool_resource*>(base)) {
      pool->reset_peak();
    } else if (auto* vmm = dynamic_cast<vmm_pool_resource*>(base)) {
      vmm->reset_peak();
    } else if (auto* as = dynamic_cast<async_resource*>(base)) {
      as->reset_high_watermarks();
    } else {
      return false;
    }
    return true;
  }
  return false;
}

nb::dict stack_report(const memory_resource& resource) {
  stack_view v;
  {
    nb::gil_scoped_release release;
    v = walk(resource);
  }
  nb::dict d;
  d["stack"] = nested(v.layers);
  d["device"] = resource.properties().device;
  if (v.counters) {
    d["statistics"] = counters_dict(*v.counters);
  } else {
    d["statistics"] = nb::none();
  }
  d["limit_bytes"] = optional_int(v.limit_bytes);
  d["limit_used_bytes"] = optional_int(v.limit_used_bytes);
  d["used_bytes"] = optional_int(v.used_bytes);
  d["reserved_bytes"] = optional_int(v.reserved_bytes);
  d["peak_reserved_bytes"] = optional_int(v.peak_reserved_bytes);
  d["maximum_bytes"] = optional_int(v.maximum_bytes);
  nb::list logs;
  for (const auto& l : v.logs) logs.append(l->path());
  d["logs"] = logs;
  d["log_events"] = v.logs.empty() ? nb::object(nb::none()) : nb::object(nb::int_(v.logs.front()->events()));
  return d;
}

std::vector<std::string> flush_logs(const memory_resource& resource) {
  nb::gil_scoped_release release;
  std::vector<std::string> paths;
  for (const auto& l : walk(resource).logs) {
    l->flush();
    paths.push_back(l->path());
  }
  return paths;
}

}  // namespace

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
  m.def("_stack_report", &stack_report, nb::arg("resource"),
        "What a resource stack has counted (gpumem.stack_report): its layers, the outermost "
        "statistics adaptor's counters, the limit, the base's used/reserved/maximum bytes, its logs.");
  m.def("_reset_reserved_peak", &reset_reserved_peak, nb::arg("resource"),
        "Restarts the base resource's peak of held bytes from what it holds now; False where it "
        "keeps none (gpumem.torch.reset_peak_memory_stats).");
  m.def("_flush_logs", &flush_logs, nb::arg("resource"),
        "Writes every event of each log in the stack now (gpumem.flush_logs); returns their paths.");
}

}  // namespace gpumem::python
