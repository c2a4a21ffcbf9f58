// The diagnostic sink (gpumem/diagnostics.hpp): what gpumem says without being
// asked reaches the installed sink with a level, and the default comes back.
#include <gtest/gtest.h>

#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "gpumem/cuda_resource.hpp"
#include "gpumem/diagnostics.hpp"
#include "gpumem/stream.hpp"

namespace gpumem::test {
namespace {

// Installs a sink that keeps every message; puts the previous one back.
class captured_diagnostics {
 public:
  captured_diagnostics() {
    previous_ = set_diagnostic_sink([this](diagnostic_level level, std::string_view message) {
      std::lock_guard lock(mutex_);
      seen_.emplace_back(level, std::string(message));
    });
  }
  ~captured_diagnostics() { set_diagnostic_sink(std::move(previous_)); }
  std::vector<std::pair<diagnostic_level, std::string>> seen() {
    std::lock_guard lock(mutex_);
    return seen_;
  }

 private:
  std::mutex mutex_;
  std::vector<std::pair<diagnostic_level, std::string>> seen_;
  diagnostic_sink previous_;
};

TEST(Diagnostics, AMessageReachesTheInstalledSinkWithItsLevelAndNoTrailingNewline) {
  captured_diagnostics capture;
  diagnose(diagnostic_level::info, "gpumem: a test message\n");
  const auto seen = capture.seen();
  ASSERT_EQ(seen.size(), 1U);
  EXPECT_EQ(seen[0].first, diagnostic_level::info);
  EXPECT_EQ(seen[0].second, "gpumem: a test message");
  EXPECT_EQ(to_string(diagnostic_level::warning), "warning");
}

TEST(Diagnostics, ALibraryWarningGoesThroughTheSink) {
  captured_diagnostics capture;
  {
    cuda_resource mr(0);
    stream s(0);
    (void)mr.allocate(4096, s);  // left live: the destructor frees it and says so
    s.synchronize();
  }
  const auto seen = capture.seen();
  ASSERT_EQ(seen.size(), 1U);
  EXPECT_EQ(seen[0].first, diagnostic_level::warning);
  EXPECT_NE(seen[0].second.find("cuda_resource on device 0 destroyed with 1 live allocation"), std::string::npos)
      << seen[0].second;
}

TEST(Diagnostics, ReplacingTheSinkReturnsThePreviousOneAndEmptyMeansStderr) {
  diagnostic_sink first = [](diagnostic_level, std::string_view) {};
  const diagnostic_sink before = set_diagnostic_sink(first);
  const diagnostic_sink back = set_diagnostic_sink(before);
  EXPECT_TRUE(static_cast<bool>(back)) << "the sink installed is the one returned";
  EXPECT_FALSE(static_cast<bool>(set_diagnostic_sink(before))) << "the default is returned as empty";
}

TEST(Diagnostics, ASinkThatThrowsDoesNotEscape) {
  const diagnostic_sink previous = set_diagnostic_sink(
      [](diagnostic_level, std::string_view) { throw std::runtime_error("the sink failed"); });
  EXPECT_NO_THROW(diagnose(diagnostic_level::error, "gpumem: written to stderr instead"));
  set_diagnostic_sink(previous);
}

}  // namespace
}  // namespace gpumem::test
