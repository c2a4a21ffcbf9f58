// Loading the peer plugins and wrapping their allocators (plugin_peers.hpp).
//
// A plugin is looked for in GPUMEM_BENCH_PLUGIN_DIR when set, else beside the
// gpumem-bench executable, where the build puts it. It is opened once, on the
// first question about one of its rows, and never closed: its allocators'
// code must outlive every cell.
#include "peers/plugin_peers.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <new>
#include <string_view>

#include "gpumem/backend.hpp"
#include "gpumem/error.hpp"
#include "peers/peers.hpp"

namespace gpumem::bench::peers {
namespace {

struct loaded {
  plugin::library* library = nullptr;
  std::string why;  // when library is null
};

std::filesystem::path plugin_dir() {
  if (const char* dir = std::getenv("GPUMEM_BENCH_PLUGIN_DIR"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path(".") : exe.parent_path();
}

std::string how_to_build(std::string_view file) {
  if (file == plugin::rmm_library) {
    return "configure with -DGPUMEM_RMM_ROOT=<unpacked librmm wheel>, docs/benchmarks.md";
  }
  if (file == plugin::torch_library) {
    return "build the target gpumem-bench-torch where the torch package is installed, "
           "docs/benchmarks.md";
  }
  return "see docs/benchmarks.md";
}

loaded open_plugin(const char* file) {
  loaded out;
  const std::filesystem::path path = plugin_dir() / file;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    out.why = std::string(file) + " not built (" + how_to_build(file) + ")";
    return out;
  }
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = ::dlerror();
    out.why = std::string(file) + " does not load: " + (err != nullptr ? err : "unknown error");
    return out;
  }
  auto entry = reinterpret_cast<plugin::entry_function>(::dlsym(handle, plugin::entry_point));
  if (entry == nullptr) {
    out.why = std::string(file) + " has no " + plugin::entry_point + " entry point";
    return out;
  }
  try {
    out.library = entry(plugin::api_version);
  } catch (const std::exception& e) {
    out.why = std::string(file) + " failed to start: " + e.what();
    return out;
  }
  if (out.library == nullptr) {
    out.why = std::string(file) + " does not speak plugin interface version " +
              std::to_string(plugin::api_version) + " (rebuild it with this gpumem-bench)";
  }
  return out;
}

// Plugins are opened once per process, on first use, under one lock.
const loaded& plugin_named(const char* file) {
  static std::mutex mutex;
  static std::map<std::string, loaded> plugins;
  std::lock_guard lock(mutex);
  auto it = plugins.find(file);
  if (it == plugins.end()) it = plugins.emplace(file, open_plugin(file)).first;
  return it->second;
}

bool gpu_in_use(std::string& why) {
  if (current_backend() == backend_kind::cuda) return true;
  why = "needs a GPU: the peer calls the CUDA runtime, which the simulator does not serve";
  return false;
}

// A plugin's allocator as a memory_resource. It adds what every peer row adds:
// making the device's primary context current on the calling thread (once per
// thread, as the CUDA runtime does), and turning the plugin's errors into the
// ones the workloads expect.
class plugin_peer final : public memory_resource {
 public:
  plugin_peer(std::unique_ptr<plugin::allocator> a, int device, std::string name)
      : allocator_(std::move(a)), device_(device), name_(std::move(name)) {}

  resource_properties properties() const noexcept override {
    return {.device = device_,
            .device_accessible = true,
            .host_accessible = false,
            .thread_safe = allocator_->thread_safe()};
  }

 private:
  void* do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) override {
    ensure_current_device(device_);
    try {
      return allocator_->allocate(bytes, static_cast<void*>(stream.handle()), alignment);
    } catch (const std::bad_alloc&) {
      throw;  // out of memory: a result, as gpumem's own out_of_memory
    } catch (const std::exception& e) {
      throw cuda_error(CUDA_ERROR_UNKNOWN, name_ + " allocate", e.what());
    }
  }

  void do_deallocate(void* ptr, std::size_t bytes, stream_view stream, std::size_t alignment) override {
    ensure_current_device(device_);
    try {
      allocator_->deallocate(ptr, bytes, static_cast<void*>(stream.handle()), alignment);
    } catch (const std::exception& e) {
      throw cuda_error(CUDA_ERROR_UNKNOWN, name_ + " deallocate", e.what());
    }
  }

  std::unique_ptr<plugin::allocator> allocator_;
  int device_;
  std::string name_;
};

}  // namespace

bool plugin_peer_available(const char* file, const char* row, std::string& why) {
  if (!gpu_in_use(why)) return false;
  const loaded& p = plugin_named(file);
  if (p.library == nullptr) {
    why = p.why;
    return false;
  }
  if (!p.library->has(row)) {
    why = std::string(file) + " (" + p.library->version() + ") does not serve this row";
    return false;
  }
  return true;
}

std::shared_ptr<memory_resource> make_plugin_peer(const char* file, const char* row, int device) {
  const loaded& p = plugin_named(file);
  if (p.library == nullptr) throw cuda_error(CUDA_ERROR_NOT_FOUND, row, p.why);
  ensure_current_device(device);
  std::unique_ptr<plugin::allocator> a;
  try {
    a.reset(p.library->create(row, device));
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {
    throw cuda_error(CUDA_ERROR_UNKNOWN, std::string(row) + " create", e.what());
  }
  if (a == nullptr) throw cuda_error(CUDA_ERROR_NOT_FOUND, row, "the plugin made no allocator");
  return std::make_unique<plugin_peer>(std::move(a), device, row);
}

std::vector<std::string> loaded_peer_libraries() {
  std::vector<std::string> out;
  std::string why;
  if (!gpu_in_use(why)) return out;
  for (const char* file : {plugin::rmm_library, plugin::torch_library}) {
    const loaded& p = plugin_named(file);
    if (p.library != nullptr) out.emplace_back(p.library->version());
  }
  return out;
}

}  // namespace gpumem::bench::peers
