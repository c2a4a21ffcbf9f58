// Writing log rows (log_format.hpp).
#include "adaptors/log_format.hpp"

#include <charconv>

namespace gpumem::detail {
namespace {

void append_uint(std::string& out, std::uint64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

void append_hex(std::string& out, std::uint64_t v) {
  char buf[24] = {'0', 'x'};
  auto r = std::to_chars(buf + 2, buf + sizeof buf, v, 16);
  out.append(buf, r.ptr);
}

// RFC 4180: quoted when it holds a comma, a quote or a line break; quotes doubled.
void append_field(std::string& out, std::string_view s) {
  if (s.find_first_of(",\"\r\n") == std::string_view::npos) {
    out.append(s);
    return;
  }
  out.push_back('"');
  for (char c : s) {
    if (c == '"') out.push_back('"');
    out.push_back(c);
  }
  out.push_back('"');
}

}  // namespace

const char* to_string(log_outcome o) noexcept {
  switch (o) {
    case log_outcome::ok: return "ok";
    case log_outcome::oom: return "oom";
    case log_outcome::logic_error: return "logic_error";
    case log_outcome::cuda_error: return "cuda_error";
    default: return "error";
  }
}

void append_log_row(std::string& out, const log_row& r) {
  append_uint(out, r.seq);
  out.push_back(',');
  append_uint(out, r.time_ns);
  out.push_back(',');
  append_uint(out, r.thread);
  out.push_back(',');
  if (r.device < 0) {
    out.push_back('-');
    append_uint(out, static_cast<std::uint64_t>(-static_cast<std::int64_t>(r.device)));
  } else {
    append_uint(out, static_cast<std::uint64_t>(r.device));
  }
  out.push_back(',');
  append_hex(out, r.stream);
  out.push_back(',');
  append_field(out, r.source);
  out.push_back(',');
  out.append(r.op == log_op::allocate ? "allocate" : "deallocate");
  out.push_back(',');
  append_hex(out, r.ptr);
  out.push_back(',');
  append_uint(out, r.bytes);
  out.push_back(',');
  append_uint(out, r.alignment);
  out.push_back(',');
  out.append(to_string(r.outcome));
  out.push_back(',');
  append_field(out, r.site);
  out.push_back('\n');
}

}  // namespace gpumem::detail
