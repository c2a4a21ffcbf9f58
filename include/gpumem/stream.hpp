// Streams: stream_view (a non-owning handle, cheap to copy, what resources take)
// and stream (RAII owner of a driver stream on one device).
#pragma once

#include <cstdint>

#include <cuda.h>

#include "gpumem/export.hpp"

namespace gpumem {

class event;

class GPUMEM_EXPORT stream_view {
 public:
  // The legacy default stream (handle 0) of the current context.
  constexpr stream_view() noexcept = default;
  constexpr stream_view(CUstream handle) noexcept : handle_(handle) {}  // NOLINT: implicit by design

  static stream_view legacy_default() noexcept { return stream_view{CU_STREAM_LEGACY}; }
  static stream_view per_thread() noexcept { return stream_view{CU_STREAM_PER_THREAD}; }

  constexpr CUstream handle() const noexcept { return handle_; }
  constexpr operator CUstream() const noexcept { return handle_; }  // NOLINT

  // Device the stream belongs to (the current context's device for the default streams).
  int device() const;
  void synchronize() const;
  // True when all work queued on the stream has completed.
  bool ready() const;
  // Later work on this stream waits for `e`'s most recent record; the host does not wait.
  void wait(const event& e) const;

  friend constexpr bool operator==(stream_view a, stream_view b) noexcept {
    return a.handle_ == b.handle_;
  }

 private:
  CUstream handle_ = nullptr;
};

class GPUMEM_EXPORT stream {
 public:
  enum class flags : unsigned { blocking = CU_STREAM_DEFAULT, non_blocking = CU_STREAM_NON_BLOCKING };

  // A new stream on `device` (-1: the current device), non-blocking by default so that
  // it does not synchronise with the legacy default stream.
  explicit stream(int device = -1, flags f = flags::non_blocking, int priority = 0);
  ~stream();
  stream(stream&& other) noexcept;
  stream& operator=(stream&& other) noexcept;
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;

  stream_view view() const noexcept { return stream_view{handle_}; }
  operator stream_view() const noexcept { return view(); }  // NOLINT
  CUstream handle() const noexcept { return handle_; }
  int device() const noexcept { return device_; }
  void synchronize() const { view().synchronize(); }
  bool ready() const { return view().ready(); }
  void wait(const event& e) const { view().wait(e); }

 private:
  void reset() noexcept;
  CUstream handle_ = nullptr;
  int device_ = -1;
};

}  // namespace gpumem
