// Stack capture and symbolization (call_site.hpp).
#include "adaptors/call_site.hpp"

#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace gpumem::detail {
namespace {

// Where libgpumem is loaded: frames whose object base is this are gpumem's own.
const void* gpumem_base() {
  static const void* base = [] {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&caller_outside_gpumem), &info) != 0) return static_cast<const void*>(info.dli_fbase);
    return static_cast<const void*>(nullptr);
  }();
  return base;
}

bool inside_gpumem(void* address) {
  Dl_info info{};
  if (dladdr(address, &info) == 0) return false;
  return info.dli_fbase == gpumem_base();
}

constexpr int skip_limit = 24;  // gpumem's own frames are never deeper than this

// The first frame after gpumem's own. Frames before gpumem's (a sanitizer's
// interceptor of backtrace() itself) are passed over first.
int first_outside(void* const* frames, int n) {
  int i = 0;
  while (i < n && i < skip_limit && !inside_gpumem(frames[i])) ++i;
  if (i == n || i == skip_limit) return 0;  // gpumem not found: keep everything
  while (i < n && inside_gpumem(frames[i])) ++i;
  return i;
}

}  // namespace

std::vector<void*> capture_stack(int max_frames) {
  void* frames[64 + skip_limit];
  const int n = backtrace(frames, std::min(max_frames, 64) + skip_limit);
  const int first = first_outside(frames, n);
  return std::vector<void*>(frames + first, frames + std::min(n, first + max_frames));
}

void* caller_outside_gpumem() {
  void* frames[skip_limit + 1];
  const int n = backtrace(frames, skip_limit + 1);
  const int first = first_outside(frames, n);
  return first < n ? frames[first] : nullptr;
}

std::string describe_frame(void* address) {
  static std::mutex mutex;
  static auto* cache = new std::unordered_map<void*, std::string>;  // leaked: used at exit
  {
    std::lock_guard lock(mutex);
    auto it = cache->find(address);
    if (it != cache->end()) return it->second;
  }
  std::string text;
  Dl_info info{};
  if (address != nullptr && dladdr(address, &info) != 0) {
    const char* file = info.dli_fname != nullptr ? info.dli_fname : "?";
    const char* slash = std::strrchr(file, '/');
    const std::string object = slash != nullptr ? slash + 1 : file;
    char offset[32];
    if (info.dli_sname != nullptr) {
      int status = 0;
      char* demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
      text = status == 0 && demangled != nullptr ? demangled : info.dli_sname;
      std::free(demangled);
      std::snprintf(offset, sizeof offset, "+0x%zx",
                    static_cast<std::size_t>(static_cast<char*>(address) - static_cast<char*>(info.dli_saddr)));
      text += offset;
      text += " (" + object + ")";
    } else {
      std::snprintf(offset, sizeof offset, "+0x%zx",
                    static_cast<std::size_t>(static_cast<char*>(address) - static_cast<char*>(info.dli_fbase)));
      text = object + offset;
    }
  } else {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%p", address);
    text = buf;
  }
  std::lock_guard lock(mutex);
  cache->emplace(address, text);
  return text;
}

}  // namespace gpumem::detail
