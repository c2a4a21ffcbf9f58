// The check every device resource makes of the stream it is given: a stream of
// another device than the resource's is a logic_error (docs/resource-contract.md).
#pragma once

#include <string>

#include "driver/driver.hpp"
#include "gpumem/error.hpp"
#include "gpumem/stream.hpp"

namespace gpumem::detail {

// The default-stream handles mean the current context's streams; callers have
// made the resource's device current, so they pass.
inline void check_stream_device(stream_view stream, int device, const char* where) {
  const CUstream h = stream.handle();
  if (h == nullptr || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) return;
  CUdevice dev{};
  GPUMEM_CU(cuStreamGetDevice, h, &dev);
  if (static_cast<int>(dev) != device) {
    throw logic_error(std::string(where) + ": the stream belongs to device " + std::to_string(dev) +
                      ", the resource to device " + std::to_string(device));
  }
}

}  // namespace gpumem::detail
