// The capture watch on the CUDA backend: a CUPTI callback subscription to the
// driver's capture calls. libcupti is opened at run time, like libcuda: gpumem
// links neither. The runtime's cudaStreamBeginCapture/EndCapture call the driver's,
// so the driver domain alone sees every capture.
#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "driver/capture_watch_state.hpp"
#include "driver/driver.hpp"

#if __has_include(<cupti_callbacks.h>)
#include <cupti_callbacks.h>
#include <cupti_driver_cbid.h>
#include <cupti_result.h>
#define GPUMEM_HAVE_CUPTI_HEADERS 1
#endif

namespace gpumem::detail {

#ifdef GPUMEM_HAVE_CUPTI_HEADERS
namespace {

struct cupti_api {
  void* library = nullptr;
  decltype(&::cuptiSubscribe) subscribe = nullptr;
  decltype(&::cuptiUnsubscribe) unsubscribe = nullptr;
  decltype(&::cuptiEnableCallback) enable_callback = nullptr;
  decltype(&::cuptiGetResultString) result_string = nullptr;
};

constexpr CUpti_CallbackId begin_calls[] = {
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture,        CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2,     CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph, CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph_ptsz,
};
constexpr CUpti_CallbackId end_calls[] = {
    CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture,
    CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture_ptsz,
};

template <std::size_t N>
bool among(CUpti_CallbackId id, const CUpti_CallbackId (&ids)[N]) {
  for (CUpti_CallbackId x : ids) {
    if (x == id) return true;
  }
  return false;
}

// GPUMEM_CUPTI_LIBRARY, else the loader's paths, else the CUDA toolkit's usual places.
std::vector<std::string> candidates() {
  std::vector<std::string> out;
  if (const char* named = std::getenv("GPUMEM_CUPTI_LIBRARY"); named != nullptr && *named != '\0') {
    out.emplace_back(named);
    return out;
  }
  out.emplace_back("libcupti.so.13");
  out.emplace_back("libcupti.so");
  std::vector<std::string> roots;
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    if (const char* root = std::getenv(var); root != nullptr && *root != '\0') roots.emplace_back(root);
  }
  roots.emplace_back("/usr/local/cuda");
  for (const std::string& root : roots) {
    for (const char* dir : {"/lib64/", "/extras/CUPTI/lib64/", "/lib/"}) out.push_back(root + dir + "libcupti.so.13");
  }
  return out;
}

// Loaded once and kept: a subscription may be made again after a stop.
const cupti_api& cupti(std::string& why) {
  static cupti_api api;
  static std::string failure;
  static bool tried = false;
  if (!tried) {
    tried = true;
    std::string last;
    for (const std::string& name : candidates()) {
      api.library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (api.library != nullptr) break;
      const char* e = dlerror();
      last = e != nullptr ? e : name;
    }
    if (api.library == nullptr) {
      failure = "cannot load libcupti (" + last + "); set GPUMEM_CUPTI_LIBRARY to its path";
    } else {
      api.subscribe = reinterpret_cast<decltype(api.subscribe)>(dlsym(api.library, "cuptiSubscribe"));
      api.unsubscribe = reinterpret_cast<decltype(api.unsubscribe)>(dlsym(api.library, "cuptiUnsubscribe"));
      api.enable_callback = reinterpret_cast<decltype(api.enable_callback)>(dlsym(api.library, "cuptiEnableCallback"));
      api.result_string = reinterpret_cast<decltype(api.result_string)>(dlsym(api.library, "cuptiGetResultString"));
      if (!api.subscribe || !api.unsubscribe || !api.enable_callback || !api.result_string) {
        failure = "libcupti lacks cuptiSubscribe, cuptiUnsubscribe, cuptiEnableCallback or cuptiGetResultString";
        api.library = nullptr;
      }
    }
  }
  why = failure;
  return api;
}

std::string text_of(const cupti_api& api, CUptiResult r) {
  const char* s = nullptr;
  if (api.result_string(r, &s) != CUPTI_SUCCESS || s == nullptr) return "CUPTI error " + std::to_string(r);
  return s;
}

// Capturing now, as far as the driver says; a failed query counts as capturing,
// so that an end is never counted on doubt.
bool capturing_now(CUstream s) noexcept {
  const driver_api* d = driver_if_selected();
  if (d == nullptr) return true;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (d->cuStreamIsCapturing(s, &status) != CUDA_SUCCESS) return true;
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

// Runs inside the driver's capture calls, on the caller's thread.
void CUPTIAPI on_capture_call(void*, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void* data) {
  if (domain != CUPTI_CB_DOMAIN_DRIVER_API || data == nullptr) return;
  const auto* call = static_cast<const CUpti_CallbackData*>(data);
  const bool entry = call->callbackSite == CUPTI_API_ENTER;
  if (among(id, begin_calls)) {
    // Counted before the stream captures; uncounted if the call fails.
    if (entry) {
      capture_watch_begin_entered();
    } else if (*static_cast<const CUresult*>(call->functionReturnValue) != CUDA_SUCCESS) {
      capture_watch_begin_failed();
    }
  } else if (among(id, end_calls)) {
    // An end counts when the call took its stream out of capture: an end on a
    // stream that joined the capture (not its origin) fails and leaves it capturing.
    // Every cuStreamEndCapture*_params starts with the stream.
    CUstream s = *static_cast<const CUstream*>(call->functionParams);
    if (s == nullptr && id == CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture_ptsz) s = CU_STREAM_PER_THREAD;
    if (entry) {
      *call->correlationData = capturing_now(s) ? 1 : 0;
    } else if (*call->correlationData == 1 && !capturing_now(s)) {
      capture_watch_capture_ended();
    }
  }
}

CUpti_SubscriberHandle subscriber = nullptr;

}  // namespace

std::string start_cupti_watch() {
  std::string why;
  const cupti_api& api = cupti(why);
  if (api.library == nullptr) return why;
  CUpti_SubscriberHandle sub = nullptr;
  if (CUptiResult r = api.subscribe(&sub, reinterpret_cast<CUpti_CallbackFunc>(&on_capture_call), nullptr);
      r != CUPTI_SUCCESS) {
    return "cuptiSubscribe failed: " + text_of(api, r) +
           (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED ? " (a profiler holds CUPTI's one subscription)" : "");
  }
  auto enable = [&](const auto& ids) {
    for (CUpti_CallbackId id : ids) {
      if (CUptiResult r = api.enable_callback(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, id); r != CUPTI_SUCCESS) return r;
    }
    return CUPTI_SUCCESS;
  };
  CUptiResult r = enable(begin_calls);
  if (r == CUPTI_SUCCESS) r = enable(end_calls);
  if (r != CUPTI_SUCCESS) {
    (void)api.unsubscribe(sub);
    return "cuptiEnableCallback failed: " + text_of(api, r);
  }
  subscriber = sub;
  return {};
}

void stop_cupti_watch() noexcept {
  if (subscriber == nullptr) return;
  std::string why;
  const cupti_api& api = cupti(why);
  if (api.library != nullptr) (void)api.unsubscribe(subscriber);
  subscriber = nullptr;
}

#else

std::string start_cupti_watch() { return "gpumem was built without the CUPTI headers"; }
void stop_cupti_watch() noexcept {}

#endif

}  // namespace gpumem::detail
