// Small text helpers the adaptors share for their reports.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gpumem::detail {

// "1.50 MiB", "512 B".
std::string human_bytes(std::size_t bytes);
// "0x7f00c0000000".
std::string hex_pointer(std::uintptr_t value);
// "1.234 ms", "12.0 s".
std::string human_duration_ns(std::uint64_t ns);

}  // namespace gpumem::detail
