// Copies and fills: cuMemcpy, cuMemcpyAsync, cuMemsetD8, cuMemsetD8Async. All
// addresses are host addresses (unified addressing); ranges are bounds-checked
// at the call (check_access), so an overrun of an allocation is reported as
// CUDA_ERROR_INVALID_VALUE instead of silently corrupting a neighbour.
#include <cstring>

#include "sim/sim_entry_points.hpp"
#include "sim/sim_memory.hpp"
#include "sim/sim_state.hpp"
#include "sim/sim_stream.hpp"

namespace gpumem::detail::simulator {
namespace {

void* host_address(CUdeviceptr p) { return reinterpret_cast<void*>(p); }

CUresult queue_copy(sim_state& state, CUdeviceptr dst, CUdeviceptr src, std::size_t bytes,
                    const std::shared_ptr<sim_stream>& stream, stream_position* done) {
  if (bytes == 0) return CUDA_SUCCESS;
  if (dst == 0 || src == 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = check_access(state, dst, bytes); r != CUDA_SUCCESS) return r;
  if (CUresult r = check_access(state, src, bytes); r != CUDA_SUCCESS) return r;
  // memmove: overlapping ranges are undefined in CUDA; do the forgiving thing.
  return enqueue(stream, [dst, src, bytes] { std::memmove(host_address(dst), host_address(src), bytes); },
                 {}, done);
}

CUresult queue_fill(sim_state& state, CUdeviceptr dst, unsigned char value, std::size_t count,
                    const std::shared_ptr<sim_stream>& stream, stream_position* done) {
  if (count == 0) return CUDA_SUCCESS;
  if (dst == 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = check_access(state, dst, count); r != CUDA_SUCCESS) return r;
  return enqueue(stream, [dst, value, count] { std::memset(host_address(dst), value, count); }, {}, done);
}

// The synchronous forms run on the current context's legacy default stream
// (so they are ordered after the blocking streams' earlier work) and wait.
std::shared_ptr<sim_stream> legacy_stream_of_current_context(CUresult& result) {
  sim_context* context = nullptr;
  result = require_current_context(context);
  return result == CUDA_SUCCESS ? context->legacy_stream() : nullptr;
}

}  // namespace

CUresult memcpy_sync(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes) {
  return entry_point([&](sim_state& state) {
    CUresult r = CUDA_SUCCESS;
    auto stream = legacy_stream_of_current_context(r);
    if (r != CUDA_SUCCESS) return r;
    stream_position done;
    if (r = queue_copy(state, dst, src, bytes, stream, &done); r != CUDA_SUCCESS) return r;
    if (done.stream) done.wait();
    return CUDA_SUCCESS;
  });
}

CUresult memcpy_async(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes, CUstream stream_handle) {
  return entry_point([&](sim_state& state) {
    std::shared_ptr<sim_stream> stream;
    if (CUresult r = resolve_stream(state, stream_handle, stream); r != CUDA_SUCCESS) return r;
    return queue_copy(state, dst, src, bytes, stream, nullptr);
  });
}

CUresult memset_d8_sync(CUdeviceptr dst, unsigned char value, std::size_t count) {
  return entry_point([&](sim_state& state) {
    CUresult r = CUDA_SUCCESS;
    auto stream = legacy_stream_of_current_context(r);
    if (r != CUDA_SUCCESS) return r;
    stream_position done;
    if (r = queue_fill(state, dst, value, count, stream, &done); r != CUDA_SUCCESS) return r;
    if (done.stream) done.wait();
    return CUDA_SUCCESS;
  });
}

CUresult memset_d8_async(CUdeviceptr dst, unsigned char value, std::size_t count, CUstream stream_handle) {
  return entry_point([&](sim_state& state) {
    std::shared_ptr<sim_stream> stream;
    if (CUresult r = resolve_stream(state, stream_handle, stream); r != CUDA_SUCCESS) return r;
    return queue_fill(state, dst, value, count, stream, nullptr);
  });
}

}  // namespace gpumem::detail::simulator
