// The default pool's programs' common checks (vmm_program_checks.hpp).
#include "fuzz/vmm_program_checks.hpp"

#include "gpumem/device.hpp"

namespace gpumem::test {

void warm_streams(std::span<stream> streams) {
  vmm_pool_resource warm(0);
  for (stream& s : streams) {
    void* p = warm.allocate(1, s);
    warm.deallocate(p, 1, s);
    warm.trim(s);
  }
}

std::size_t device_free_bytes() { return device_memory_info(0).free_bytes; }

std::string released_to_nothing(vmm_pool_resource& pool) {
  pool.release();
  const vmm_pool_statistics st = pool.statistics();
  if (st.allocations != 0 || st.used_bytes != 0) return "allocations left after freeing everything";
  if (st.mapped_bytes != 0 || st.pages != 0) return "release() kept physical memory with nothing live";
  if (st.alias_pages != 0) return "release() left aliases mapped";
  return {};
}

std::string device_memory_kept(std::size_t free_before) {
  const std::size_t free_after = device_free_bytes();
  if (free_after == free_before) return {};
  return "the pool lost device memory: " + std::to_string(free_before) + " bytes free before, " +
         std::to_string(free_after) + " after";
}

}  // namespace gpumem::test
