// gpumem's own diagnostics, printf-style, through the sink (gpumem/diagnostics.hpp).
#pragma once

#include "gpumem/diagnostics.hpp"

namespace gpumem::detail {

// Formats and sends one message; never throws (a trailing newline is dropped).
[[gnu::format(printf, 2, 3)]] void diagnosef(diagnostic_level level, const char* format, ...) noexcept;

}  // namespace gpumem::detail
