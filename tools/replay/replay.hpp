// gpumem-replay's engine: replays a recorded event log against a resource stack
// made from a GPUMEM_CONF string (docs/observability.md, "Replaying a log").
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/event_log_reader.hpp"
#include "gpumem/memory_resource.hpp"
#include "gpumem/stream.hpp"
#include "replay/replay_threads.hpp"

namespace gpumem::tools {

// Most OS threads a replay starts; a log of more threads shares them (replay.cpp).
inline constexpr std::size_t max_replay_threads = 256;

enum class replay_order {
  seq,     // one global order: every event waits for the one before it (exact peaks)
  thread,  // each thread in its own order; a free waits only for its allocation
};

// Streams a caller keeps across replays (replay_options::streams).
struct replay_stream_set {
  std::map<std::uint64_t, std::unique_ptr<stream>> by_logged;  // by the logged stream handle
};

// The stream that stands for the logged stream `logged` (made in `set` on `device`
// when first asked for; the logged default streams stand for themselves).
stream_view replay_stream(replay_stream_set& set, std::uint64_t logged, int device);

// Makes in `set` every stream the rows of `source` in `events` name, before a
// resource exists: a resource may take the device's free memory when it is made
// (RMM's arena sized from it), and a stream made after it could then fail for
// want of memory (cuStreamCreate needs a little); nor is a stream's memory the
// resource's.
void make_replay_streams(replay_stream_set& set, const std::vector<logged_event>& events, int device,
                         const std::string& source = "app");

struct replay_options {
  std::string resource = "pool";  // GPUMEM_CONF grammar
  int device = 0;
  replay_order order = replay_order::seq;
  std::string source = "app";     // the rows replayed; "upstream" rows are what the original pool did
  // When set, the replay's streams come from (and stay in) this set, so that the
  // replays of a log on one resource run on the same streams, as a program's
  // later steps do; else each replay makes its own.
  replay_stream_set* streams = nullptr;
  // The same for the OS threads: when set, the replays run on these threads, kept
  // between them; else each replay starts its own and joins them.
  replay_threads* threads = nullptr;
};

struct replay_result {
  std::size_t events_in_log = 0;
  std::size_t replayed = 0;          // allocate + deallocate calls made
  std::size_t allocations = 0;
  std::size_t failures = 0;          // replayed allocations that failed (out of memory)
  std::size_t skipped = 0;           // rows not replayed: failed in the log, other sources, or
                                     // frees of allocations not in the log or failed here
  std::size_t left_live = 0;         // allocations the log never freed (freed after timing)
  std::size_t threads = 0;
  std::size_t streams = 0;
  double seconds = 0;                // wall time of the replay (events only)
  std::uint64_t log_peak_live_bytes = 0;  // what the log itself says
  std::uint64_t peak_live_bytes = 0;      // measured during the replay
  std::uint64_t peak_reserved_bytes = 0;  // what the stack took from the driver, at most
  // Whether peak_reserved_bytes was counted: not for the bases async and vmm, whose
  // pools take device memory inside the resource (config_hooks::wrap_device_memory).
  bool reserved_counted = false;
  std::uint64_t log_peak_reserved_bytes = 0;  // from "upstream" rows, when the log has them
  std::vector<std::string> failure_messages;  // the first few
};

// Replays `events` (in seq order, as read_event_log returns them). Throws
// gpumem::logic_error for a bad resource string; allocation failures are results.
replay_result replay_events(const std::vector<logged_event>& events, const replay_options& options);

// Called after each replayed row, in the thread that replayed it: `index` is the
// row's place among the rows replayed (0, 1, ...), `live_bytes` what is live after
// it. In seq order the calls come one at a time, in the log's order.
using replay_observer = std::function<void(std::size_t index, std::uint64_t live_bytes)>;

// The same against a resource the caller made and keeps (options.resource is not
// used): gpumem-bench replays logs against every row of its tables, peers
// included. What the resource reserves is not counted here (peak_reserved_bytes
// stays 0); the caller measures it its own way, for instance from the observer.
// The resource is left as the replay found it: everything replayed is freed and
// the replay's streams are synchronized before this returns.
replay_result replay_events_on(const std::vector<logged_event>& events, memory_resource& mr,
                               const replay_options& options, const replay_observer& observer = {});

}  // namespace gpumem::tools
