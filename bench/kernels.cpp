#include "kernels.hpp"

#include <cstdio>
#include <string>

#include "driver/driver.hpp"

namespace gpumem::bench {

ptx_module::ptx_module(int device, const char* ptx) : device_(device) {
  detail::device_context_guard guard(device);
  GPUMEM_CU(cuModuleLoadData, &module_, ptx);
}

ptx_module::~ptx_module() {
  detail::device_context_guard guard(device_);
  if (const CUresult r = detail::driver().cuModuleUnload(module_); r != CUDA_SUCCESS) {
    std::fprintf(stderr, "gpumem-bench: cuModuleUnload failed: %s\n", std::string(detail::error_name(r)).c_str());
  }
}

CUfunction ptx_module::function(const char* name) const {
  detail::device_context_guard guard(device_);
  CUfunction f = nullptr;
  GPUMEM_CU(cuModuleGetFunction, &f, module_, name);
  return f;
}

double elapsed_ms(int device, CUstream s, const std::function<void()>& enqueue) {
  detail::device_context_guard guard(device);
  struct event {
    CUevent e = nullptr;
    event() { GPUMEM_CU(cuEventCreate, &e, CU_EVENT_DEFAULT); }
    ~event() { (void)detail::driver().cuEventDestroy(e); }  // destroying cannot fail for a valid event
    event(const event&) = delete;
    event& operator=(const event&) = delete;
  } start, stop;
  GPUMEM_CU(cuEventRecord, start.e, s);
  enqueue();
  GPUMEM_CU(cuEventRecord, stop.e, s);
  GPUMEM_CU(cuEventSynchronize, stop.e);
  float ms = 0;
  GPUMEM_CU(cuEventElapsedTime, &ms, start.e, stop.e);
  return static_cast<double>(ms);
}

}  // namespace gpumem::bench
