// Text for messages and reports, with snprintf only. Error paths and reports may
// run in processes where another library carries its own copy of the C++
// runtime's locale machinery (Python with numba's llvmlite, PyTorch): a pointer
// printed into a std::ostringstream inside a PyTorch free once crashed there on a
// null facet. Plain formatting needs no locale, so gpumem's library uses no iostreams.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gpumem::detail {

// "1.50 MiB", "512 B".
std::string human_bytes(std::size_t bytes);
// "0x7f00c0000000".
std::string hex_pointer(std::uintptr_t value);
inline std::string pointer_text(const void* p) { return hex_pointer(reinterpret_cast<std::uintptr_t>(p)); }
// "1.234 ms", "12.0 s".
std::string human_duration_ns(std::uint64_t ns);

}  // namespace gpumem::detail
