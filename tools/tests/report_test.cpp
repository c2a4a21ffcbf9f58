// gpumem-report: the timeline from a log, the page's SVG, and the page rendered
// in headless Chromium to a PNG whose pixels show the chart.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <thread>
#include <vector>
#ifdef GPUMEM_TEST_HAVE_ZLIB
#include <zlib.h>
#endif

#include "common/event_log_reader.hpp"
#include "gpumem/config.hpp"
#include "gpumem/error.hpp"
#include "report/html.hpp"
#include "report/timeline.hpp"
#include "tools_test_support.hpp"

namespace gpumem::test {
namespace {

using tools::build_timeline;
using tools::grouping;
using tools::logged_event;

constexpr std::size_t KiB = 1024, MiB = KiB * 1024;

logged_event ev(std::uint64_t seq, bool allocate, std::uint64_t ptr, std::uint64_t bytes,
                std::string source = "app", std::string outcome = "ok", std::string site = "") {
  logged_event e;
  e.seq = seq;
  e.time_ns = seq * 1000;
  e.allocate = allocate;
  e.ptr = ptr;
  e.bytes = bytes;
  e.source = std::move(source);
  e.outcome = std::move(outcome);
  e.site = std::move(site);
  return e;
}

TEST(ReportTimeline, GroupsPeaksReservedAndOutOfMemory) {
  std::vector<logged_event> log = {
      ev(1, true, 0x1000000, 8 * MiB, "upstream"),
      ev(2, true, 0x1000000, 100, "app", "ok", "f"),
      ev(3, true, 0x1000100, 2 * MiB, "app", "ok", "g"),
      ev(4, true, 0, 64 * MiB, "app", "oom", "g"),
      ev(5, false, 0x1000000, 100),
      ev(6, true, 0x1000000, 300 * MiB, "app", "ok", "h"),
      ev(7, false, 0x1000000, 300 * MiB),
      ev(8, false, 0x1000100, 2 * MiB),
      ev(9, false, 0x1000000, 8 * MiB, "upstream"),
  };
  const auto tl = build_timeline(log, grouping::size_class);
  EXPECT_EQ(tl.groups, (std::vector<std::string>{"< 4 KiB", "1 MiB - 16 MiB", ">= 256 MiB"}));
  EXPECT_EQ(tl.peak_live, 302 * MiB);
  EXPECT_EQ(tl.peak_live_t, 6000U);
  EXPECT_EQ(tl.live_at_peak, (std::vector<std::uint64_t>{0, 2 * MiB, 300 * MiB}));
  EXPECT_EQ(tl.peak_reserved, 8 * MiB);
  ASSERT_EQ(tl.ooms.size(), 1U);
  EXPECT_EQ(tl.ooms[0].bytes, 64 * MiB);
  EXPECT_EQ(tl.allocations, 3U);
  EXPECT_EQ(tl.frees, 3U);
  EXPECT_EQ(tl.failed_calls, 1U);
  EXPECT_EQ(tl.points.back().live, (std::vector<std::uint64_t>{0, 0, 0}));
  const auto by_site = build_timeline(log, grouping::site);
  EXPECT_EQ(by_site.groups, (std::vector<std::string>{"h", "g", "f"})) << "most bytes first";
}

TEST(ReportTimeline, SamplingKeepsThePeak) {
  std::vector<logged_event> log;
  std::uint64_t seq = 1;
  for (int i = 0; i < 50000; ++i) {
    const std::uint64_t n = (i == 31337) ? 900 * MiB : 1 * MiB;
    log.push_back(ev(seq++, true, 0x1000, n));
    log.push_back(ev(seq++, false, 0x1000, n));
  }
  const auto tl = build_timeline(log, grouping::size_class, 400);
  EXPECT_LE(tl.points.size(), 1000U);
  std::uint64_t highest = 0;
  for (const auto& p : tl.points) {
    std::uint64_t total = 0;
    for (auto v : p.live) total += v;
    highest = std::max(highest, total);
  }
  EXPECT_EQ(highest, 900 * MiB) << "the one spike survives the sampling";
}

// What the tests draw: a real log from GPUMEM_CONF's stack, on two threads, with a
// limit that some requests pass (out-of-memory markers).
struct drawn {
  std::size_t ooms = 0;
  std::set<std::string> size_groups;
};

drawn record_log(const std::string& path) {
  drawn d;
  auto mr = make_resource_from_config("pool,limit=96MiB,sites,log=" + path, 0);
  std::atomic<std::size_t> ooms{0};
  auto work = [&](int id) {
    stream s(0);
    std::vector<std::pair<void*, std::size_t>> held;
    for (int step = 0; step < 30; ++step) {
      for (int k = 0; k < 6; ++k) {
        const std::size_t n = (id == 0 ? 3 * MiB : 600 * KiB) * static_cast<std::size_t>(1 + k) +
                              (step % 10 == 9 && k == 5 ? 80 * MiB : 0);
        try {
          held.emplace_back(mr->allocate(n, s), n);
        } catch (const out_of_memory&) {
          ++ooms;
        }
        void* tiny = mr->allocate(2 * KiB, s);
        mr->deallocate(tiny, 2 * KiB, s);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      while (!held.empty()) {
        mr->deallocate(held.back().first, held.back().second, s);
        held.pop_back();
      }
    }
    s.synchronize();
  };
  std::thread a(work, 0), b(work, 1);
  a.join();
  b.join();
  mr.reset();
  d.ooms = ooms;
  d.size_groups = {"< 4 KiB", "64 KiB - 1 MiB", "1 MiB - 16 MiB", "16 MiB - 256 MiB"};
  return d;
}

TEST(Report, ThePageIsSelfContainedAndDrawsTheLog) {
  temp_file log("report.csv");
  temp_file html("report.html");
  const drawn d = record_log(log.str());
  ASSERT_GT(d.ooms, 0U);
  const command_result r = run_command(tool_path(GPUMEM_REPORT_EXE) + " " + log.str() + " -o " + html.str());
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string page = slurp(html.str());
  EXPECT_EQ(page.rfind("<!DOCTYPE html>", 0), 0U);
  EXPECT_EQ(page.find("<script"), std::string::npos) << "no script";
  EXPECT_EQ(page.find("src="), std::string::npos) << "nothing loaded from elsewhere";
  EXPECT_EQ(page.find("href="), std::string::npos);
  EXPECT_EQ(count_of(page, "<svg"), 1U);
  EXPECT_EQ(count_of(page, "class=\"area\""), d.size_groups.size());
  for (std::string g : d.size_groups) {
    if (g[0] == '<') g.replace(0, 1, "&lt;");
    EXPECT_NE(page.find("data-group=\"" + g + "\""), std::string::npos) << g;
  }
  EXPECT_EQ(count_of(page, "class=\"reserved\""), 1U) << "the pool's reserved bytes";
  EXPECT_EQ(count_of(page, "class=\"oom-marker\""), d.ooms);
  EXPECT_EQ(count_of(page, "class=\"peak\""), 1U);
  EXPECT_NE(page.find("out of memory: "), std::string::npos);
  // By site: the sites were logged.
  const command_result s = run_command(tool_path(GPUMEM_REPORT_EXE) + " " + log.str() + " --by site -o " + html.str());
  ASSERT_EQ(s.status, 0) << s.output;
  const std::string by_site = slurp(html.str());
  EXPECT_GE(count_of(by_site, "class=\"area\""), 1U);
  EXPECT_EQ(by_site.find("(no site recorded)"), std::string::npos);
}

TEST(Report, BadArgumentsAndLogs) {
  EXPECT_EQ(run_command(tool_path(GPUMEM_REPORT_EXE)).status, 2);
  EXPECT_EQ(run_command(tool_path(GPUMEM_REPORT_EXE) + " x.csv --by colour").status, 2);
  EXPECT_EQ(run_command(tool_path(GPUMEM_REPORT_EXE) + " /nonexistent/x.csv").status, 1);
  temp_file log("no-browser.csv");
  record_log(log.str());
  temp_file html("no-browser.html");
  const command_result r = run_command("GPUMEM_CHROMIUM=/nonexistent/chromium " + tool_path(GPUMEM_REPORT_EXE) +
                                       " " + log.str() + " -o " + html.str() + " --png " + html.str() + ".png");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("wrote no screenshot"), std::string::npos) << r.output;
  // No browser at all: it says how to get one, and the HTML page is there anyway.
  temp_file html2("no-browser-2.html");
  const command_result none = run_command("env -u GPUMEM_CHROMIUM PATH=/nonexistent " + tool_path(GPUMEM_REPORT_EXE) +
                                          " " + log.str() + " -o " + html2.str() + " --png " + html2.str() + ".png");
  EXPECT_EQ(none.status, 1);
  EXPECT_NE(none.output.find("apt-get install chromium"), std::string::npos) << none.output;
  EXPECT_TRUE(std::filesystem::exists(html2.str())) << "the HTML page is written before the screenshot";
}

// ---- the screenshot ----

bool chromium_available() {
  if (const char* env = std::getenv("GPUMEM_CHROMIUM"); env != nullptr && *env != '\0') return true;
  return run_command("command -v chromium || command -v chromium-browser || command -v google-chrome").status == 0;
}

struct png_image {
  std::uint32_t width = 0, height = 0;
  std::vector<std::uint8_t> rgb;  // decoded pixels, 3 bytes each (empty without zlib)
};

std::uint32_t be32(const std::string& s, std::size_t at) {
  return (std::uint32_t(std::uint8_t(s[at])) << 24) | (std::uint32_t(std::uint8_t(s[at + 1])) << 16) |
         (std::uint32_t(std::uint8_t(s[at + 2])) << 8) | std::uint32_t(std::uint8_t(s[at + 3]));
}

png_image read_png(const std::string& bytes) {
  png_image img;
  if (bytes.size() < 33 || bytes.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0) return img;
  img.width = be32(bytes, 16);
  img.height = be32(bytes, 20);
#ifdef GPUMEM_TEST_HAVE_ZLIB
  const int depth = std::uint8_t(bytes[24]), colour = std::uint8_t(bytes[25]), interlace = std::uint8_t(bytes[28]);
  if (depth != 8 || (colour != 2 && colour != 6) || interlace != 0) return img;
  const std::size_t bpp = colour == 6 ? 4 : 3;
  std::string idat;
  for (std::size_t at = 8; at + 8 <= bytes.size();) {
    const std::uint32_t len = be32(bytes, at);
    const std::string type = bytes.substr(at + 4, 4);
    if (type == "IDAT") idat += bytes.substr(at + 8, len);
    at += 12 + len;
  }
  const std::size_t stride = img.width * bpp;
  std::vector<std::uint8_t> raw(img.height * (stride + 1));
  uLongf size = raw.size();
  if (uncompress(raw.data(), &size, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) != Z_OK) return img;
  std::vector<std::uint8_t> prev(stride, 0), cur(stride);
  img.rgb.reserve(std::size_t{img.width} * img.height * 3);
  for (std::uint32_t y = 0; y < img.height; ++y) {
    const std::uint8_t filter = raw[y * (stride + 1)];
    const std::uint8_t* in = &raw[y * (stride + 1) + 1];
    for (std::size_t x = 0; x < stride; ++x) {
      const int a = x >= bpp ? cur[x - bpp] : 0, b = prev[x], c = x >= bpp ? prev[x - bpp] : 0;
      int pred = 0;
      switch (filter) {
        case 1: pred = a; break;
        case 2: pred = b; break;
        case 3: pred = (a + b) / 2; break;
        case 4: {
          const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
          pred = (pa <= pb && pa <= pc) ? a : (pb <= pc ? b : c);
          break;
        }
        default: pred = 0;
      }
      cur[x] = static_cast<std::uint8_t>(in[x] + pred);
    }
    for (std::uint32_t x = 0; x < img.width; ++x) {
      img.rgb.insert(img.rgb.end(), cur.begin() + x * bpp, cur.begin() + x * bpp + 3);
    }
    prev = cur;
  }
#endif
  return img;
}

std::size_t pixels_of(const png_image& img, const std::string& hex) {
  const auto v = std::stoul(hex.substr(1), nullptr, 16);
  const int r = static_cast<int>((v >> 16) & 0xFF), g = static_cast<int>((v >> 8) & 0xFF), b = static_cast<int>(v & 0xFF);
  std::size_t n = 0;
  for (std::size_t i = 0; i + 2 < img.rgb.size(); i += 3) {
    if (std::abs(img.rgb[i] - r) <= 3 && std::abs(img.rgb[i + 1] - g) <= 3 && std::abs(img.rgb[i + 2] - b) <= 3) ++n;
  }
  return n;
}

TEST(Report, RendersInHeadlessChromium) {
  if (!chromium_available()) {
    const char* ci = std::getenv("CI");
    if (ci != nullptr && *ci != '\0') {
      FAIL() << "CI must render the report page, but no Chromium is installed (scripts/bootstrap installs "
                "Debian's chromium)";
    }
    GTEST_SKIP() << "SKIPPED: no Chromium here (install Debian's chromium, or set GPUMEM_CHROMIUM); "
                    "the report page was not rendered";
  }
  temp_file log("screenshot.csv");
  temp_file html("screenshot.html");
  temp_file png("screenshot.png");
  const drawn d = record_log(log.str());
  const command_result r = run_command(tool_path(GPUMEM_REPORT_EXE) + " " + log.str() + " -o " + html.str() +
                                       " --png " + png.str() + " --png-size 1200x900");
  ASSERT_EQ(r.status, 0) << r.output;
  ASSERT_TRUE(std::filesystem::exists(png.str())) << r.output;
  const std::string bytes = slurp(png.str());
  EXPECT_GT(bytes.size(), 20U * 1024) << "a blank page compresses to a few KiB; a chart does not";
  const png_image img = read_png(bytes);
  EXPECT_EQ(img.width, 1200U);
  EXPECT_EQ(img.height, 900U);
#ifdef GPUMEM_TEST_HAVE_ZLIB
  ASSERT_EQ(img.rgb.size(), std::size_t{1200} * 900 * 3) << "the screenshot did not decode";
  // Every group's colour covers part of the chart (the big groups a lot of it),
  // and the out-of-memory markers are drawn.
  const auto& palette = tools::group_palette();
  const std::vector<std::string> groups(d.size_groups.begin(), d.size_groups.end());
  std::size_t coloured = 0;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::size_t n = pixels_of(img, palette[g]);
    EXPECT_GT(n, 40U) << "group " << g << " (" << palette[g] << ") is not visible";
    coloured += n;
  }
  EXPECT_GT(coloured, 20000U) << "the stacked areas cover a good part of the plot";
  EXPECT_GT(pixels_of(img, "#d62728"), 100U) << "out-of-memory markers";
  EXPECT_GT(pixels_of(img, "#222222"), 300U) << "the reserved line";
#else
  std::printf("(built without zlib: the screenshot's pixels were not checked, only its size)\n");
#endif
}

}  // namespace
}  // namespace gpumem::test
