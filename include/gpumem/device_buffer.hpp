// device_buffer: an untyped, stream-ordered block of memory from any resource.
//
// Allocated on a stream and freed on the buffer's stream (the last one it was
// allocated, resized or told to use), so the memory is reused only after the
// work queued there; work on other streams must be ordered by the caller, as
// for the resources themselves (docs/resource-contract.md). The resource is held
// by a shared owner; by default it is get_current_resource() of the stream's
// device. A zero-size buffer holds no memory (data() is null).
//
// Copies take host memory (pageable or pinned) or device memory of any device
// (unified addressing) and run on the given stream: the source must stay valid,
// and the destination must not be read, until that stream gets there.
// Thread safety: like a std::vector; one buffer is not to be changed from several
// threads at once.
#pragma once

#include <cstddef>
#include <memory>

#include "gpumem/export.hpp"
#include "gpumem/memory_resource.hpp"
#include "gpumem/stream.hpp"

namespace gpumem {

class GPUMEM_EXPORT device_buffer {
 public:
  // Empty: no memory and no resource yet (the first resize or reserve takes
  // get_current_resource() of its stream's device).
  device_buffer() noexcept = default;

  // `bytes` of uninitialised memory from `mr` (null: get_current_resource(stream.device())),
  // usable by work queued on `stream` after the call.
  device_buffer(std::size_t bytes, stream_view stream, std::shared_ptr<memory_resource> mr = nullptr);
  // The same from a resource the caller keeps alive for as long as the buffer.
  device_buffer(std::size_t bytes, stream_view stream, memory_resource& mr);
  // A copy of [source, source + bytes) (host or device memory), made on `stream`.
  device_buffer(const void* source, std::size_t bytes, stream_view stream,
                std::shared_ptr<memory_resource> mr = nullptr);
  // A deep copy of `other`'s bytes, made on `stream`, from `mr` (null: other's resource).
  device_buffer(const device_buffer& other, stream_view stream, std::shared_ptr<memory_resource> mr = nullptr);

  // `bytes` from `mr` when the resource can serve them without waiting
  // (memory_resource::try_allocate_now), else an empty buffer and nothing
  // changed: callers holding a lock of their own (Python's GIL) try this first.
  static device_buffer try_allocate_now(std::size_t bytes, stream_view stream,
                                        const std::shared_ptr<memory_resource>& mr);

  // Frees the memory on the buffer's stream; never throws (failures are logged).
  ~device_buffer();
  device_buffer(device_buffer&& other) noexcept;
  device_buffer& operator=(device_buffer&& other) noexcept;
  device_buffer(const device_buffer&) = delete;  // copies need a stream: use the constructor above
  device_buffer& operator=(const device_buffer&) = delete;

  void* data() noexcept { return data_; }
  const void* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::size_t capacity() const noexcept { return capacity_; }
  bool empty() const noexcept { return size_ == 0; }
  // Device whose memory the resource hands out (-1 for host memory), or -1 when empty-constructed.
  int device() const noexcept { return device_; }
  stream_view stream() const noexcept { return stream_; }
  // The stream the memory will be freed (or reallocated) on; the caller orders
  // the old stream's work on the buffer before the new one's.
  void set_stream(stream_view stream) noexcept { stream_ = stream; }
  const std::shared_ptr<memory_resource>& resource() const noexcept { return resource_; }

  // Changes the size, keeping the first min(size(), new_size) bytes. Within the
  // capacity nothing moves; beyond it, new memory is allocated on `stream`, the
  // bytes are copied there on `stream` and the old memory is freed on `stream`.
  // The buffer's stream becomes `stream`. On error the buffer is unchanged.
  void resize(std::size_t new_size, stream_view stream);
  // Makes the capacity at least `new_capacity` (reallocating as resize does).
  void reserve(std::size_t new_capacity, stream_view stream);
  // Makes the capacity equal to the size (reallocating as resize does).
  void shrink_to_fit(stream_view stream);
  // Frees the memory on the buffer's stream now; the buffer becomes empty and keeps its resource.
  void release();
  // release() when the resource can free without waiting (memory_resource::
  // try_deallocate_now): true, and the buffer is empty; false: nothing changed.
  bool try_release_now();

  // Copies `bytes` from `source` into the buffer at `offset`, queued on `stream`.
  void copy_from(const void* source, std::size_t bytes, stream_view stream, std::size_t offset = 0);
  // Copies `bytes` of the buffer at `offset` to `destination`, queued on `stream`.
  void copy_to(void* destination, std::size_t bytes, stream_view stream, std::size_t offset = 0) const;

 private:
  void init(std::size_t bytes, stream_view stream, std::shared_ptr<memory_resource> mr);
  void reallocate(std::size_t new_capacity, stream_view stream);
  void copy(void* dst, const void* src, std::size_t bytes, stream_view stream) const;
  void check_range(std::size_t bytes, std::size_t offset, const char* where) const;

  void* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
  int device_ = -1;
  stream_view stream_{};
  std::shared_ptr<memory_resource> resource_;
};

}  // namespace gpumem
