// Text for messages and reports, with snprintf only. Error paths and reports may
// run in processes where another library carries its own copy of the C++
// runtime's locale machinery (Python with numba's llvmlite, PyTorch): a pointer
// printed into a std::ostringstream inside a PyTorch free once crashed there on a
// null facet. Plain formatting needs no locale, so gpumem's library uses no iostreams.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace gpumem::detail {

// "1.50 MiB", "512 B".
std::string human_bytes(std::size_t bytes);
// "0x7f00c0000000".
std::string hex_pointer(std::uintptr_t value);
inline std::string pointer_text(const void* p) { return hex_pointer(reinterpret_cast<std::uintptr_t>(p)); }
// "1.234 ms", "12.0 s".
std::string human_duration_ns(std::uint64_t ns);

// A byte count as people write it, for GPUMEM_CONF, GPUMEM_SIM_MEMORY and the tools:
// digits and an optional unit, K/M/G/T, KB/MB/GB/TB or KiB/MiB/GiB/TiB (all powers of
// 1024, any case), or B; blanks around and between allowed ("4096", "512M", "16GB",
// "8 GiB"). nullopt when malformed or past SIZE_MAX. 0 is returned as 0: callers that
// need a positive size say so in their own words.
std::optional<std::size_t> parse_byte_size(std::string_view text);

}  // namespace gpumem::detail
