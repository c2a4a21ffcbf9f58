// pool_resource: a fast, stream-ordered, coalescing sub-allocator over any
// upstream resource (docs/pool.md).
//
// Each stream gets its own arena (free blocks, live allocations, upstream chunks,
// one lock that only threads using that stream contend for). A block freed on a
// stream is reusable on that stream at once. Other streams reuse it only after
// the work queued before the free is ordered before them: arenas fence their
// frees with an event, recorded when another stream asks for it rather than per
// free, and a stream that takes another arena's memory waits on that event on
// the device (cuStreamWaitEvent), never on the host.
//
// Thread safety: all members may be called concurrently.
#pragma once

#include <cstddef>
#include <limits>
#include <memory>

#include "gpumem/export.hpp"
#include "gpumem/memory_resource.hpp"

namespace gpumem {
namespace detail {
struct pool_inspector;  // tests and fuzzers check the pool's invariants through it
}

struct pool_options {
  // Reserved from the upstream when the pool is made (0: nothing until first use).
  std::size_t initial_bytes = 0;
  // The pool never holds more than this from the upstream (0: no limit but the device).
  std::size_t maximum_bytes = 0;
  // Smallest upstream request when an arena grows; growth doubles with the pool's
  // size up to max_chunk_bytes (docs/pool.md, "Growth").
  std::size_t min_chunk_bytes = std::size_t{2} << 20;
  std::size_t max_chunk_bytes = std::size_t{1} << 30;
  // A stream whose own arena cannot serve a request takes other streams' fenced
  // whole free chunks (after an event wait on the device) before asking the upstream
  // for more, and their free blocks when the upstream cannot give more.
  bool reuse_across_streams = true;
  // Keep freed blocks whole by exact size for the next request of that size
  // (docs/pool.md, "Quick cache").
  bool quick_cache = true;
  // Periodic fences (docs/pool.md, "Stream ordering"): while the pool serves
  // several streams, a stream also records its fence event after this many frees,
  // or this many bytes freed, since its last fence. The defaults (the largest
  // values) mean never: a stream fences only when another stream asked for it (it
  // found that stream's free memory unfenced) or the call is a slow path, which
  // keeps the hot path out of the driver's locks (W3). Smaller values make other
  // streams' reuse and trim() timelier at the cost of one event record per period.
  unsigned fence_interval = std::numeric_limits<unsigned>::max();
  std::size_t fence_bytes = std::numeric_limits<std::size_t>::max();
  // Ask, at every call on a stream other than the legacy default, whether the
  // stream is being captured into a CUDA graph (one driver query: docs/benchmarks.md).
  // Under capture, allocations are the graph's own memory (cuMemAllocAsync becomes
  // an allocation node; freed under the capture or after it), and a block the
  // pool handed out before the capture cannot be freed under it (a logic_error):
  // docs/pool.md, "CUDA graphs". Turn it off only where no stream the pool serves
  // is ever captured: the hot path then makes no driver call.
  bool check_capture = true;
  // With check_capture: hold the process-wide capture watch (capture_watch.hpp)
  // and skip the query while no capture is in progress anywhere in the process
  // (one load instead of the driver call). Where the watch cannot start (no libcupti, a
  // profiler holding CUPTI), the pool asks the driver as before.
  bool watch_captures = false;
};

struct pool_statistics {
  std::size_t used_bytes = 0;       // handed out (rounded to the 256-byte granule)
  std::size_t reserved_bytes = 0;   // held from the upstream
  std::size_t peak_reserved_bytes = 0;  // the most held at once since the pool was made or reset_peak()
  std::size_t free_bytes = 0;       // reserved and not handed out
  std::size_t free_blocks = 0;
  std::size_t largest_free_block = 0;
  std::size_t allocations = 0;      // live
  std::size_t chunks = 0;           // upstream allocations held
  std::size_t streams = 0;          // arenas
};

class GPUMEM_EXPORT pool_resource final : public memory_resource {
 public:
  // The upstream must outlive the pool (it is not owned).
  explicit pool_resource(memory_resource& upstream, pool_options options = {});
  // The pool shares ownership of the upstream.
  explicit pool_resource(std::shared_ptr<memory_resource> upstream, pool_options options = {});
  ~pool_resource() override;

  // Gives every fully free upstream chunk back to the upstream. Waits for the
  // device once (cuCtxSynchronize) so that every free is complete. Returns bytes.
  std::size_t release();
  // Gives back the fully free chunks whose frees are already fenced (see
  // docs/pool.md), ordered after those frees on the device: the host never waits.
  // Returns bytes.
  std::size_t trim();
  // The same, after fencing the frees made so far on `stream` (the caller's stream
  // is alive; the pool never records on a stream it is not handed).
  std::size_t trim(stream_view stream);

  pool_statistics statistics() const;
  // peak_reserved_bytes becomes what the pool holds now (torch.cuda.reset_peak_memory_stats).
  void reset_peak();
  const pool_options& options() const noexcept;
  memory_resource& upstream() const noexcept;
  resource_properties properties() const noexcept override;
  std::string_view layer_name() const noexcept override { return "pool"; }
  const memory_resource* next_layer() const noexcept override { return &upstream(); }
  std::optional<std::size_t> available_bytes() const override;  // the device's free memory and the pool's
  std::size_t release_free_memory() override;                     // release()

 private:
  void* do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) override;
  void do_deallocate(void* ptr, std::size_t bytes, stream_view stream,
                     std::size_t alignment) override;
  void* do_try_allocate_now(std::size_t bytes, stream_view stream, std::size_t alignment) override;
  bool do_try_deallocate_now(void* ptr, std::size_t bytes, stream_view stream, std::size_t alignment) override;

  friend struct detail::pool_inspector;
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace gpumem
