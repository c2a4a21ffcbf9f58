// Helpers for the tools' tests: temporary files, running a tool, recording a log.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace gpumem::test {

class temp_file {
 public:
  explicit temp_file(const std::string& stem) {
    static std::atomic<int> n{0};
    const char* dir = std::getenv("TMPDIR");
    path_ = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/gpumem-tools-test-" +
            std::to_string(::getpid()) + "-" + std::to_string(n++) + "-" + stem;
  }
  ~temp_file() { std::remove(path_.c_str()); }
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

// A tool's path: where the build put it, else beside this test binary (a build
// tree copied to another machine, where the build path does not exist).
inline std::string tool_path(const std::string& built_at) {
  if (::access(built_at.c_str(), X_OK) == 0) return built_at;
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return built_at;
  std::string dir(self, static_cast<std::size_t>(n));
  dir.erase(dir.rfind('/'));
  return dir + built_at.substr(built_at.rfind('/'));
}

struct command_result {
  int status = -1;  // exit status
  std::string output;  // stdout and stderr
};

// Runs a shell command line and collects what it prints.
inline command_result run_command(const std::string& command) {
  command_result r;
  std::FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = ::pclose(p);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::size_t count_of(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

}  // namespace gpumem::test
