// event_log: the file, the sequence counter, per-thread rings and their draining
// (event_log.hpp, Note [Log rings]).
#include "adaptors/event_log.hpp"
#include "diagnose.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "adaptors/call_site.hpp"
#include "gpumem/error.hpp"

namespace gpumem {
namespace {

thread_local detail::slot_cache ring_cache __attribute__((tls_model("initial-exec")));

std::string expand_path(const std::string& path) {
  std::string out;
  for (std::size_t i = 0; i < path.size(); ++i) {
    if (path[i] == '%' && i + 1 < path.size() && path[i + 1] == 'p') {
      out += std::to_string(::getpid());
      ++i;
    } else {
      out.push_back(path[i]);
    }
  }
  return out;
}

}  // namespace

event_log::impl::impl(std::string p, int f) : path(std::move(p)), fd(f), start_ns(detail::steady_ns()) {}

event_log::impl::~impl() {
  drain_all();
  if (rings) rings->close();
  if (fd >= 0) ::close(fd);
}

event_log::impl::ring& event_log::impl::local() {
  return detail::local_slot<ring>(*rings, ring_cache);
}

void event_log::impl::push(ring& r, const log_event& e) {
  const std::uint64_t h = r.head.load(std::memory_order_relaxed);
  if (h - r.tail.load(std::memory_order_acquire) >= ring_capacity) [[unlikely]] drain(r);
  r.cells[h % ring_capacity] = e;
  r.head.store(h + 1, std::memory_order_release);
  if (e.time_ns - r.last_drain_ns >= drain_interval_ns) [[unlikely]] {
    r.last_drain_ns = e.time_ns;
    drain(r);
  }
}

void event_log::impl::drain(ring& r) noexcept {
  try {
    std::string text;
    {
      std::lock_guard lock(r.drain_mutex);
      const std::uint64_t h = r.head.load(std::memory_order_acquire);
      const std::uint64_t t = r.tail.load(std::memory_order_relaxed);
      if (h == t) return;
      text.reserve((h - t) * 96);
      std::vector<std::string> names;
      {
        std::lock_guard s(sources_mutex);
        names = sources;
      }
      std::string site;
      for (std::uint64_t i = t; i < h; ++i) {
        const log_event& e = r.cells[i % ring_capacity];
        site = e.site != nullptr ? detail::describe_frame(e.site) : std::string();
        detail::log_row row;
        row.seq = e.seq;
        row.time_ns = e.time_ns;
        row.thread = e.thread;
        row.device = e.device;
        row.stream = e.stream;
        row.source = e.source < names.size() ? std::string_view(names[e.source]) : std::string_view("?");
        row.op = e.op;
        row.ptr = e.ptr;
        row.bytes = e.bytes;
        row.alignment = e.alignment;
        row.outcome = e.outcome;
        row.site = site;
        detail::append_log_row(text, row);
      }
      r.tail.store(h, std::memory_order_release);
    }
    write(text);
  } catch (const std::exception& e) {
    detail::diagnosef(diagnostic_level::error, "gpumem event_log %s: events lost: %s\n", path.c_str(), e.what());
  }
}

void event_log::impl::drain_all() noexcept {
  if (!rings) return;
  std::vector<ring*> all;
  try {
    rings->for_each([&](detail::thread_slot& s) { all.push_back(&static_cast<ring&>(s)); });
  } catch (...) {
    return;
  }
  // Slots are never freed while the registry lives (this impl holds it).
  for (ring* r : all) drain(*r);
}

void event_log::impl::write(const std::string& text) noexcept {
  std::lock_guard lock(file_mutex);
  if (fd < 0 || write_failed) return;
  const char* p = text.data();
  std::size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      write_failed = true;
      detail::diagnosef(diagnostic_level::error, "gpumem event_log: cannot write %s: %s; logging stops\n", path.c_str(),
                   std::strerror(errno));
      return;
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

std::uint16_t event_log::impl::intern_source(const std::string& name) {
  if (name.empty() || name.size() > 64) {
    throw logic_error("gpumem::logging_adaptor: source must be 1 to 64 characters, not \"" + name + "\"");
  }
  std::lock_guard lock(sources_mutex);
  for (std::size_t i = 0; i < sources.size(); ++i) {
    if (sources[i] == name) return static_cast<std::uint16_t>(i);
  }
  if (sources.size() >= 0xFFFF) throw logic_error("gpumem::logging_adaptor: too many sources in one log");
  sources.push_back(name);
  return static_cast<std::uint16_t>(sources.size() - 1);
}

// ---- event_log ----

std::shared_ptr<event_log> event_log::open(const std::string& requested) {
  if (requested.empty()) throw logic_error("gpumem::event_log: empty path");
  const std::string path = expand_path(requested);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw logic_error("gpumem::event_log: cannot create " + path + ": " + std::strerror(errno));
  }
  auto state = std::make_shared<impl>(path, fd);
  std::weak_ptr<impl> weak = state;
  state->rings = detail::slot_registry::create([weak] { return std::make_unique<impl::ring>(weak); });
  std::string header(detail::log_header);
  header.push_back('\n');
  state->write(header);
  detail::run_at_exit(state);
  return std::make_shared<event_log>(std::move(state));
}

event_log::event_log(std::shared_ptr<impl> state) : impl_(std::move(state)) {}

event_log::~event_log() = default;  // the impl drains and closes when its last holder lets go

void event_log::flush() { impl_->drain_all(); }

const std::string& event_log::path() const noexcept { return impl_->path; }

std::uint64_t event_log::events() const noexcept { return impl_->seq.load(std::memory_order_relaxed); }

}  // namespace gpumem
