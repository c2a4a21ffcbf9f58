// GPUMEM_CONF (include/gpumem/config.hpp, docs/configuration.md): parse the
// string into a description, check it whole, then build the stack.
//
// Adding a base resource is one entry in `bases` (and its bit in the `applies`
// of the options it takes) and one case in make_resource_from_config()'s switch;
// adding an adaptor is one entry in `options`, one field in `parsed`, and one
// layer in make_resource_from_config().
#include "gpumem/config.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "gpumem/adaptors/deferred_free.hpp"
#include "gpumem/adaptors/limiting.hpp"
#include "gpumem/adaptors/logging.hpp"
#include "gpumem/adaptors/statistics.hpp"
#include "gpumem/adaptors/tracking.hpp"
#include "gpumem/async_resource.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/managed_resource.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/vmm_pool_resource.hpp"
#include "text.hpp"

namespace gpumem {
namespace {

enum class base_id { cuda, pool, async, managed, vmm };

struct base_kind {
  std::string_view name;
  base_id id;
};

constexpr base_kind bases[] = {
    {"cuda", base_id::cuda},    // cuda_resource
    {"pool", base_id::pool},    // pool_resource over cuda_resource
    {"async", base_id::async},  // async_resource: the driver's stream-ordered allocator
    {"managed", base_id::managed},  // managed_resource: managed (unified) memory
    {"vmm", base_id::vmm},      // vmm_pool_resource: the paged virtual-memory pool
    {"default", base_id::vmm},  // what every device gets when GPUMEM_CONF is unset (vmm)
};

constexpr unsigned bit(base_id b) { return 1U << static_cast<unsigned>(b); }
constexpr unsigned any_base = bit(base_id::cuda) | bit(base_id::pool) | bit(base_id::async) |
                              bit(base_id::managed) | bit(base_id::vmm);

enum class value_kind { none, size, path, stacks_or_none, all_or_none };

struct option_kind {
  std::string_view name;
  value_kind value;
  unsigned applies;  // the bases that take it (bits of base_id)
  std::string_view help;
};

constexpr option_kind options[] = {
    {"initial", value_kind::size, bit(base_id::pool) | bit(base_id::async), "bytes the pool reserves at once"},
    {"maximum", value_kind::size, bit(base_id::pool) | bit(base_id::async) | bit(base_id::vmm),
     "most bytes the pool may hold (the budget)"},
    {"min_chunk", value_kind::size, bit(base_id::pool), "smallest upstream request of the pool"},
    {"max_chunk", value_kind::size, bit(base_id::pool), "largest upstream request of the pool"},
    {"release_threshold", value_kind::size, bit(base_id::async) | bit(base_id::vmm),
     "free memory the pool keeps; above it, memory goes back to the device"},
    {"peers", value_kind::all_or_none, bit(base_id::async) | bit(base_id::vmm),
     "other devices that may use the pool's memory: all that can reach it (the default) or none"},
    {"watch_captures", value_kind::none, bit(base_id::pool) | bit(base_id::vmm),
     "skip the per-call capture query while no CUDA graph capture is in progress (the capture watch)"},
    {"limit", value_kind::size, any_base, "hard cap on live bytes (limiting_adaptor)"},
    {"defer", value_kind::none, any_base, "deferred frees (deferred_free_adaptor)"},
    {"track", value_kind::stacks_or_none, any_base, "tracking_adaptor; track=stacks records stacks"},
    {"stats", value_kind::none, any_base, "statistics_adaptor, reported at exit"},
    {"log", value_kind::path, any_base, "CSV event log (logging_adaptor)"},
    {"sites", value_kind::none, any_base, "log each allocation's call site"},
};

// A size: bytes with an optional binary suffix, or a percentage of device memory.
struct size_spec {
  bool percent = false;
  double fraction = 0;      // percent / 100
  std::size_t bytes = 0;
};

struct parsed {
  const base_kind* base = nullptr;
  std::optional<size_spec> initial, maximum, min_chunk, max_chunk, release_threshold, limit;
  bool defer = false, stats = false, track = false, track_stacks = false, sites = false, watch_captures = false;
  std::optional<bool> every_peer;  // peers=all / peers=none
  std::optional<std::string> log;
};

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

[[noreturn]] void fail(std::string_view conf, const std::string& what) {
  throw logic_error("GPUMEM_CONF \"" + std::string(conf) + "\": " + what + " (docs/configuration.md)");
}

std::string known_bases() {
  std::string s;
  for (const auto& b : bases) {
    if (!s.empty()) s += ", ";
    s += b.name;
  }
  return s;
}

std::string known_options() {
  std::string s;
  for (const auto& o : options) {
    if (!s.empty()) s += ", ";
    s += o.name;
  }
  return s;
}

// "pool", "pool or async", "pool, async or vmm": the bases an option applies to.
std::string bases_taking(unsigned applies) {
  std::vector<std::string_view> names;
  unsigned named = 0;
  for (const auto& b : bases) {
    if ((applies & bit(b.id)) != 0 && (named & bit(b.id)) == 0) names.push_back(b.name);  // not "default" again
    named |= bit(b.id);
  }
  std::string s;
  for (std::size_t k = 0; k < names.size(); ++k) {
    if (k > 0) s += k + 1 == names.size() ? " or " : ", ";
    s += names[k];
  }
  return s;
}

std::optional<size_spec> parse_size(std::string_view text) {
  text = trim(text);
  if (text.empty()) return std::nullopt;
  size_spec out;
  if (text.back() == '%') {
    text.remove_suffix(1);
    double v = 0;
    auto r = std::from_chars(text.data(), text.data() + text.size(), v);
    if (r.ec != std::errc() || r.ptr != text.data() + text.size() || !(v > 0 && v <= 100)) return std::nullopt;
    out.percent = true;
    out.fraction = v / 100.0;
    return out;
  }
  const std::optional<std::size_t> bytes = detail::parse_byte_size(text);
  if (!bytes || *bytes == 0) return std::nullopt;
  out.bytes = *bytes;
  return out;
}

parsed parse(std::string_view conf) {
  parsed p;
  std::vector<std::string_view> tokens;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= conf.size(); ++i) {
    if (i == conf.size() || conf[i] == ',') {
      tokens.push_back(trim(conf.substr(start, i - start)));
      start = i + 1;
    }
  }
  if (tokens.size() == 1 && tokens[0].empty()) fail(conf, "empty; name a base resource: " + known_bases());
  const std::string base_name = lower(tokens[0]);
  for (const auto& b : bases) {
    if (b.name == base_name) p.base = &b;
  }
  if (p.base == nullptr) {
    if (tokens[0].find('=') != std::string_view::npos || tokens[0].empty()) {
      fail(conf, "the first token must name a base resource (" + known_bases() + "), not \"" +
                     std::string(tokens[0]) + "\"");
    }
    fail(conf, "unknown base resource \"" + std::string(tokens[0]) + "\" (known: " + known_bases() + ")");
  }
  std::vector<std::string> seen;
  for (std::size_t k = 1; k < tokens.size(); ++k) {
    const std::string_view token = tokens[k];
    if (token.empty()) fail(conf, "empty option (two commas in a row, or a trailing comma)");
    const std::size_t eq = token.find('=');
    const std::string name = lower(trim(token.substr(0, eq)));
    const std::optional<std::string_view> value =
        eq == std::string_view::npos ? std::nullopt : std::optional(trim(token.substr(eq + 1)));
    const option_kind* o = nullptr;
    for (const auto& candidate : options) {
      if (candidate.name == name) o = &candidate;
    }
    if (o == nullptr) {
      fail(conf, "unknown option \"" + std::string(token) + "\" (options: " + known_options() + ")");
    }
    for (const auto& s : seen) {
      if (s == name) fail(conf, "option \"" + name + "\" is given twice");
    }
    seen.push_back(name);
    if ((o->applies & bit(p.base->id)) == 0) {
      fail(conf, "option \"" + std::string(token) + "\" applies to " + bases_taking(o->applies) +
                     ", not to base \"" + std::string(p.base->name) + "\"");
    }
    switch (o->value) {
      case value_kind::none:
        if (value) fail(conf, "option \"" + name + "\" takes no value: \"" + std::string(token) + "\"");
        break;
      case value_kind::size: {
        if (!value) fail(conf, "option \"" + name + "\" needs a size: " + name + "=512MiB or " + name + "=50%");
        auto sz = parse_size(*value);
        if (!sz) {
          fail(conf, "\"" + std::string(token) + "\": \"" + std::string(*value) +
                         "\" is not a size (bytes, with K/M/G/T or KiB/MiB/GiB/TiB, or a percentage "
                         "of the device's memory in (0, 100])");
        }
        if (name == "initial") p.initial = sz;
        else if (name == "maximum") p.maximum = sz;
        else if (name == "min_chunk") p.min_chunk = sz;
        else if (name == "max_chunk") p.max_chunk = sz;
        else if (name == "release_threshold") p.release_threshold = sz;
        else p.limit = sz;
        break;
      }
      case value_kind::path:
        if (!value || value->empty()) fail(conf, "option \"" + name + "\" needs a path: log=/tmp/gpumem-%p.csv");
        p.log = std::string(*value);
        break;
      case value_kind::all_or_none: {
        const std::string v = value ? lower(*value) : std::string();
        if (v != "all" && v != "none") fail(conf, "\"" + std::string(token) + "\": peers takes \"all\" or \"none\"");
        p.every_peer = v == "all";
        break;
      }
      case value_kind::stacks_or_none:
        if (value && lower(*value) != "stacks") {
          fail(conf, "\"" + std::string(token) + "\": track takes no value or \"stacks\"");
        }
        p.track = true;
        p.track_stacks = value.has_value();
        break;
    }
    if (name == "defer") p.defer = true;
    if (name == "stats") p.stats = true;
    if (name == "sites") p.sites = true;
    if (name == "watch_captures") p.watch_captures = true;
  }
  if (p.sites && !p.log) fail(conf, "option \"sites\" needs log=PATH");
  return p;
}

std::size_t resolve(const size_spec& s, std::size_t device_total) {
  if (!s.percent) return s.bytes;
  const double v = std::floor(static_cast<double>(device_total) * s.fraction);
  return static_cast<std::size_t>(v);
}

}  // namespace

std::string describe_config(std::string_view conf) {
  const parsed p = parse(conf);
  std::string s(p.base->name);
  if (p.base->id == base_id::pool) s = p.log ? "pool(log:upstream(cuda))" : "pool(cuda)";
  if (p.limit) s = "limit(" + s + ")";
  if (p.defer) s = "defer(" + s + ")";
  if (p.track) s = "track(" + s + ")";
  if (p.stats) s = "stats(" + s + ")";
  if (p.log) s = "log(" + s + ")";
  return s;
}

std::shared_ptr<memory_resource> make_resource_from_config(std::string_view conf, int device,
                                                           const config_hooks& hooks) {
  const parsed p = parse(conf);  // every error in the string before anything is made
  const int d = device == -1 ? current_device() : device;
  const std::size_t total = device_memory_info(d).total_bytes;

  std::shared_ptr<event_log> log;
  if (p.log) log = event_log::open(*p.log);

  std::shared_ptr<memory_resource> r;
  // The resources' own checks of their options come back as configuration errors.
  try {
    switch (p.base->id) {
      case base_id::cuda:
      case base_id::pool:
        r = std::make_shared<cuda_resource>(d);
        if (hooks.wrap_device_memory) r = hooks.wrap_device_memory(std::move(r));
        if (p.base->id == base_id::cuda) break;
        if (log) r = std::make_shared<logging_adaptor>(std::move(r), log, logging_options{"upstream", false});
        {
          pool_options o;
          if (p.initial) o.initial_bytes = resolve(*p.initial, total);
          if (p.maximum) o.maximum_bytes = resolve(*p.maximum, total);
          if (p.min_chunk) o.min_chunk_bytes = resolve(*p.min_chunk, total);
          if (p.max_chunk) o.max_chunk_bytes = resolve(*p.max_chunk, total);
          o.watch_captures = p.watch_captures;
          r = std::make_shared<pool_resource>(std::move(r), o);
        }
        break;
      case base_id::managed:
        r = std::make_shared<managed_resource>(d);
        if (hooks.wrap_device_memory) r = hooks.wrap_device_memory(std::move(r));
        break;
      case base_id::async: {
        // The pool is the driver's: no resource under it to wrap or to log.
        async_options o;
        if (p.initial) o.initial_bytes = resolve(*p.initial, total);
        if (p.maximum) o.maximum_bytes = resolve(*p.maximum, total);
        if (p.release_threshold) o.release_threshold_bytes = resolve(*p.release_threshold, total);
        if (p.every_peer) o.access_for_every_peer = *p.every_peer;
        r = std::make_shared<async_resource>(d, o);
        break;
      }
      case base_id::vmm: {
        // The pool maps physical memory itself: no resource under it to wrap or to log.
        vmm_pool_options o;
        if (p.maximum) o.maximum_bytes = resolve(*p.maximum, total);
        if (p.release_threshold) o.release_threshold_bytes = resolve(*p.release_threshold, total);
        if (p.every_peer) o.access_for_every_peer = *p.every_peer;
        o.watch_captures = p.watch_captures;
        r = std::make_shared<vmm_pool_resource>(d, std::move(o));
        break;
      }
    }
  } catch (const logic_error& e) {
    fail(conf, e.what());
  }
  if (p.limit) {
    const std::size_t limit = resolve(*p.limit, total);
    if (limit == 0) fail(conf, "limit resolves to 0 bytes");
    r = std::make_shared<limiting_adaptor>(std::move(r), limit);
  }
  if (p.defer) r = std::make_shared<deferred_free_adaptor>(std::move(r));
  if (p.track) {
    tracking_options t;
    t.capture_stacks = p.track_stacks;
    r = std::make_shared<tracking_adaptor>(std::move(r), t);
  }
  if (p.stats) {
    statistics_options s;
    s.report_at_exit = true;
    s.name = "statistics (GPUMEM_CONF)";
    r = std::make_shared<statistics_adaptor>(std::move(r), s);
  }
  if (log) r = std::make_shared<logging_adaptor>(std::move(r), log, logging_options{"app", p.sites});
  return r;
}

}  // namespace gpumem
