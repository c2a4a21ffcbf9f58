// Checks every structural invariant of a pool_resource, for tests and fuzzers:
// chunks tile their address ranges with blocks; no two free neighbours are left
// unmerged; the free index, quick caches, pending lists, live map and counters
// agree with the blocks; chunks do not overlap and each is owned by one arena.
// Not for the hot path: it locks everything and walks every block.
#pragma once

#include <cstddef>
#include <string>

#include "gpumem/export.hpp"
#include "gpumem/pool_resource.hpp"

namespace gpumem::detail {

struct GPUMEM_EXPORT pool_inspector {
  // Empty when every invariant holds, else a description of the first violation.
  static std::string violations(pool_resource& pool);
  // The bytes requested for ptr when it is a live allocation of the pool, else 0.
  static std::size_t live_requested_bytes(const pool_resource& pool, const void* ptr);
};

}  // namespace gpumem::detail
