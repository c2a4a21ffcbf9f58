// A fixed-size array of zero-valued records in anonymous pages that the
// operating system commits only where they are written: a paged pool's
// per-page records of a segment (src/pool/block.hpp, chunk).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace gpumem::detail {

// Note [Page records on demand]
// A segment of vmm_pool_resource reserves the device's memory in addresses
// (Note [When addresses run short], src/vmm/page_backing.cpp) and keeps a few
// records per page of it: on an H200, 67,000 pages of 2 MiB and about 2 MB of
// records for each segment, two segments a stream. Held in std::vector, every
// record was written when the segment was made: each stream's first
// allocations wrote and committed megabytes of host memory, most of it never
// read again (a stream's blocks and slots lie at the front of its segments).
// An anonymous mapping is zero until written and commits a host page only
// where one is, so a segment costs one mmap, and its records cost host memory
// in proportion to the pages the stream has used. Zero is each record's
// initial value: a null handle, a null pointer, no ready or busy bit, and
// page_uses{} (T must be trivially copyable, and all-zero bytes its
// value-initialised state). Reading a record never written reads the shared
// zero page: the scans over a whole segment (the inspector, the address
// shortage, a trim's walk of a free block over the segment's tail) commit nothing.
template <class T>
class zeroed_array {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>,
                "zeroed_array holds records whose all-zero bytes are their initial value");

 public:
  zeroed_array() noexcept = default;
  explicit zeroed_array(std::size_t n) {
    if (n == 0) return;
    if (n > SIZE_MAX / sizeof(T)) throw std::bad_array_new_length();
    void* p = ::mmap(nullptr, n * sizeof(T), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    // Host pages of 4 KiB: a huge page would commit 2 MiB of records at the
    // first write near it. Where the kernel has no huge pages this fails, harmlessly.
    (void)::madvise(p, n * sizeof(T), MADV_NOHUGEPAGE);
    data_ = static_cast<T*>(p);
    size_ = n;
  }
  ~zeroed_array() { reset(); }
  zeroed_array(zeroed_array&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  zeroed_array& operator=(zeroed_array&& o) noexcept {
    if (this != &o) {
      reset();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  zeroed_array(const zeroed_array&) = delete;
  zeroed_array& operator=(const zeroed_array&) = delete;

  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  T& operator[](std::size_t i) noexcept { return data_[i]; }
  const T& operator[](std::size_t i) const noexcept { return data_[i]; }
  T* begin() noexcept { return data_; }
  T* end() noexcept { return data_ + size_; }
  const T* begin() const noexcept { return data_; }
  const T* end() const noexcept { return data_ + size_; }
  T& front() noexcept { return data_[0]; }
  T& back() noexcept { return data_[size_ - 1]; }
  const T& front() const noexcept { return data_[0]; }
  const T& back() const noexcept { return data_[size_ - 1]; }
  std::size_t bytes() const noexcept { return size_ * sizeof(T); }
  // The bytes of the array that the host holds in memory now (mincore): the
  // pages written, for tests and the inspector.
  std::size_t resident_bytes() const {
    if (data_ == nullptr) return 0;
    const std::size_t os_page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const std::size_t n = (bytes() + os_page - 1) / os_page;
    std::vector<unsigned char> in(n);
    if (::mincore(data_, bytes(), in.data()) != 0) return bytes();  // cannot tell: count all
    std::size_t resident = 0;
    for (unsigned char v : in) resident += (v & 1U) != 0 ? os_page : 0;
    return resident;
  }

 private:
  void reset() noexcept {
    // munmap fails only for an address range that is not a mapping: never ours.
    if (data_ != nullptr) ::munmap(data_, size_ * sizeof(T));
    data_ = nullptr;
    size_ = 0;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace gpumem::detail
