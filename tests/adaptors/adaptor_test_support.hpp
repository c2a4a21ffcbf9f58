// Helpers for the adaptor tests: a scriptable upstream, a CSV reader for logs,
// a scoped environment variable, and temporary file paths.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <unistd.h>
#include <unordered_map>
#include <vector>

#include "adaptors/log_format.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/error.hpp"
#include "gpumem/memory_resource.hpp"

namespace gpumem::test {

// Device memory from a cuda_resource, with faults on demand, call counts, and a
// detector of concurrent calls (it claims not to be thread-safe).
class scripted_resource final : public memory_resource {
 public:
  explicit scripted_resource(int device = 0) : real_(device) {}

  std::atomic<int> allocations{0};
  std::atomic<int> deallocations{0};
  std::atomic<int> fail_deallocation_number{0};  // the nth deallocate (1-based) throws cuda_error
  std::atomic<bool> allocations_throw_cuda_error{false};
  std::atomic<int> overlapping_calls{0};         // calls that found another call in progress
  std::chrono::microseconds dwell{0};            // time spent inside each call

  std::size_t live_bytes() const { return real_.allocated_bytes(); }
  std::size_t live_count() const { return real_.allocation_count(); }
  cuda_resource& real() { return real_; }

  resource_properties properties() const noexcept override {
    resource_properties p = real_.properties();
    p.thread_safe = false;
    return p;
  }

 private:
  struct inside_guard {
    explicit inside_guard(scripted_resource& r) : r_(r) {
      if (r_.inside_.fetch_add(1) != 0) ++r_.overlapping_calls;
      if (r_.dwell.count() > 0) std::this_thread::sleep_for(r_.dwell);
    }
    ~inside_guard() { r_.inside_.fetch_sub(1); }
    scripted_resource& r_;
  };

  void* do_allocate(std::size_t bytes, stream_view s, std::size_t alignment) override {
    inside_guard g(*this);
    ++allocations;
    if (allocations_throw_cuda_error) throw cuda_error(CUDA_ERROR_UNKNOWN, "scripted_resource", "injected");
    return real_.allocate(bytes, s, alignment);
  }
  void do_deallocate(void* p, std::size_t bytes, stream_view s, std::size_t alignment) override {
    inside_guard g(*this);
    const int n = ++deallocations;
    if (n == fail_deallocation_number.load()) {
      throw cuda_error(CUDA_ERROR_ILLEGAL_ADDRESS, "scripted_resource", "injected deallocation failure");
    }
    real_.deallocate(p, bytes, s, alignment);
  }

  cuda_resource real_;
  std::atomic<int> inside_{0};
};

// One CSV row as a map from the header's column names.
using csv_row = std::map<std::string, std::string>;

inline std::vector<std::string> split_csv_line(const std::string& line) {
  return detail::split_log_fields(line);
}

struct csv_file {
  std::vector<std::string> header;
  std::vector<csv_row> rows;
};

inline csv_file read_csv(const std::string& path) {
  csv_file f;
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line)) return f;
  f.header = split_csv_line(line);
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto fields = split_csv_line(line);
    csv_row r;
    for (std::size_t i = 0; i < f.header.size() && i < fields.size(); ++i) r[f.header[i]] = fields[i];
    f.rows.push_back(std::move(r));
  }
  return f;
}

// Sets an environment variable for a scope and restores what was there.
class scoped_env {
 public:
  scoped_env(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~scoped_env() {
    if (old_) ::setenv(name_.c_str(), old_->c_str(), 1);
    else ::unsetenv(name_.c_str());
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// A file name under the temporary directory, unique in this process, removed at scope end.
class temp_path {
 public:
  explicit temp_path(const std::string& stem) {
    static std::atomic<int> n{0};
    const char* dir = std::getenv("TMPDIR");
    path_ = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/gpumem-test-" +
            std::to_string(::getpid()) + "-" + std::to_string(n++) + "-" + stem;
  }
  ~temp_path() { std::remove(path_.c_str()); }
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

inline std::uint64_t to_u64(const std::string& s) { return std::stoull(s, nullptr, 0); }

}  // namespace gpumem::test
