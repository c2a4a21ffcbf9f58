// The diagnostic sink (include/gpumem/diagnostics.hpp).
#include "gpumem/diagnostics.hpp"

#include "diagnose.hpp"

#include <cstdarg>
#include <cstdio>
#include <string>
#include <memory>
#include <mutex>
#include <utility>

namespace gpumem {
namespace {

// Leaked on purpose: destructors of other translation units report through it
// at exit, after this one's statics would have gone.
struct sink_slot {
  std::mutex mutex;
  std::shared_ptr<const diagnostic_sink> sink;  // null: stderr
};

sink_slot& slot() {
  static sink_slot* s = new sink_slot;
  return *s;
}

void to_stderr(std::string_view message) noexcept {
  std::fprintf(stderr, "%.*s\n", static_cast<int>(message.size()), message.data());
}

}  // namespace

diagnostic_sink set_diagnostic_sink(diagnostic_sink sink) {
  auto next = sink ? std::make_shared<const diagnostic_sink>(std::move(sink)) : nullptr;
  sink_slot& s = slot();
  std::shared_ptr<const diagnostic_sink> previous;
  {
    std::lock_guard lock(s.mutex);
    previous = std::exchange(s.sink, std::move(next));
  }
  return previous ? *previous : diagnostic_sink{};
}

void diagnose(diagnostic_level level, std::string_view message) noexcept {
  while (!message.empty() && message.back() == '\n') message.remove_suffix(1);
  std::shared_ptr<const diagnostic_sink> sink;
  try {
    sink_slot& s = slot();
    std::lock_guard lock(s.mutex);
    sink = s.sink;
  } catch (...) {  // the mutex failed: stderr still works
  }
  if (sink == nullptr) {
    to_stderr(message);
    return;
  }
  try {
    (*sink)(level, message);  // outside the lock: a sink may log more, or replace itself
  } catch (...) {
    to_stderr(message);
  }
}

void detail::diagnosef(diagnostic_level level, const char* format, ...) noexcept {
  char small[512];
  std::va_list args;
  va_start(args, format);
  std::va_list again;
  va_copy(again, args);
  const int n = std::vsnprintf(small, sizeof small, format, args);
  va_end(args);
  if (n < 0) {
    va_end(again);
    diagnose(level, format);  // the format itself says what happened
    return;
  }
  if (static_cast<std::size_t>(n) < sizeof small) {
    va_end(again);
    diagnose(level, std::string_view(small, static_cast<std::size_t>(n)));
    return;
  }
  try {
    std::string big(static_cast<std::size_t>(n) + 1, '\0');
    std::vsnprintf(big.data(), big.size(), format, again);
    va_end(again);
    big.resize(static_cast<std::size_t>(n));
    diagnose(level, big);
  } catch (...) {
    va_end(again);
    diagnose(level, std::string_view(small, sizeof small - 1));
  }
}

std::string_view to_string(diagnostic_level level) noexcept {
  switch (level) {
    case diagnostic_level::debug:
      return "debug";
    case diagnostic_level::info:
      return "info";
    case diagnostic_level::warning:
      return "warning";
    case diagnostic_level::error:
      return "error";
  }
  return "unknown";
}

}  // namespace gpumem
