// What the default pool's programs (vmm_pool_program.hpp, on one thread, and
// vmm_pool_threads_program.hpp, on several) check alike around a program.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "gpumem/stream.hpp"
#include "gpumem/vmm_pool_resource.hpp"

namespace gpumem::test {

// The driver keeps some device memory for what a process makes first (its
// streams, its first events): made here for `streams`, so that the device's free
// memory counted after it is what the program's pool must give back.
void warm_streams(std::span<stream> streams);

// The pages an allocation of `bytes` aligned to `alignment` can pin: its whole
// pages, and one it may share with its neighbours. A frugal pool fails a request
// only where these, summed over the live allocations and the request, exceed what
// it may hold.
inline std::size_t pages_pinned(std::size_t bytes, std::size_t alignment, std::size_t page) {
  return (bytes + alignment + page - 1) / page + 1;
}

// The device's free memory, to compare with device_memory_kept.
std::size_t device_free_bytes();

// After every allocation was freed: release() gives back every page and alias.
// Empty, or what is wrong.
std::string released_to_nothing(vmm_pool_resource& pool);

// Once the pool is gone: the device has the free memory it had before.
std::string device_memory_kept(std::size_t free_before);

}  // namespace gpumem::test
