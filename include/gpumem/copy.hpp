// Copying bytes between host memory (pageable or pinned) and device memory of any
// device, in any direction, queued on a stream (cuMemcpyAsync with unified
// addressing). What a program needs to fill or read gpumem memory without linking
// the CUDA runtime, on the GPU and on the simulator alike.
#pragma once

#include <cstddef>

#include "gpumem/export.hpp"
#include "gpumem/stream.hpp"

namespace gpumem {

// Copies [source, source + bytes) to [destination, destination + bytes), queued on
// `stream` (its device's context; the default streams: the current device's). Returns
// at once: the bytes are there once the stream's work before and including the copy
// is done (stream.synchronize()), and pageable host memory must stay alive until
// then. 0 bytes does nothing; a null pointer with bytes > 0 is a logic_error.
GPUMEM_EXPORT void copy(void* destination, const void* source, std::size_t bytes, stream_view stream);

}  // namespace gpumem
