// Diagnostics: what gpumem says without being asked (a leak report, statistics
// at exit, a failure a destructor cannot throw) goes through one sink, with a
// level. The default sink writes each message to stderr as a line. A program
// redirects them with set_diagnostic_sink; gpumem's Python package routes them
// to the `logging` module (logger "gpumem") while the interpreter runs.
#pragma once

#include <functional>
#include <string_view>

#include "gpumem/export.hpp"

namespace gpumem {

enum class diagnostic_level { debug, info, warning, error };

// Receives one message (no trailing newline; a report may span several lines).
// May be called from any thread, and from destructors at exit.
using diagnostic_sink = std::function<void(diagnostic_level level, std::string_view message)>;

// Installs `sink` (empty: the default, stderr) and returns the one it replaces
// (empty when that was the default). Thread-safe; a message being delivered
// meanwhile goes to the sink that was installed when it was sent.
GPUMEM_EXPORT diagnostic_sink set_diagnostic_sink(diagnostic_sink sink);

// Sends `message` to the sink. Never throws: a sink that throws has its
// message written to stderr instead.
GPUMEM_EXPORT void diagnose(diagnostic_level level, std::string_view message) noexcept;

// "debug", "info", "warning", "error".
GPUMEM_EXPORT std::string_view to_string(diagnostic_level level) noexcept;

}  // namespace gpumem
