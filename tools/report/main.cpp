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

#include "cli/command_line.hpp"
#include "common/event_log_reader.hpp"
#include "report/html.hpp"
#include "report/multi_page.hpp"
#include "report/timeline.hpp"

namespace {

constexpr const char* description =
    "Turns a gpumem event log (or a tracking snapshot), or several logs of several\n"
    "processes, into one self-contained HTML page of memory timelines, one chart a log,\n"
    "and optionally a PNG of it rendered by headless Chromium (docs/observability.md,\n"
    "\"gpumem-report\").";
constexpr const char* epilog =
    "environment: GPUMEM_CHROMIUM names the browser for --png; unset, chromium,\n"
    "chromium-browser, google-chrome or google-chrome-stable on PATH.\n"
    "exit status: 0 written, 1 error (unreadable log, no browser for --png), 2 bad arguments";

// --png-size's bounds, for the width and the height alike: below 100 pixels nothing
// is legible; the ceiling only turns away typing mistakes (a page of many logs is
// tall, multi_log_page_height).
constexpr long long min_png_pixels = 100, max_png_pixels = 100000;

// Splits "WxH" at its 'x'; false unless both halves are whole numbers from
// min_png_pixels to max_png_pixels.
bool parse_png_size(const std::string& text, int& width, int& height) {
  const std::size_t x = text.find('x');
  if (x == std::string::npos) return false;
  const CLI::Validator pixels = gpumem::tools::whole_number(min_png_pixels, max_png_pixels);
  std::string w = text.substr(0, x), h = text.substr(x + 1);
  if (!pixels(w).empty() || !pixels(h).empty()) return false;
  width = std::stoi(w);
  height = std::stoi(h);
  return true;
}

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
  std::string by = "size", png_size;
  CLI::App app(description, "gpumem-report");
  gpumem::tools::apply_conventions(app, epilog);
  app.get_formatter()->column_width(28);  // room for "-o,--output,--html FILE"
  app.add_option("LOG", r.log_paths,
                 "the event logs (CSV), one per process; several are\ndrawn on one page, one chart each")
      ->type_name("FILE")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->required();
  app.add_option("-o,--output,--html", r.out_path,
                 "the HTML page (default: LOG with .html; for several\nlogs, gpumem-report.html beside the first)")
      ->type_name("FILE");
  app.add_option("--by", by, "stack live bytes by size class (default) or by\nallocation site")
      ->type_name("size|site")
      ->check(CLI::Validator(
          [](std::string& b) -> std::string {
            return b == "size" || b == "site" ? "" : "takes size or site, not \"" + b + "\"";
          },
          "", "size or site"));
  CLI::Option* title = app.add_option("--title", r.page.title,
                                      "the page's title (default: gpumem memory timeline,\nor timelines for several logs)")
                           ->type_name("TEXT");
  app.add_option("--png", r.png_path, "also render the page to a PNG with headless Chromium")->type_name("FILE");
  CLI::Option* size =
      app.add_option("--png-size", png_size,
                     "the PNG's size in pixels, each from " + std::to_string(min_png_pixels) + " to " +
                         std::to_string(max_png_pixels) +
                         "\n(default 1200x900; for several logs 1200 wide and\nas tall as the page)")
          ->type_name("WxH")
          ->check(CLI::Validator(
              [](std::string& s) -> std::string {
                int w = 0, h = 0;
                if (parse_png_size(s, w, h)) return {};
                return "wants WxH, two whole numbers from " + std::to_string(min_png_pixels) + " to " +
                       std::to_string(max_png_pixels) + " (e.g. 1200x900), not '" + s + "'";
              },
              "", "WxH"));
  if (const auto stop = gpumem::tools::parse_command_line(app, argc, argv)) return *stop;
  r.by = by == "site" ? gpumem::tools::grouping::site : gpumem::tools::grouping::size_class;
  r.title_given = title->count() > 0;
  r.png_size_given = size->count() > 0;
  if (r.png_size_given) parse_png_size(png_size, r.png_w, r.png_h);
  try {
    return r.log_paths.size() == 1 ? report_one_log(r) : report_several_logs(r);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpumem-report: %s\n", e.what());
    return 1;
  }
}
