// device_vector<T>: a typed view of a growable_buffer (docs/vmm.md). Elements live
// in device memory; the host never touches them, so T must be trivially copyable
// and its contents after growth are those of the memory (nothing is constructed).
#pragma once

#include <cstddef>
#include <limits>
#include <type_traits>
#include <utility>

#include "gpumem/error.hpp"
#include "gpumem/vmm/growable_buffer.hpp"

namespace gpumem {

template <class T>
class device_vector {
  static_assert(std::is_trivially_copyable_v<T>, "device_vector<T> holds device memory: T must be trivially copyable");

 public:
  using value_type = T;
  using size_type = std::size_t;

  explicit device_vector(int device = 0, stream_view stream = {}, growable_options options = {})
      : buffer_(device, stream, std::move(options)) {}
  device_vector(size_type count, int device, stream_view stream = {}, growable_options options = {})
      : buffer_(bytes_of(count), device, stream, std::move(options)) {}

  T* data() noexcept { return static_cast<T*>(buffer_.data()); }
  const T* data() const noexcept { return static_cast<const T*>(buffer_.data()); }
  size_type size() const noexcept { return buffer_.size() / sizeof(T); }
  bool empty() const noexcept { return buffer_.empty(); }
  size_type capacity() const noexcept { return buffer_.capacity() / sizeof(T); }

  void reserve(size_type count) { buffer_.reserve(bytes_of(count)); }
  void resize(size_type count) { buffer_.resize(bytes_of(count)); }
  void shrink_to_fit() { buffer_.shrink_to_fit(); }
  void clear() noexcept { buffer_.clear(); }

  growable_buffer& buffer() noexcept { return buffer_; }
  const growable_buffer& buffer() const noexcept { return buffer_; }

 private:
  static std::size_t bytes_of(size_type count) {
    if (count > std::numeric_limits<std::size_t>::max() / sizeof(T)) {
      throw out_of_memory(out_of_memory_info{.requested_bytes = std::numeric_limits<std::size_t>::max(),
                                             .resource = "device_vector",
                                             .reason = "element count overflows the address space"});
    }
    return count * sizeof(T);
  }
  growable_buffer buffer_;
};

}  // namespace gpumem
