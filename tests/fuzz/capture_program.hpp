// A pool driven by a byte string while CUDA graph captures begin and end on its
// streams, in every capture mode: allocations under a capture are the graph's
// memory, freed under it or after it (the graph launched or dropped); the pool's
// own blocks are refused under it; the other streams are served meanwhile,
// trims included. Checked after every step: the capture is never invalidated by
// the pool, statistics count the pool's allocations only, nothing overlaps, and
// the pool's invariants hold (Note [Pools and stream capture], Note [Calls a
// capture elsewhere forbids]). The default pool or pool_resource, with or
// without the capture watch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gpumem::test {

// Runs the program; returns an empty string, or what went wrong.
std::string run_capture_program(const std::uint8_t* data, std::size_t size);

}  // namespace gpumem::test
