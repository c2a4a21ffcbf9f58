// Controls of the host simulator backend (GPUMEM_BACKEND=sim), for tests and
// tools. Calling them while the cuda backend is selected throws logic_error.
//
// The simulator models N devices (GPUMEM_SIM_DEVICES, default 2) with
// GPUMEM_SIM_MEMORY bytes each (default 8GiB; suffixes K/M/G/T, KiB/MiB/...),
// streams that run their work in order on host threads, events, host
// functions, memcpy/memset and device allocation with real out-of-memory.
// docs/simulator.md says what it does not model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "gpumem/export.hpp"

namespace gpumem::sim {

// Fault injection for device allocations (cuMemAlloc, cuMemAllocAsync):
// the nth allocation from now on (1 = the next one) fails with out-of-memory.
// 0 turns it off. Also set by GPUMEM_SIM_FAIL_ALLOC=n at start.
GPUMEM_EXPORT void fail_nth_allocation(std::uint64_t n);
// Each allocation fails with this probability, drawn from a generator seeded
// with `seed`. 0 turns it off. Also GPUMEM_SIM_FAIL_RANDOM=p and GPUMEM_SIM_SEED.
GPUMEM_EXPORT void fail_allocations_at_random(double probability, std::uint64_t seed);
// The nth cuMemMap or cuMemSetAccess from now on (1 = the next one) fails with
// out-of-memory, as the driver's does when a full device has no memory left for
// the mapping's page tables. 0 turns it off.
GPUMEM_EXPORT void fail_nth_mapping(std::uint64_t n);
// Number of allocations (and mappings) the fault injection has failed so far.
GPUMEM_EXPORT std::uint64_t injected_failures();

// Whether cuDeviceCanAccessPeer says two different devices can access each other's
// memory (default true: every simulated device is host memory). false simulates a
// machine without peer access. Also GPUMEM_SIM_PEER_ACCESS=0|1 at start.
GPUMEM_EXPORT void set_peer_access(bool enabled);

// Whether a capture watch (gpumem/capture_watch.hpp) can start (default true).
// false simulates a process whose one CUPTI subscription a profiler holds: a
// watch started meanwhile stays inactive and says why, and the pools that asked
// for it ask the driver on every call. A watch already running is not stopped.
GPUMEM_EXPORT void set_capture_watch_available(bool available);

// Bytes of a device's simulated memory in use (as the driver counts them, rounded up
// to its allocation granularity).
GPUMEM_EXPORT std::size_t used_bytes(int device);
// Number of device allocations live on a device.
GPUMEM_EXPORT std::size_t live_allocations(int device);

// How many times gpumem has called the driver entry point `entry_point` (as
// cuda.h names it without a version suffix, e.g. "cuStreamWaitEvent") since the
// simulator started, from every thread: tests assert with it which driver calls
// a path makes. A name that is not one of gpumem's entry points throws logic_error.
GPUMEM_EXPORT std::uint64_t driver_calls(std::string_view entry_point);

}  // namespace gpumem::sim
