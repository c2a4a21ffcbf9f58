// libgpumem-bench-torch.so: PyTorch's CUDA caching allocator as gpumem-bench
// peers (plugin_api.hpp), from the C++ headers and libraries inside the torch
// Python package (c10 and c10_cuda only: no ATen, no Python). Built by
// bench/peers/torch/CMakeLists.txt, a project of its own, so that a torch whose
// headers do not compile costs these two rows and nothing else.
//
// Rows: "torch caching" (the allocator as PyTorch configures it by default) and
// "torch caching (expandable)" (with expandable_segments:True, which maps
// physical memory into one growing virtual range per stream instead of
// cudaMalloc'ing segments). Calls: raw_alloc_with_stream / raw_delete, what
// PyTorch's own raw allocations use. The allocator is one per process: each row
// empties its cache when it ends, so the next starts from nothing, and sets the
// expandable_segments setting when it starts.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>

#if __has_include(<c10/core/AllocatorConfig.h>)
#include <c10/core/AllocatorConfig.h>
#define GPUMEM_TORCH_GENERIC_ALLOCATOR_CONFIG 1  // PyTorch 2.9 and later
#endif

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>
#include <string_view>

#include "peers/plugin_api.hpp"

#ifndef GPUMEM_TORCH_VERSION
#define GPUMEM_TORCH_VERSION "unknown"
#endif

namespace gpumem::bench::torch_peers {
namespace {

namespace cca = c10::cuda::CUDACachingAllocator;

// PyTorch's allocator settings (PYTORCH_CUDA_ALLOC_CONF's grammar), at run time.
// Since PyTorch 2.9 they live in the device-generic allocator configuration,
// which hands CUDA's keys on to CUDA's.
void apply_settings(const std::string& settings) {
#ifdef GPUMEM_TORCH_GENERIC_ALLOCATOR_CONFIG
  c10::CachingAllocator::setAllocatorSettings(settings);
#else
  cca::setAllocatorSettings(settings);
#endif
}

// PyTorch's messages carry a C++ backtrace; the table wants the first line.
std::string short_message(const c10::Error& e) {
  std::string m = e.what_without_backtrace();
  if (const auto nl = m.find('\n'); nl != std::string::npos) m.resize(nl);
  return m;
}

class torch_allocator final : public plugin::allocator {
 public:
  explicit torch_allocator(bool expandable) : expandable_(expandable) {}

  ~torch_allocator() override {
    try {
      cca::emptyCache();  // the next row (or cell) starts with nothing cached
    } catch (...) {
    }
  }

  void* allocate(std::size_t bytes, void* stream, std::size_t alignment) override {
    // Blocks are 512-byte aligned.
    if (alignment > 512) throw std::invalid_argument("torch caching: alignment above 512 bytes");
    try {
      return cca::raw_alloc_with_stream(bytes, static_cast<cudaStream_t>(stream));
    } catch (const c10::OutOfMemoryError& e) {
      throw plugin::out_of_memory("torch caching: " + short_message(e));
    } catch (const c10::Error& e) {
      throw std::runtime_error("torch caching: " + short_message(e));
    }
  }

  void deallocate(void* ptr, std::size_t, void*, std::size_t) override {
    try {
      cca::raw_delete(ptr);
    } catch (const c10::Error& e) {
      throw std::runtime_error("torch caching: " + short_message(e));
    }
  }

  // PyTorch 2.11's allocator with expandable_segments:True ended W3's process
  // with a segmentation fault when threads allocated on their own streams at
  // once (H200, 2026-11-26; the row without expandable segments ran): the
  // expandable row is left out of the workloads that allocate from several
  // threads, rather than taking gpumem-bench down with it. W3 then destroyed its
  // threads' streams before the row's resource, which is what crashed this row
  // in W5 (Note [The replay's streams outlive the resource], w5_replay.cpp); W3
  // no longer does, so the cause may be gone. The mark stays until a GPU run
  // shows the row through W3.
  bool thread_safe() const noexcept override { return !expandable_; }

 private:
  bool expandable_;
};

// The row must measure what it says: one large allocation (its own segment, in
// the large pool) must land in an expandable segment exactly when the row asks
// for them. Run once per row, before anything is timed.
void check_setting(bool expandable) {
  constexpr std::size_t probe_bytes = std::size_t{32} << 20;
  void* p = cca::raw_alloc_with_stream(probe_bytes, nullptr);
  bool found = false, is_expandable = false;
  for (const auto& segment : cca::snapshot().segments) {
    if (!segment.is_large) continue;
    found = true;
    is_expandable = is_expandable || segment.is_expandable;
  }
  cca::raw_delete(p);
  cca::emptyCache();
  if (found && is_expandable != expandable) {
    throw std::runtime_error(std::string("expandable_segments:") + (expandable ? "True" : "False") +
                             " did not take effect in this PyTorch (" GPUMEM_TORCH_VERSION ")");
  }
}

class torch_library final : public plugin::library {
 public:
  const char* version() const noexcept override { return "PyTorch " GPUMEM_TORCH_VERSION; }

  bool has(const char* peer) const noexcept override {
    const std::string_view row = peer;
    return row == plugin::torch_caching || row == plugin::torch_expandable;
  }

  plugin::allocator* create(const char* peer, int device) override {
    const std::string_view row = peer;
    if (!has(peer)) return nullptr;
    const bool expandable = row == plugin::torch_expandable;
    try {
      c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
      // What PyTorch does on its first CUDA use; a second call changes nothing.
      cca::init(c10::cuda::device_count());
      const std::string backend = cca::name();
      if (backend != "native") {
        throw std::runtime_error("PyTorch's CUDA allocator backend is '" + backend +
                                 "', not its caching allocator (PYTORCH_CUDA_ALLOC_CONF backend?)");
      }
      cca::emptyCache();
      apply_settings(expandable ? "expandable_segments:True" : "expandable_segments:False");
      check_setting(expandable);
    } catch (const c10::OutOfMemoryError& e) {
      throw plugin::out_of_memory("torch caching: " + short_message(e));
    } catch (const c10::Error& e) {
      throw std::runtime_error("torch caching: " + short_message(e));
    }
    return new torch_allocator(expandable);
  }
};

}  // namespace
}  // namespace gpumem::bench::torch_peers

extern "C" __attribute__((visibility("default"))) gpumem::bench::plugin::library* gpumem_bench_plugin(
    int api_version) {
  if (api_version != gpumem::bench::plugin::api_version) return nullptr;
  static gpumem::bench::torch_peers::torch_library library;
  return &library;
}
