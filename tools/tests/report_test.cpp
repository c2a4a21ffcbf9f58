// gpumem-report: the timeline from a log, the page's SVG, and the page rendered
// in headless Chromium to a PNG whose pixels show the chart; several logs on one
// page.
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
#include "report/multi_page.hpp"
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

// ---- several logs on one page ----

// The text between `from` and the next `to` at or after `at`; "" when absent.
std::string between(const std::string& text, const std::string& from, const std::string& to, std::size_t at = 0) {
  const auto begin = text.find(from, at);
  if (begin == std::string::npos) return {};
  const auto end = text.find(to, begin + from.size());
  return end == std::string::npos ? std::string() : text.substr(begin, end - begin);
}

std::string html_of(std::string text) {
  for (std::size_t at = 0; (at = text.find('<', at)) != std::string::npos;) text.replace(at, 1, "&lt;");
  return text;
}

TEST(ReportSeveralLogs, ChartsShareScalesColoursAndOneLegend) {
  // Two processes: the first allocates small and medium blocks over 9 us, the
  // second only medium ones, for longer, with its pool's chunks and a refusal.
  std::vector<logged_event> first = {
      ev(1, true, 0x1000, 100), ev(2, true, 0x2000, 2 * MiB), ev(3, false, 0x1000, 100),
      ev(4, false, 0x2000, 2 * MiB)};
  std::vector<logged_event> second = {
      ev(1, true, 0x9000000, 64 * MiB, "upstream"), ev(2, true, 0x9000000, 3 * MiB),
      ev(3, true, 0, 900 * MiB, "app", "oom"), ev(4, false, 0x9000000, 3 * MiB)};
  for (auto& e : second) e.time_ns *= 5;  // ends at 20 us
  const std::vector<tools::named_timeline> logs = {
      {"gpumem-0-101.csv", build_timeline(first, grouping::size_class)},
      {"gpumem-1-102.csv", build_timeline(second, grouping::size_class)}};
  const std::string page = tools::render_multi_log_html(logs, tools::page_options{"two workers", "", "size class"});

  EXPECT_EQ(page.rfind("<!DOCTYPE html>", 0), 0U);
  EXPECT_EQ(page.find("<script"), std::string::npos);
  EXPECT_EQ(count_of(page, "<svg"), 2U) << "one chart per log";
  // The legend names each log by its file name: on its chart and in the table.
  EXPECT_EQ(count_of(page, "class=\"log-name\" "), 2U);
  for (const auto& log : logs) {
    EXPECT_EQ(count_of(page, "data-log=\"" + log.name + "\""), 1U) << log.name;
    EXPECT_NE(page.find("font-weight=\"bold\">" + log.name + "</text>"), std::string::npos) << log.name;
    EXPECT_NE(page.find("<tr class=\"log\"><td>" + log.name + "</td>"), std::string::npos) << log.name;
  }
  // No log holds a wall-clock time: the caption says each chart starts at its own
  // log's opening, and nothing adds the processes' curves up.
  EXPECT_NE(page.find("no wall-clock time"), std::string::npos);
  EXPECT_NE(page.find("each chart starts at its own log's opening"), std::string::npos);
  EXPECT_NE(page.find("time since each log was opened"), std::string::npos);
  EXPECT_NE(page.find("sum of the peaks " + tools::human_bytes(static_cast<double>(2 * MiB + 100 + 3 * MiB))),
            std::string::npos);
  // One time axis and one byte scale: both charts' axes are the same, from 0 to
  // the longer log's end (20 us), up to the higher peak (the 64 MiB chunk).
  const auto second_svg = page.find("<svg", page.find("<svg") + 1);
  const std::string x1 = between(page, "<g class=\"axis x-axis\">", "</g>");
  const std::string y1 = between(page, "<g class=\"axis y-axis\">", "</g>");
  EXPECT_FALSE(x1.empty());
  EXPECT_EQ(x1, between(page, "<g class=\"axis x-axis\">", "</g>", second_svg));
  EXPECT_EQ(y1, between(page, "<g class=\"axis y-axis\">", "</g>", second_svg));
  EXPECT_NE(x1.find(">20 us</text>"), std::string::npos) << x1;
  EXPECT_NE(y1.find(">64 MiB</text>"), std::string::npos) << y1;
  EXPECT_EQ(count_of(page, "class=\"reserved\""), 1U);
  EXPECT_EQ(count_of(page, "class=\"oom-marker\""), 1U);
  // A size class has one colour on every chart: "1 MiB - 16 MiB" is the second
  // of the page's groups, though the second log's first.
  const auto& palette = tools::group_palette();
  EXPECT_EQ(count_of(page, "data-group=\"1 MiB - 16 MiB\" fill=\"" + palette[1] + "\""), 2U);
  EXPECT_EQ(count_of(page, "data-group=\"" + html_of("< 4 KiB") + "\" fill=\"" + palette[0] + "\""), 1U);
  const std::string legend = between(page, "<ul class=\"legend\">", "</ul>");
  EXPECT_EQ(count_of(legend, "<li>"), 4U) << "two size classes, reserved, out of memory, once for the page";
}

TEST(ReportSeveralLogs, NamesEachLogByItsFileNameUnlessTwoShareOne) {
  EXPECT_EQ(tools::log_display_names({"logs/gpumem-0-7.csv", "gpumem-1-8.csv"}),
            (std::vector<std::string>{"gpumem-0-7.csv", "gpumem-1-8.csv"}));
  EXPECT_EQ(tools::log_display_names({"a/run.csv", "b/run.csv", "c.csv"}),
            (std::vector<std::string>{"a/run.csv", "b/run.csv", "c.csv"}));
}

TEST(ReportSeveralLogs, TwoRecordedLogsOnOnePage) {
  temp_file first("gpumem-worker0-101.csv");
  temp_file second("gpumem-worker1-102.csv");
  temp_file html("workers.html");
  record_log(first.str());
  const drawn d = record_log(second.str());
  const command_result r =
      run_command(tool_path(GPUMEM_REPORT_EXE) + " " + first.str() + " " + second.str() + " --html " + html.str());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("2 logs -> " + html.str()), std::string::npos) << r.output;
  const std::string page = slurp(html.str());
  EXPECT_EQ(count_of(page, "<svg"), 2U);
  EXPECT_EQ(page.find("src="), std::string::npos) << "nothing loaded from elsewhere";
  for (const auto& log : {first.str(), second.str()}) {
    const std::string name = std::filesystem::path(log).filename().string();
    EXPECT_EQ(count_of(page, "data-log=\"" + name + "\""), 1U) << name;
  }
  EXPECT_EQ(count_of(page, "class=\"reserved\""), 2U) << "each worker's pool";
  EXPECT_GE(count_of(page, "class=\"oom-marker\""), 2 * std::min<std::size_t>(d.ooms, 1));
  // One log still gives today's page: one chart, no log names on it.
  const command_result one = run_command(tool_path(GPUMEM_REPORT_EXE) + " " + first.str() + " -o " + html.str());
  ASSERT_EQ(one.status, 0) << one.output;
  const std::string single = slurp(html.str());
  EXPECT_EQ(count_of(single, "<svg"), 1U);
  EXPECT_EQ(single.find("data-log="), std::string::npos);
  EXPECT_NE(single.find("time since the log began"), std::string::npos);
}

TEST(ReportSeveralLogs, AMalformedOrMissingLogIsNamedAndNothingIsWritten) {
  temp_file good("good.csv");
  temp_file bad("bad.csv");
  temp_file html("bad-logs.html");
  record_log(good.str());
  {
    std::ofstream out(bad.str());
    out << "seq,time_ns,thread,device,stream,source,op,ptr,bytes,alignment,outcome,site\n"
           "1,10,1,0,0x0,app,allocate,0x1000,4096,256,ok,\n"
           "2,20,1,0,0x0,app,allocate,0x2000\n";
  }
  const command_result r =
      run_command(tool_path(GPUMEM_REPORT_EXE) + " " + good.str() + " " + bad.str() + " -o " + html.str());
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find(bad.str() + ":3: "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(good.str() + ":"), std::string::npos) << "the good log is not blamed: " << r.output;
  EXPECT_FALSE(std::filesystem::exists(html.str())) << "no page from part of the logs";
  const command_result missing = run_command(tool_path(GPUMEM_REPORT_EXE) + " " + good.str() +
                                             " /nonexistent/gpumem-9-9.csv -o " + html.str());
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.output.find("/nonexistent/gpumem-9-9.csv: cannot open"), std::string::npos) << missing.output;
  EXPECT_EQ(run_command(tool_path(GPUMEM_REPORT_EXE) + " " + good.str() + " " + bad.str() + " --by colour").status, 2);
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

TEST(ReportSeveralLogs, RendersEveryChartInOnePng) {
  if (!chromium_available()) GTEST_SKIP() << "SKIPPED: no Chromium here (RendersInHeadlessChromium says more)";
  temp_file first("png-worker0.csv");
  temp_file second("png-worker1.csv");
  temp_file html("several.html");
  temp_file png("several.png");
  record_log(first.str());
  record_log(second.str());
  const command_result r = run_command(tool_path(GPUMEM_REPORT_EXE) + " " + first.str() + " " + second.str() +
                                       " -o " + html.str() + " --png " + png.str());
  ASSERT_EQ(r.status, 0) << r.output;
  const png_image img = read_png(slurp(png.str()));
  EXPECT_EQ(img.width, 1200U);
  EXPECT_GT(img.height, 900U) << "as tall as the page, both charts and the table";
#ifdef GPUMEM_TEST_HAVE_ZLIB
  ASSERT_EQ(img.rgb.size(), std::size_t{img.width} * img.height * 3) << "the screenshot did not decode";
  // The 1 MiB - 16 MiB class (the page's third group) fills part of each chart:
  // the upper chart sits in the first 500 rows, the lower one below them.
  const auto split = img.rgb.begin() + static_cast<std::ptrdiff_t>(std::size_t{500} * img.width * 3);
  const png_image upper{img.width, 500, {img.rgb.begin(), split}};
  const png_image lower{img.width, img.height - 500, {split, img.rgb.end()}};
  // How much of a chart the class fills depends on the recorded timestamps, which a
  // loaded or instrumented build (TSan) spreads differently: 19,726 pixels once, under
  // 20,000. A chart that was not drawn has none; 5,000 tells the two apart.
  const std::string colour = tools::group_palette()[2];
  EXPECT_GT(pixels_of(upper, colour), 5000U) << "the first chart";
  EXPECT_GT(pixels_of(lower, colour), 5000U) << "the second chart";
#endif
}

}  // namespace
}  // namespace gpumem::test
