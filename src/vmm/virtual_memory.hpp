// The virtual-memory layer: reserve / map / unmap / release over the driver seam,
// with the device's granularity, physical handles, access set once per
// contiguous range, and the queue that orders unmap and release after the frees
// they cover (docs/vmm.md). growable_buffer and vmm_pool_resource are built on it.
//
// Note [Ordering unmap and release after the frees]
// cuMemUnmap and cuMemRelease do not wait for work in flight (on a GPU or on the
// simulator): unmapping a page a queued kernel still reads makes that kernel
// fault. So nothing here unmaps memory that a stream may still use. Whoever gives
// memory back records an event on the stream the memory was last used on and
// hands the unmap/release to a release_queue with that event. The queue runs an
// entry once the host has seen its event complete: poll() asks cuEventQuery and
// never blocks, drain() waits on the entries' events (cuEventSynchronize: a wait
// for that stream's work only, never a device-wide synchronisation), and only
// the slow paths call drain(): a growth or a pool request that is short of
// physical memory. An entry whose event is already complete when it is queued
// (the stream was idle) runs at once. The process-wide queue, polled by every
// virtual-memory slow path and by gpumem::vmm::reclaim(), holds what destroyed
// buffers left behind.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "gpumem/stream.hpp"

namespace gpumem::detail::vmm {

// The device's allocation granularity (cuMemGetAllocationGranularity, recommended);
// cached per device. Throws logic_error if the device has no virtual memory management.
std::size_t granularity(int device);

std::size_t round_up(std::size_t n, std::size_t unit);

// ---- addresses ----
// Reserves `bytes` (a granularity multiple) of addresses, at `hint` if the driver
// honours it (best-effort: the range may come back elsewhere; callers compare). Returns 0 when the driver has no room (CUDA_ERROR_OUT_OF_MEMORY); throws
// cuda_error otherwise.
CUdeviceptr reserve(int device, std::size_t bytes, CUdeviceptr hint = 0, std::size_t alignment = 0);
void free_addresses(int device, CUdeviceptr base, std::size_t bytes);

// ---- physical memory ----
// A handle of `bytes` on `device`, or nullopt when the device is out of memory.
std::optional<CUmemGenericAllocationHandle> create(int device, std::size_t bytes, bool posix_fd_shareable);
void release(int device, CUmemGenericAllocationHandle handle);

// ---- mappings ----
void map(int device, CUdeviceptr at, std::size_t bytes, CUmemGenericAllocationHandle handle, std::size_t offset = 0);
// Whole mappings only; the caller has ordered this after every use (see the note).
void unmap(int device, CUdeviceptr at, std::size_t bytes);
// Read/write access for `device` and each of `peers`, one cuMemSetAccess for the whole range.
void set_access(int device, CUdeviceptr at, std::size_t bytes, const std::vector<int>& peers);

// ---- ordering unmap and release after frees (see the note) ----
class release_queue {
 public:
  release_queue() = default;
  ~release_queue();  // runs nothing: what is still queued is left to the process's end
  release_queue(const release_queue&) = delete;
  release_queue& operator=(const release_queue&) = delete;

  // Runs `action` once the work queued on `stream` (of `device`) so far has
  // completed: at once if it already has, else from a later poll() or drain().
  void enqueue(int device, stream_view stream, std::function<void()> action);
  // Runs every entry whose event completed. Never blocks. Returns the count run.
  std::size_t poll();
  // Waits for every entry's event and runs it. Returns the count run.
  std::size_t drain();
  bool empty() const;
  // Hands every entry to `other`, in order (they then run from there).
  void move_into(release_queue& other);

 private:
  struct entry {
    int device;
    CUevent event;
    std::function<void()> action;
  };
  static void run(entry& e) noexcept;
  mutable std::mutex mutex_;
  std::deque<entry> entries_;
};

// The process-wide queue (never destroyed).
release_queue& global_release_queue();

// The out_of_memory the virtual-memory resources throw: what was asked, what the
// resource holds, what the device has free (when it can say), and why.
[[noreturn]] void throw_out_of_memory(const char* resource, int device, std::size_t requested,
                                      std::size_t held, const std::string& reason);

}  // namespace gpumem::detail::vmm
