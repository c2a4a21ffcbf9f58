// The default pool shared by two or three host threads, each driven by its own
// part of a byte string on its own two streams, under a budget small enough that
// the pool must move free pages between the threads' streams (Pages, frugal
// first: steps 2, 6 and 7 of docs/vmm.md, which one thread's programs never
// reach). Every allocation's bytes are stamped and read back before its free
// (program_contents.hpp); an allocation may fail only where the pages the live
// allocations of every thread can pin leave no room; at the end the pool's
// invariants hold, everything is given back and no device memory is lost.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gpumem::test {

// Runs the program; returns an empty string, or what went wrong. Timing decides
// how the threads interleave, so a failure may not repeat on a second run.
std::string run_vmm_pool_threads_program(const std::uint8_t* data, std::size_t size);

}  // namespace gpumem::test
