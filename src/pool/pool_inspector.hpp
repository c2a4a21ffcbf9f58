// Checks every structural invariant of a pool (pool_resource or
// vmm_pool_resource), for tests and fuzzers: chunks tile their address ranges
// with blocks; no two free neighbours are left unmerged; the free index, quick
// caches, pending lists, live map and counters agree with the blocks; chunks do
// not overlap and each is owned by one arena; and, for the paged pool, every
// page a block touches is mapped exactly when the block has memory (Note [Pages
// under the blocks] in src/vmm/page_blocks.cpp). Not for the hot path: it locks
// everything and walks every block.
#pragma once

#include <cstddef>
#include <string>

#include "gpumem/export.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/vmm_pool_resource.hpp"

namespace gpumem::detail {

class stream_ordered_pool;

struct GPUMEM_EXPORT pool_inspector {
  // Empty when every invariant holds, else a description of the first violation.
  static std::string violations(pool_resource& pool);
  static std::string violations(vmm_pool_resource& pool);
  // How many times the pool looked at a free slot's pages (every arena), ever.
  static std::size_t slot_looks(vmm_pool_resource& pool);
  // The host memory of the paged pool's per-page records of its segments: all
  // of it, and what the host holds now (Note [Page records on demand]).
  struct record_bytes {
    std::size_t total = 0;
    std::size_t resident = 0;
  };
  static record_bytes page_records(vmm_pool_resource& pool);
  // The bytes requested for ptr when it is a live allocation of the pool, else 0.
  static std::size_t live_requested_bytes(const pool_resource& pool, const void* ptr);

 private:
  // page_bytes: the paged pool's page (0: every chunk is wholly mapped).
  static std::string engine_violations(stream_ordered_pool& p, std::size_t page_bytes);
};

}  // namespace gpumem::detail
