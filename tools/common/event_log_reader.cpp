// Reading the CSV event log (event_log_reader.hpp).
#include "common/event_log_reader.hpp"

#include "adaptors/log_format.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <map>

namespace gpumem::tools {

std::vector<std::string> split_csv(const std::string& line) { return detail::split_log_fields(line); }

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 5) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  else std::snprintf(buf, sizeof buf, "%.2f %s", bytes, units[u]);
  return buf;
}

std::vector<logged_event> read_event_log(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw log_format_error(path + ": cannot open");
  return read_event_log(in, path);
}

std::vector<logged_event> read_event_log(std::istream& in, const std::string& path) {
  std::string line;
  if (!std::getline(in, line)) throw log_format_error(path + ": empty file, not a gpumem event log");
  const std::vector<std::string> header = split_csv(line);
  std::map<std::string, std::size_t> col;
  for (std::size_t i = 0; i < header.size(); ++i) col[header[i]] = i;
  for (const char* required : {"seq", "op", "ptr", "bytes"}) {
    if (!col.count(required)) {
      throw log_format_error(path + ":1: not a gpumem event log: no \"" + required +
                             "\" column in the header (docs/observability.md)");
    }
  }
  auto index = [&](const char* name) -> long {
    auto it = col.find(name);
    return it == col.end() ? -1 : static_cast<long>(it->second);
  };
  const long i_seq = index("seq"), i_time = index("time_ns"), i_thread = index("thread"),
             i_device = index("device"), i_stream = index("stream"), i_source = index("source"),
             i_op = index("op"), i_ptr = index("ptr"), i_bytes = index("bytes"),
             i_alignment = index("alignment"), i_outcome = index("outcome"), i_site = index("site");
  std::vector<logged_event> events;
  std::size_t number = 1;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty() || line == "\r") continue;
    const std::string at = path + ":" + std::to_string(number) + ": ";
    // Quotes come in pairs ("" inside a quoted field is two): an odd count is a
    // field cut in its quotes.
    if (std::count(line.begin(), line.end(), '"') % 2 != 0) throw log_format_error(at + "an unterminated quote");
    const std::vector<std::string> f = split_csv(line);
    if (f.size() != header.size()) {
      throw log_format_error(at + std::to_string(f.size()) + " fields where the header has " +
                             std::to_string(header.size()) + " (a row cut short, or extra commas)");
    }
    auto field = [&](long i) -> const std::string* {
      return i >= 0 && static_cast<std::size_t>(i) < f.size() ? &f[static_cast<std::size_t>(i)] : nullptr;
    };
    auto number_of = [&](long i, std::uint64_t fallback, const char* name) -> std::uint64_t {
      const std::string* s = field(i);
      if (s == nullptr || s->empty()) return fallback;
      try {
        // Digits (or 0x and hex digits) only: stoull would take "-5" as 2^64 - 5.
        if (!std::isxdigit(static_cast<unsigned char>((*s)[0]))) throw std::invalid_argument(name);
        std::size_t used = 0;
        const std::uint64_t v = std::stoull(*s, &used, 0);
        if (used != s->size()) throw std::invalid_argument(name);
        return v;
      } catch (const std::exception&) {
        throw log_format_error(at + "bad " + name + " \"" + *s + "\" (a number >= 0)");
      }
    };
    logged_event e;
    if (field(i_seq) == nullptr || field(i_seq)->empty()) throw log_format_error(at + "no seq");
    e.seq = number_of(i_seq, 0, "seq");
    if (e.seq == 0 || e.seq >= (std::uint64_t{1} << 63)) {
      throw log_format_error(at + "seq " + std::to_string(e.seq) + " is outside [1, 2^63)");
    }
    e.time_ns = number_of(i_time, 0, "time_ns");
    e.thread = static_cast<std::uint32_t>(number_of(i_thread, 1, "thread"));
    if (const std::string* d = field(i_device); d != nullptr && !d->empty()) {
      try {
        e.device = std::stoi(*d);
      } catch (const std::exception&) {
        throw log_format_error(path + ":" + std::to_string(number) + ": bad device \"" + *d + "\"");
      }
    }
    e.stream = number_of(i_stream, 0, "stream");
    e.source = field(i_source) != nullptr && !field(i_source)->empty() ? *field(i_source) : "app";
    const std::string* op = field(i_op);
    if (op == nullptr || (*op != "allocate" && *op != "deallocate")) {
      throw log_format_error(path + ":" + std::to_string(number) + ": op must be allocate or deallocate");
    }
    e.allocate = *op == "allocate";
    e.ptr = number_of(i_ptr, 0, "ptr");
    e.bytes = number_of(i_bytes, 0, "bytes");
    e.alignment = number_of(i_alignment, 256, "alignment");
    if (e.alignment == 0 || (e.alignment & (e.alignment - 1)) != 0) {
      throw log_format_error(at + "alignment " + std::to_string(e.alignment) + " is not a power of two");
    }
    e.line = number;
    e.outcome = field(i_outcome) != nullptr && !field(i_outcome)->empty() ? *field(i_outcome) : "ok";
    if (const std::string* s = field(i_site)) e.site = *s;
    // What succeeded must be possible (a failed request may have asked anything).
    if (e.ok() && e.allocate && e.bytes == 0) throw log_format_error(at + "an allocation of 0 bytes that succeeded");
    if (e.ok() && e.bytes >= (std::uint64_t{1} << 62)) {
      throw log_format_error(at + "bytes " + std::to_string(e.bytes) + " succeeded: past any device (2^62 or more)");
    }
    events.push_back(std::move(e));
  }
  if (events.empty()) throw log_format_error(path + ": no events after the header");
  std::stable_sort(events.begin(), events.end(),
                   [](const logged_event& a, const logged_event& b) { return a.seq < b.seq; });
  for (std::size_t k = 1; k < events.size(); ++k) {
    if (events[k].seq == events[k - 1].seq) {
      throw log_format_error(path + ":" + std::to_string(events[k].line) + ": seq " + std::to_string(events[k].seq) +
                             " repeats line " + std::to_string(events[k - 1].line) + "'s");
    }
  }
  return events;
}

}  // namespace gpumem::tools
