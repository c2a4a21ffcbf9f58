// A pool_resource driven by a byte string: the shared body of the libFuzzer
// target (pool_fuzz.cpp) and of the test that replays random programs under
// GoogleTest (pool_program_test.cpp). Each byte string is one program of
// allocations, frees (on the allocating stream or another), trims, releases and
// statistics reads on three streams, checked after every step against the
// pool's invariants and a model of what is live.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gpumem::test {

// Runs the program; returns an empty string, or what went wrong.
std::string run_pool_program(const std::uint8_t* data, std::size_t size);

}  // namespace gpumem::test
