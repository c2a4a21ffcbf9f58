// The capture watch's state, read by the pools on every call and written where
// captures begin and end: CUPTI's callback (capture_cupti.cpp) or the simulated
// driver (sim_stream.cpp). include/gpumem/capture_watch.hpp says what it is for.
//
// Note [The capture watch word]
// One atomic word, so that the pools' test is one load and a compare with zero:
//   bit 63 `off`: no watch is running, or the watch cannot be trusted (it saw a
//                 capture end that it had not seen begin, or a pool found a stream
//                 capturing while the word said none);
//   bits 0-62:    captures begun and not yet ended, counted from the entry of the
//                 begin call, so a stream is counted before it is capturing.
// Zero means: the watch runs and no capture is in progress anywhere in the process.
// A count never goes below zero: an end with nothing counted sets `off` instead,
// so that a later begin cannot bring the word back to zero while a capture the
// watch never saw is still running. Starting the watch resets the word to zero;
// `off` stays set from then on only through distrust.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include <cuda.h>

#include "gpumem/export.hpp"

namespace gpumem::detail {

inline constexpr std::uint64_t capture_watch_off = std::uint64_t{1} << 63;

extern std::atomic<std::uint64_t> capture_watch_word;

// True when the watch runs and no capture is in progress: the pools that use the
// watch then skip their cuStreamIsCapturing.
inline bool watch_says_no_capture() noexcept {
  return capture_watch_word.load(std::memory_order_acquire) == 0;
}

// True when the watch runs, is trusted, and counts a capture in progress.
inline bool watch_knows_a_capture() noexcept {
  const std::uint64_t w = capture_watch_word.load(std::memory_order_acquire);
  return w != 0 && (w & capture_watch_off) == 0;
}

// The word now, for tests (the word itself is not exported: the pools read it
// without going through the dynamic linker's table).
GPUMEM_EXPORT std::uint64_t capture_watch_word_now() noexcept;

// Where captures begin and end (the simulator and the CUPTI callback).
void capture_watch_begin_entered() noexcept;  // a begin call starts: count it now
void capture_watch_begin_failed() noexcept;   // that begin call failed: uncount it
void capture_watch_capture_ended() noexcept;  // a capture ended (its stream left capture)
// The watch cannot be trusted from now on (until it is started again).
void capture_watch_distrust() noexcept;

// A pool found `stream` capturing on its first use of it. If the word says no
// capture is in progress, the capture began before the watch started: the watch
// is distrusted (the pools ask the driver again) and a line on stderr says why.
void capture_watch_found_unseen(CUstream stream);

// Starts the CUPTI subscription (capture_cupti.cpp); empty on success, else why not.
std::string start_cupti_watch();
void stop_cupti_watch() noexcept;

}  // namespace gpumem::detail
