// device_buffer (include/gpumem/device_buffer.hpp): untyped, stream-ordered
// memory from any resource, with stream-ordered copies and reallocation.
#include "gpumem/device_buffer.hpp"
#include "diagnose.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include "driver/driver.hpp"
#include "gpumem/copy.hpp"
#include "gpumem/current_resource.hpp"
#include "gpumem/error.hpp"

namespace gpumem {

device_buffer::device_buffer(std::size_t bytes, stream_view stream, std::shared_ptr<memory_resource> mr) {
  init(bytes, stream, std::move(mr));
}

device_buffer::device_buffer(std::size_t bytes, stream_view stream, memory_resource& mr) {
  // Not owned: an aliasing shared_ptr with no owner.
  init(bytes, stream, std::shared_ptr<memory_resource>(std::shared_ptr<void>{}, &mr));
}

device_buffer::device_buffer(const void* source, std::size_t bytes, stream_view stream,
                             std::shared_ptr<memory_resource> mr) {
  if (source == nullptr && bytes != 0) {
    throw logic_error("gpumem::device_buffer: null source for " + std::to_string(bytes) + " bytes");
  }
  init(bytes, stream, std::move(mr));
  try {
    copy(data_, source, bytes, stream);
  } catch (...) {
    release();
    throw;
  }
}

device_buffer::device_buffer(const device_buffer& other, stream_view stream, std::shared_ptr<memory_resource> mr)
    : device_buffer(other.data_, other.size_, stream, mr != nullptr ? std::move(mr) : other.resource_) {}

void device_buffer::init(std::size_t bytes, stream_view stream, std::shared_ptr<memory_resource> mr) {
  if (mr == nullptr) mr = get_current_resource(stream.device());
  device_ = mr->properties().device;
  if (bytes != 0) data_ = mr->allocate(bytes, stream);
  size_ = bytes;
  capacity_ = bytes;
  stream_ = stream;
  resource_ = std::move(mr);
}

device_buffer device_buffer::try_allocate_now(std::size_t bytes, stream_view stream,
                                              const std::shared_ptr<memory_resource>& mr) {
  device_buffer b;
  if (mr == nullptr || bytes == 0) return b;
  void* p = mr->try_allocate_now(bytes, stream);
  if (p == nullptr) return b;
  b.data_ = p;
  b.size_ = bytes;
  b.capacity_ = bytes;
  b.device_ = mr->properties().device;
  b.stream_ = stream;
  b.resource_ = mr;  // the one copy, made only when served
  return b;
}

device_buffer::~device_buffer() {
  try {
    release();
  } catch (const std::exception& e) {
    detail::diagnosef(diagnostic_level::error, "gpumem: device_buffer: freeing %zu bytes failed: %s\n", capacity_, e.what());
  }
}

device_buffer::device_buffer(device_buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      capacity_(std::exchange(other.capacity_, 0)),
      device_(other.device_),
      stream_(other.stream_),
      resource_(std::move(other.resource_)) {}

device_buffer& device_buffer::operator=(device_buffer&& other) noexcept {
  if (this != &other) {
    try {
      release();
    } catch (const std::exception& e) {
      detail::diagnosef(diagnostic_level::error, "gpumem: device_buffer: freeing %zu bytes failed: %s\n", capacity_, e.what());
    }
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
    device_ = other.device_;
    stream_ = other.stream_;
    resource_ = std::move(other.resource_);
  }
  return *this;
}

void device_buffer::release() {
  if (data_ != nullptr) {
    // Taken out first: whatever the resource says, the buffer no longer holds it.
    void* p = std::exchange(data_, nullptr);
    const std::size_t n = std::exchange(capacity_, 0);
    size_ = 0;
    resource_->deallocate(p, n, stream_);
  }
  size_ = 0;
  capacity_ = 0;
}

bool device_buffer::try_release_now() {
  if (data_ == nullptr) {
    release();
    return true;
  }
  if (!resource_->try_deallocate_now(data_, capacity_, stream_)) return false;
  data_ = nullptr;
  size_ = 0;
  capacity_ = 0;
  return true;
}

void device_buffer::reallocate(std::size_t new_capacity, stream_view stream) {
  if (resource_ == nullptr) {  // empty-constructed: the current resource, as the constructors would
    resource_ = get_current_resource(stream.device());
    device_ = resource_->properties().device;
  }
  void* fresh = new_capacity != 0 ? resource_->allocate(new_capacity, stream) : nullptr;
  const std::size_t kept = std::min(size_, new_capacity);
  try {
    copy(fresh, data_, kept, stream);
  } catch (...) {
    if (fresh != nullptr) resource_->deallocate(fresh, new_capacity, stream);
    throw;
  }
  void* old = std::exchange(data_, fresh);
  const std::size_t old_capacity = std::exchange(capacity_, new_capacity);
  size_ = kept;
  stream_ = stream;
  // The copy out of the old memory is queued on `stream`, so it is freed there.
  if (old != nullptr) resource_->deallocate(old, old_capacity, stream);
}

void device_buffer::resize(std::size_t new_size, stream_view stream) {
  if (new_size > capacity_) reallocate(new_size, stream);
  size_ = new_size;
  stream_ = stream;
}

void device_buffer::reserve(std::size_t new_capacity, stream_view stream) {
  if (new_capacity > capacity_) {
    const std::size_t keep_size = size_;
    reallocate(new_capacity, stream);
    size_ = keep_size;
  }
}

void device_buffer::shrink_to_fit(stream_view stream) {
  if (capacity_ > size_) reallocate(size_, stream);
}

void device_buffer::check_range(std::size_t bytes, std::size_t offset, const char* where) const {
  if (offset > size_ || bytes > size_ - offset) {
    throw logic_error(std::string("gpumem::device_buffer::") + where + ": " + std::to_string(bytes) +
                      " bytes at offset " + std::to_string(offset) + " do not fit in the buffer's " +
                      std::to_string(size_) + " bytes");
  }
}

void device_buffer::copy_from(const void* source, std::size_t bytes, stream_view stream, std::size_t offset) {
  check_range(bytes, offset, "copy_from");
  if (source == nullptr && bytes != 0) throw logic_error("gpumem::device_buffer::copy_from: null source");
  copy(static_cast<char*>(data_) + offset, source, bytes, stream);
}

void device_buffer::copy_to(void* destination, std::size_t bytes, stream_view stream, std::size_t offset) const {
  check_range(bytes, offset, "copy_to");
  if (destination == nullptr && bytes != 0) throw logic_error("gpumem::device_buffer::copy_to: null destination");
  copy(destination, static_cast<const char*>(data_) + offset, bytes, stream);
}

void device_buffer::copy(void* dst, const void* src, std::size_t bytes, stream_view stream) const {
  if (bytes == 0) return;
  // The default-stream handles mean the current context's: make the buffer's device current.
  detail::device_context_guard guard(device_ >= 0 ? device_ : stream.device());
  gpumem::copy(dst, src, bytes, stream);
}

}  // namespace gpumem
