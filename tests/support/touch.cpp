// Device-side touching of memory for tests (support/touch.hpp).
#include "support/touch.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "driver/driver.hpp"
#include "gpumem/backend.hpp"
#include "gpumem/device.hpp"
#ifdef GPUMEM_TEST_HAVE_KERNELS
#include "support/touch_kernels.hpp"
#endif

namespace gpumem::test {
namespace {

enum class method { kernels, host_functions, driver_copies };

// Bytes of [p, p + n) unequal to `value`: compared a block at a time with memcmp,
// counted byte by byte only in a block that differs. The sanitizers check a
// memcmp as one range but every byte read in a loop one call at a time, which
// made these checks most of the large scenarios' time under ThreadSanitizer.
std::size_t count_unequal(const unsigned char* p, std::size_t n, unsigned char value) {
  constexpr std::size_t block = std::size_t{64} << 10;
  const std::vector<unsigned char> same(std::min(n, block), value);
  std::size_t count = 0;
  for (std::size_t at = 0; at < n; at += block) {
    const std::size_t len = std::min(block, n - at);
    if (std::memcmp(p + at, same.data(), len) == 0) continue;
    for (std::size_t i = at; i < at + len; ++i) count += p[i] != value ? 1 : 0;
  }
  return count;
}

method current_method() {
  if (current_backend() == backend_kind::sim) return method::host_functions;
#ifdef GPUMEM_TEST_HAVE_KERNELS
  return method::kernels;
#else
  return method::driver_copies;
#endif
}

// A host function with captured state, queued on a stream.
void enqueue_host(stream_view s, std::function<void()> fn) {
  auto* heap = new std::function<void()>(std::move(fn));
  CUresult r = detail::driver().cuLaunchHostFunc(
      s.handle(),
      [](void* p) {
        auto* f = static_cast<std::function<void()>*>(p);
        (*f)();
        delete f;
      },
      heap);
  if (r != CUDA_SUCCESS) {
    delete heap;
    detail::check(r, "cuLaunchHostFunc", __FILE__, __LINE__);
  }
}

// The device of a stream, current for launches and copies.
int stream_device(stream_view s) { return s.device(); }

// The address device work uses for `ptr` (a context must be current): the same
// value for device memory and, with unified addressing, for pinned host memory,
// except write-combined pinned memory, whose device pointer differs. Memory the
// driver does not know (pageable host memory) is used as it is.
void* device_address(const void* ptr) {
  CUdeviceptr d = 0;
  if (detail::driver().cuPointerGetAttribute(&d, CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
                                             reinterpret_cast<CUdeviceptr>(ptr)) == CUDA_SUCCESS) {
    return reinterpret_cast<void*>(static_cast<std::uintptr_t>(d));
  }
  return const_cast<void*>(ptr);
}

}  // namespace

const char* touch_method() {
  switch (current_method()) {
    case method::kernels: return "CUDA kernels";
    case method::host_functions: return "simulator host functions";
    default: return "driver memset/memcpy";
  }
}

void device_fill(void* ptr, std::size_t bytes, std::uint8_t value, stream_view s) {
  switch (current_method()) {
    case method::host_functions:
      enqueue_host(s, [=] { std::memset(ptr, value, bytes); });
      return;
#ifdef GPUMEM_TEST_HAVE_KERNELS
    case method::kernels: {
      detail::device_context_guard g(stream_device(s));
      kernels::fill(device_address(ptr), bytes, value, s.handle());
      return;
    }
#endif
    default: {
      detail::device_context_guard g(stream_device(s));
      GPUMEM_CU(cuMemsetD8Async, reinterpret_cast<CUdeviceptr>(device_address(ptr)), value, bytes, s.handle());
    }
  }
}

void exit_with_outcome_of(const std::function<void()>& work) {
  int code = 0;
  try {
    work();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "failed: %s\n", e.what());
    code = device_work_failed;
  }
  std::fflush(stderr);
  std::_Exit(code);
}

std::size_t device_count_mismatches(const void* ptr, std::size_t bytes, std::uint8_t value,
                                    stream_view s) {
  held_check check(const_cast<void*>(ptr), bytes, value, std::chrono::milliseconds(0), s);
  return check.mismatches();
}

#ifdef GPUMEM_TEST_HAVE_KERNELS
namespace {

// The kernels' mismatch counters, allocated in blocks and kept for the process:
// a check must not need device memory at the moment it runs, when the pool under
// test may hold all of it (reserve_check_memory() takes the first block early).
class counters {
 public:
  static counters& instance() {
    static counters c;
    return c;
  }
  CUdeviceptr take(int device) {
    std::lock_guard lock(mutex_);
    std::vector<CUdeviceptr>& free = free_[device];
    if (free.empty()) {
      detail::device_context_guard g(device);
      CUdeviceptr block = 0;
      GPUMEM_CU(cuMemAlloc, &block, per_block * sizeof(unsigned long long));
      for (std::size_t i = 0; i < per_block; ++i) free.push_back(block + i * sizeof(unsigned long long));
    }
    const CUdeviceptr c = free.back();
    free.pop_back();
    return c;
  }
  void give(int device, CUdeviceptr c) {
    std::lock_guard lock(mutex_);
    free_[device].push_back(c);
  }

 private:
  static constexpr std::size_t per_block = 256;
  std::mutex mutex_;
  std::map<int, std::vector<CUdeviceptr>> free_;
};

}  // namespace
#endif

void reserve_check_memory() {
#ifdef GPUMEM_TEST_HAVE_KERNELS
  if (current_method() != method::kernels) return;
  for (int d = 0; d < device_count(); ++d) counters::instance().give(d, counters::instance().take(d));
#endif
}

struct held_check::impl {
  stream_view stream;
  int device = 0;
  std::size_t host_count = 0;                 // host functions path
  std::vector<unsigned char> host_copy;       // driver copies path
  std::uint8_t value = 0;
  CUdeviceptr device_counter = 0;             // kernels path
  bool counting_on_device = false;
};

held_check::held_check(void* ptr, std::size_t bytes, std::uint8_t value,
                       std::chrono::milliseconds hold, stream_view s)
    : impl_(std::make_unique<impl>()) {
  impl& st = *impl_;
  st.stream = s;
  st.value = value;
  const bool fill_first = hold.count() > 0;
  switch (current_method()) {
    case method::host_functions: {
      impl* raw = &st;
      enqueue_host(s, [=] {
        if (fill_first) {
          std::memset(ptr, value, bytes);
          std::this_thread::sleep_for(hold);
        }
        raw->host_count = count_unequal(static_cast<const unsigned char*>(ptr), bytes, value);
      });
      return;
    }
#ifdef GPUMEM_TEST_HAVE_KERNELS
    case method::kernels: {
      st.device = stream_device(s);
      detail::device_context_guard g(st.device);
      ptr = device_address(ptr);
      st.device_counter = counters::instance().take(st.device);
      st.counting_on_device = true;
      GPUMEM_CU(cuMemsetD8Async, st.device_counter, 0, sizeof(unsigned long long), s.handle());
      if (fill_first) {
        kernels::fill(ptr, bytes, value, s.handle());
        kernels::spin(hold, s.handle());
      }
      kernels::count_mismatches(ptr, bytes, value,
                                reinterpret_cast<unsigned long long*>(st.device_counter),
                                s.handle());
      return;
    }
#endif
    default: {
      st.device = stream_device(s);
      detail::device_context_guard g(st.device);
      ptr = device_address(ptr);
      if (fill_first) {
        GPUMEM_CU(cuMemsetD8Async, reinterpret_cast<CUdeviceptr>(ptr), value, bytes, s.handle());
        enqueue_host(s, [=] { std::this_thread::sleep_for(hold); });
      }
      st.host_copy.resize(bytes);
      GPUMEM_CU(cuMemcpyAsync, reinterpret_cast<CUdeviceptr>(st.host_copy.data()),
                reinterpret_cast<CUdeviceptr>(ptr), bytes, s.handle());
    }
  }
}

held_check::~held_check() {
  if (impl_) {  // the queued check still refers to impl_: let it finish first
    (void)detail::driver().cuStreamSynchronize(impl_->stream.handle());
  }
#ifdef GPUMEM_TEST_HAVE_KERNELS
  if (impl_ && impl_->device_counter != 0) counters::instance().give(impl_->device, impl_->device_counter);
#endif
}

std::size_t held_check::mismatches() {
  impl& st = *impl_;
  st.stream.synchronize();
  if (st.counting_on_device) {
    unsigned long long n = 0;
    detail::device_context_guard g(st.device);
    GPUMEM_CU(cuMemcpy, reinterpret_cast<CUdeviceptr>(&n), st.device_counter, sizeof(n));
    return static_cast<std::size_t>(n);
  }
  if (!st.host_copy.empty()) return count_unequal(st.host_copy.data(), st.host_copy.size(), st.value);
  return st.host_count;
}

}  // namespace gpumem::test
