// logging_adaptor: writes every allocate and deallocate that passes through it,
// with its outcome, to a CSV event log (the format is a contract, written down in
// docs/observability.md: gpumem-replay and gpumem-report read it).
//
// An event_log is one file. Several adaptors may share one (gpumem's config puts
// one above a pool, source "app", and one below it, source "upstream", so that a
// log shows both what the program asked and what the pool reserved); every event
// of a log gets a sequence number from one counter, which orders them all.
//
// Low overhead: an event is a fixed-size record pushed into the calling thread's
// own ring buffer (no lock); rings are turned into text and written when one
// fills, at least once a second per thread, when a thread exits, on flush(),
// when the log is destroyed, and at process exit. Rows are therefore grouped by
// thread in the file, not sorted: order them by seq.
//
// Thread safety: safe from many threads; properties().thread_safe is the upstream's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "gpumem/adaptors/resource_adaptor.hpp"
#include "gpumem/export.hpp"

namespace gpumem {

class GPUMEM_EXPORT event_log {
 public:
  // Creates (truncates) the file at `path` and writes the header line. "%p" in the
  // path becomes the process id. logic_error when the file cannot be created.
  static std::shared_ptr<event_log> open(const std::string& path);
  ~event_log();  // flushes; never throws (a write error is reported on stderr)
  event_log(const event_log&) = delete;
  event_log& operator=(const event_log&) = delete;

  // Writes every event recorded so far, from every thread.
  void flush();
  const std::string& path() const noexcept;
  // Events recorded so far (written or not).
  std::uint64_t events() const noexcept;

  struct impl;
  explicit event_log(std::shared_ptr<impl> state);  // use open()

 private:
  std::shared_ptr<impl> impl_;
  friend class logging_adaptor;
};

struct logging_options {
  // The source column: who made the calls this adaptor logs ("app" for the
  // program, "upstream" for what a pool asks of its upstream). At most 64 characters.
  std::string source = "app";
  // Fill the site column with the first caller outside gpumem (a backtrace per
  // allocation: costs microseconds; names need executables linked with -rdynamic).
  bool capture_sites = false;
};

class GPUMEM_EXPORT logging_adaptor final : public resource_adaptor {
 public:
  std::string_view layer_name() const noexcept override { return "log"; }
  // A new log at `path` (see event_log::open).
  logging_adaptor(memory_resource& upstream, const std::string& path, logging_options options = {});
  logging_adaptor(std::shared_ptr<memory_resource> upstream, const std::string& path,
                  logging_options options = {});
  // Events go to a log that other adaptors may share. A null log is a logic_error.
  logging_adaptor(memory_resource& upstream, std::shared_ptr<event_log> log, logging_options options = {});
  logging_adaptor(std::shared_ptr<memory_resource> upstream, std::shared_ptr<event_log> log,
                  logging_options options = {});
  ~logging_adaptor() override;  // flushes the log

  void flush() { log_->flush(); }
  const std::shared_ptr<event_log>& log() const noexcept { return log_; }

 private:
  void* do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) override;
  void do_deallocate(void* ptr, std::size_t bytes, stream_view stream,
                     std::size_t alignment) override;
  void init(const logging_options& options);

  std::shared_ptr<event_log> log_;
  event_log::impl* state_ = nullptr;
  std::uint16_t source_ = 0;
  int device_ = -1;
  bool capture_sites_ = false;
};

}  // namespace gpumem
