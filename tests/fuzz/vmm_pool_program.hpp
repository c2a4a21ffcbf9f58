// A vmm_pool_resource driven by a byte string, like pool_program.hpp: small
// requests (the arenas) and large ones (the address-wide allocator and its
// fronts) on three streams, frees on any stream, trims, releases and
// statistics reads, checked after every step against a model of what is live.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gpumem::test {

// Runs the program; returns an empty string, or what went wrong.
std::string run_vmm_pool_program(const std::uint8_t* data, std::size_t size);

}  // namespace gpumem::test
