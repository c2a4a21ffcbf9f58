// gpumem-report: turns a gpumem event log (or a tracking snapshot), or several
// logs of several processes, into a self-contained HTML page with SVG memory
// timelines, and optionally a PNG of it rendered by headless Chromium.
// docs/observability.md ("gpumem-report").
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
#include "report/multi_page.hpp"
#include "report/timeline.hpp"

namespace {

const char* usage =
    "usage: gpumem-report LOG... [options]\n"
    "  several LOGs (one per process) are drawn on one page, one chart each\n"
    "  -o, --output FILE   the HTML page (default: LOG with .html; for several logs,\n"
    "                      gpumem-report.html beside the first); --html FILE is the same\n"
    "  --by size|site      stack live bytes by size class (default) or by allocation site\n"
    "  --title TEXT        the page's title\n"
    "  --png FILE          also render the page to a PNG with headless Chromium\n"
    "                      (GPUMEM_CHROMIUM, else chromium / chromium-browser / google-chrome on PATH)\n"
    "  --png-size WxH      the PNG's size in pixels (default 1200x900; for several logs\n"
    "                      1200 wide and as tall as the page)\n"
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

// What the page is drawn with, from the command line.
struct report_request {
  std::vector<std::string> log_paths;
  std::string out_path, png_path;
  gpumem::tools::grouping by = gpumem::tools::grouping::size_class;
  gpumem::tools::page_options page;
  bool title_given = false;
  int png_w = 1200, png_h = 900;
  bool png_size_given = false;
};

// Writes the page; the exit status.
int write_page(const report_request& r, const std::string& html) {
  std::ofstream out(r.out_path, std::ios::binary);
  out << html;
  out.close();
  if (!out) {
    std::fprintf(stderr, "gpumem-report: cannot write %s\n", r.out_path.c_str());
    return 1;
  }
  return 0;
}

// Renders the written page to the PNG, when one was asked for; the exit status.
int write_png(const report_request& r, int png_h) {
  if (r.png_path.empty()) return 0;
  const std::string err = screenshot(r.out_path, r.png_path, r.png_w, png_h);
  if (!err.empty()) {
    std::fprintf(stderr, "gpumem-report: %s\n", err.c_str());
    return 1;
  }
  std::printf("gpumem-report: %s\n", r.png_path.c_str());
  return 0;
}

const char* grouping_name(gpumem::tools::grouping by) {
  return by == gpumem::tools::grouping::site ? "allocation site" : "size class";
}

int report_one_log(report_request r) {
  const std::string& log_path = r.log_paths.front();
  if (r.out_path.empty()) r.out_path = std::filesystem::path(log_path).replace_extension(".html").string();
  const auto events = gpumem::tools::read_event_log(log_path);
  const auto tl = gpumem::tools::build_timeline(events, r.by);
  r.page.source_name = std::filesystem::path(log_path).filename().string();
  r.page.grouping_name = grouping_name(r.by);
  if (!r.title_given) r.page.title = "gpumem memory timeline";
  if (const int status = write_page(r, gpumem::tools::render_html(tl, r.page)); status != 0) return status;
  std::printf("gpumem-report: %s: %zu events, peak live %s -> %s\n", log_path.c_str(), tl.events,
              gpumem::tools::human_bytes(static_cast<double>(tl.peak_live)).c_str(), r.out_path.c_str());
  return write_png(r, r.png_h);
}

// Every log is read before anything is written, and every bad one is named.
int report_several_logs(report_request r) {
  if (r.out_path.empty()) {
    r.out_path = (std::filesystem::path(r.log_paths.front()).parent_path() / "gpumem-report.html").string();
  }
  const std::vector<std::string> names = gpumem::tools::log_display_names(r.log_paths);
  std::vector<gpumem::tools::named_timeline> logs;
  bool all_read = true;
  for (std::size_t i = 0; i < r.log_paths.size(); ++i) {
    try {
      const auto events = gpumem::tools::read_event_log(r.log_paths[i]);
      logs.push_back({names[i], gpumem::tools::build_timeline(events, r.by)});
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gpumem-report: %s\n", e.what());
      all_read = false;
    }
  }
  if (!all_read) {
    std::fprintf(stderr, "gpumem-report: nothing written: every log must be readable\n");
    return 1;
  }
  r.page.grouping_name = grouping_name(r.by);
  if (!r.title_given) r.page.title = "gpumem memory timelines";
  const int png_h = r.png_size_given ? r.png_h : gpumem::tools::multi_log_page_height(logs);
  if (const int status = write_page(r, gpumem::tools::render_multi_log_html(logs, r.page)); status != 0) {
    return status;
  }
  for (std::size_t i = 0; i < logs.size(); ++i) {
    std::printf("gpumem-report: %s: %zu events, peak live %s\n", r.log_paths[i].c_str(), logs[i].tl.events,
                gpumem::tools::human_bytes(static_cast<double>(logs[i].tl.peak_live)).c_str());
  }
  std::printf("gpumem-report: %zu logs -> %s\n", logs.size(), r.out_path.c_str());
  return write_png(r, png_h);
}

}  // namespace

int main(int argc, char** argv) {
  report_request r;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "gpumem-report: %s needs a value\n%s", a.c_str(), usage);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "-o" || a == "--output" || a == "--html") r.out_path = value();
    else if (a == "--png") r.png_path = value();
    else if (a == "--title") {
      r.page.title = value();
      r.title_given = true;
    } else if (a == "--by") {
      const std::string b = value();
      if (b == "size") r.by = gpumem::tools::grouping::size_class;
      else if (b == "site") r.by = gpumem::tools::grouping::site;
      else {
        std::fprintf(stderr, "gpumem-report: --by takes size or site, not \"%s\"\n", b.c_str());
        return 2;
      }
    } else if (a == "--png-size") {
      const std::string s = value();
      if (std::sscanf(s.c_str(), "%dx%d", &r.png_w, &r.png_h) != 2 || r.png_w < 100 || r.png_h < 100) {
        std::fprintf(stderr, "gpumem-report: --png-size takes WxH, e.g. 1200x900\n");
        return 2;
      }
      r.png_size_given = true;
    } else if (a == "--help" || a == "-h") {
      std::fputs(usage, stdout);
      return 0;
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "gpumem-report: unknown option %s\n%s", a.c_str(), usage);
      return 2;
    } else {
      r.log_paths.push_back(a);
    }
  }
  if (r.log_paths.empty()) {
    std::fputs(usage, stderr);
    return 2;
  }
  try {
    return r.log_paths.size() == 1 ? report_one_log(r) : report_several_logs(r);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpumem-report: %s\n", e.what());
    return 1;
  }
}
