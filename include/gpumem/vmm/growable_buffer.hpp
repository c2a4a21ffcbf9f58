// growable_buffer: device memory that grows like std::vector without a copy and
// without ever holding old and new memory at once (docs/vmm.md).
//
// reserve() takes addresses only; resize() maps physical memory at the end. The
// first reservation covers the device's whole memory (growable_options::
// address_bytes), so growth never needs more addresses unless asked to reserve
// more. When the address range is full, the buffer first tries to extend it in
// place (a reservation right after it, asked for with an address hint), else
// reserves a larger range elsewhere and maps the same physical memory there: the
// contents stay, nothing is copied, data() changes. shrink_to_fit() gives the unused tail
// back to the device. Memory is unmapped only after the work queued on the
// buffer's stream before the call is complete (never a device synchronisation).
//
// The buffer's stream is where its memory is used: work on other streams must be
// ordered before the buffer's next shrink, relocation or destruction by the
// caller (an event), as with any stream-ordered allocation.
//
// Not thread-safe: one buffer, one thread at a time (like std::vector).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include <cuda.h>

#include "gpumem/export.hpp"
#include "gpumem/stream.hpp"

namespace gpumem {
namespace detail::vmm {
class release_queue;
}

struct growable_options {
  // Physical handles are at least this large (0: the device's granularity, 2 MiB
  // on H100/H200) and at most max_chunk_bytes: one growth of N bytes maps
  // ceil(N / max_chunk_bytes) handles. Fewer, larger handles cost fewer driver calls
  // (cuMemCreate and cuMemSetAccess cost per handle); shrink_to_fit gives back
  // whole handles only, so set both to the granularity for the finest shrinking.
  std::size_t min_chunk_bytes = 0;
  std::size_t max_chunk_bytes = std::size_t{1} << 30;
  // Addresses reserved at the first growth (or reserve()): at least this many, so
  // the buffer grows to this size without ever moving. 0: the device's memory
  // size, which no growth can exceed (addresses are cheap; physical memory is
  // mapped only as the buffer grows). While the buffers of the process together
  // hold more than 16 TiB of addresses, a new buffer reserves only what it needs
  // (and then relocates as it grows past it), so that many buffers cannot use up
  // the device's address space.
  std::size_t address_bytes = 0;
  // Devices besides the owner that get read/write access (no cuCtxEnablePeerAccess needed).
  std::vector<int> peer_devices;
  // Request POSIX-file-descriptor shareable handles (for IPC).
  bool posix_fd_shareable = false;
};

class GPUMEM_EXPORT growable_buffer {
 public:
  // An empty buffer of `device`'s memory used on `stream` (a stream of that device).
  explicit growable_buffer(int device = 0, stream_view stream = {}, growable_options options = {});
  // With `bytes` already mapped.
  growable_buffer(std::size_t bytes, int device, stream_view stream = {}, growable_options options = {});
  ~growable_buffer();
  growable_buffer(growable_buffer&& other) noexcept;
  growable_buffer& operator=(growable_buffer&& other) noexcept;
  growable_buffer(const growable_buffer&) = delete;
  growable_buffer& operator=(const growable_buffer&) = delete;

  void* data() noexcept { return reinterpret_cast<void*>(base_); }
  const void* data() const noexcept { return reinterpret_cast<const void*>(base_); }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  // Bytes backed by physical memory (size() may grow to this without mapping).
  std::size_t capacity() const noexcept { return mapped_; }
  // Bytes of addresses reserved (size() may grow to this without moving).
  std::size_t reserved() const noexcept { return reserved_; }
  int device() const noexcept { return device_; }
  stream_view stream() const noexcept { return stream_; }
  // Later unmaps are ordered after work on `s` (same device) instead.
  void set_stream(stream_view s);
  // How many times growth had to move to a new address range (no copy either way).
  std::size_t relocations() const noexcept { return relocations_; }
  std::size_t chunks() const noexcept { return chunks_.size(); }

  // Addresses for at least `bytes` (no physical memory). Never shrinks.
  void reserve(std::size_t bytes);
  // size() := bytes; maps physical memory at the end when growing (contents
  // kept). On out-of-memory throws gpumem::out_of_memory and leaves the buffer as it was.
  void resize(std::size_t bytes);
  // Unmaps and releases the physical memory past size() (whole handles), after the
  // work queued on the stream so far. Addresses stay reserved.
  void shrink_to_fit();
  // size() := 0; memory stays mapped until shrink_to_fit().
  void clear() noexcept { size_ = 0; }

 private:
  struct chunk {
    CUmemGenericAllocationHandle handle;
    std::size_t bytes;
  };
  struct range {
    CUdeviceptr base;
    std::size_t bytes;
  };
  void ensure_addresses(std::size_t bytes);
  void map_more(std::size_t bytes);
  // logic_error when `s` is another device's stream (the legacy and per-thread streams are any device's).
  void check_stream(stream_view s) const;
  void give_back_everything() noexcept;

  int device_ = 0;
  stream_view stream_;
  growable_options options_;
  std::size_t granularity_ = 0;
  CUdeviceptr base_ = 0;
  std::size_t size_ = 0;
  std::size_t mapped_ = 0;
  std::size_t reserved_ = 0;
  std::size_t relocations_ = 0;
  std::vector<chunk> chunks_;  // mapped back to back from base_
  std::vector<range> ranges_;  // reservations back to back from base_
  // Shrinks waiting for the stream: a growth drains it before mapping there again.
  std::unique_ptr<detail::vmm::release_queue> pending_;
};

}  // namespace gpumem
