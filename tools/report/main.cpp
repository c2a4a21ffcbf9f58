// gpumem-report: turns a gpumem event log (or a tracking snapshot) into a
// self-contained HTML page with an SVG memory timeline, and optionally a PNG of
// it rendered by headless Chromium. docs/observability.md ("Reports").
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/event_log_reader.hpp"
#include "report/html.hpp"
#include "report/timeline.hpp"

namespace {

const char* usage =
    "usage: gpumem-report LOG [options]\n"
    "  -o, --output FILE   the HTML page (default: LOG with .html)\n"
    "  --by size|site      stack live bytes by size class (default) or by allocation site\n"
    "  --title TEXT        the page's title\n"
    "  --png FILE          also render the page to a PNG with headless Chromium\n"
    "                      (GPUMEM_CHROMIUM, else chromium / chromium-browser / google-chrome on PATH)\n"
    "  --png-size WxH      the PNG's size in pixels (default 1200x900)\n"
    "exit status: 0 written, 1 error (unreadable log, no browser for --png), 2 bad arguments\n";

std::string find_browser() {
  if (const char* env = std::getenv("GPUMEM_CHROMIUM"); env != nullptr && *env != '\0') return env;
  const char* path = std::getenv("PATH");
  if (path == nullptr) return {};
  for (const char* name : {"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}) {
    std::string dirs = path;
    std::size_t start = 0;
    while (start <= dirs.size()) {
      const std::size_t end = dirs.find(':', start);
      const std::string dir = dirs.substr(start, end == std::string::npos ? std::string::npos : end - start);
      const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
      if (end == std::string::npos) break;
      start = end + 1;
    }
  }
  return {};
}

// Renders `html` to `png` in headless Chromium; returns an error message or "".
std::string screenshot(const std::string& html, const std::string& png, int width, int height) {
  const std::string browser = find_browser();
  if (browser.empty()) {
    return "no Chromium found for --png: install one (Debian/Ubuntu: sudo apt-get install chromium; "
           "elsewhere Chrome or Chromium from your package manager) or set GPUMEM_CHROMIUM to its binary; "
           "the HTML page was written and opens in any browser";
  }
  char profile_template[] = "/tmp/gpumem-report-chromium-XXXXXX";
  const char* profile = ::mkdtemp(profile_template);
  if (profile == nullptr) return "cannot create a temporary browser profile";
  const std::string url = "file://" + std::filesystem::absolute(html).string();
  std::vector<std::string> args = {browser,
                                   "--headless",
                                   "--no-sandbox",
                                   "--disable-gpu",
                                   "--hide-scrollbars",
                                   "--no-first-run",
                                   "--disable-extensions",
                                   std::string("--user-data-dir=") + profile,
                                   "--screenshot=" + std::filesystem::absolute(png).string(),
                                   "--window-size=" + std::to_string(width) + "," + std::to_string(height),
                                   url};
  std::filesystem::remove(png);
  const pid_t pid = ::fork();
  if (pid < 0) return "fork failed";
  if (pid == 0) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::FILE* null = std::fopen("/dev/null", "w");
    if (null != nullptr) {
      ::dup2(fileno(null), 1);
      ::dup2(fileno(null), 2);
    }
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      std::filesystem::remove_all(profile);
      return "Chromium did not finish within 120 s";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::error_code ignored;
  std::filesystem::remove_all(profile, ignored);
  if (!std::filesystem::exists(png)) {
    return browser + " wrote no screenshot (exit status " +
           std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + ")";
  }
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  std::string log_path, out_path, png_path;
  gpumem::tools::grouping by = gpumem::tools::grouping::size_class;
  gpumem::tools::page_options page;
  int png_w = 1200, png_h = 900;
  bool title_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "gpumem-report: %s needs a value\n%s", a.c_str(), usage);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "-o" || a == "--output") out_path = value();
    else if (a == "--png") png_path = value();
    else if (a == "--title") {
      page.title = value();
      title_given = true;
    } else if (a == "--by") {
      const std::string b = value();
      if (b == "size") by = gpumem::tools::grouping::size_class;
      else if (b == "site") by = gpumem::tools::grouping::site;
      else {
        std::fprintf(stderr, "gpumem-report: --by takes size or site, not \"%s\"\n", b.c_str());
        return 2;
      }
    } else if (a == "--png-size") {
      const std::string s = value();
      if (std::sscanf(s.c_str(), "%dx%d", &png_w, &png_h) != 2 || png_w < 100 || png_h < 100) {
        std::fprintf(stderr, "gpumem-report: --png-size takes WxH, e.g. 1200x900\n");
        return 2;
      }
    } else if (a == "--help" || a == "-h") {
      std::fputs(usage, stdout);
      return 0;
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "gpumem-report: unknown option %s\n%s", a.c_str(), usage);
      return 2;
    } else if (log_path.empty()) {
      log_path = a;
    } else {
      std::fprintf(stderr, "gpumem-report: one log at a time\n%s", usage);
      return 2;
    }
  }
  if (log_path.empty()) {
    std::fputs(usage, stderr);
    return 2;
  }
  if (out_path.empty()) out_path = std::filesystem::path(log_path).replace_extension(".html").string();
  try {
    const auto events = gpumem::tools::read_event_log(log_path);
    const auto tl = gpumem::tools::build_timeline(events, by);
    page.source_name = std::filesystem::path(log_path).filename().string();
    page.grouping_name = by == gpumem::tools::grouping::site ? "allocation site" : "size class";
    if (!title_given) page.title = "gpumem memory timeline";
    std::ofstream out(out_path, std::ios::binary);
    out << gpumem::tools::render_html(tl, page);
    out.close();
    if (!out) {
      std::fprintf(stderr, "gpumem-report: cannot write %s\n", out_path.c_str());
      return 1;
    }
    std::printf("gpumem-report: %s: %zu events, peak live %s -> %s\n", log_path.c_str(), tl.events,
                gpumem::tools::human_bytes(static_cast<double>(tl.peak_live)).c_str(), out_path.c_str());
    if (!png_path.empty()) {
      const std::string err = screenshot(out_path, png_path, png_w, png_h);
      if (!err.empty()) {
        std::fprintf(stderr, "gpumem-report: %s\n", err.c_str());
        return 1;
      }
      std::printf("gpumem-report: %s\n", png_path.c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpumem-report: %s\n", e.what());
    return 1;
  }
}
