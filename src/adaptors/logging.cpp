// logging_adaptor (include/gpumem/adaptors/logging.hpp): one event per call, with
// its outcome, into the calling thread's ring of the event log.
//
// Note [Sequence numbers and reuse]
// The log's seq must order a free before any allocation that reuses its memory,
// or a replay would see the same address handed out twice. So an allocation takes
// its seq after the upstream returned (the memory exists from then on), and a
// free takes its seq *before* it calls the upstream (the memory can be reused
// only after that call begins). Any reuse of freed memory therefore has a larger
// seq than the free, whatever the threads' interleaving.
#include "gpumem/adaptors/logging.hpp"

#include <exception>

#include "adaptors/call_site.hpp"
#include "adaptors/event_log.hpp"
#include "gpumem/error.hpp"

namespace gpumem {
namespace {

// Runs the upstream call; the outcome, and the exception to rethrow once the
// event is recorded.
template <class F>
detail::log_outcome outcome_of(F&& call, std::exception_ptr& error) {
  try {
    call();
    return detail::log_outcome::ok;
  } catch (const out_of_memory&) {
    error = std::current_exception();
    return detail::log_outcome::oom;
  } catch (const logic_error&) {
    error = std::current_exception();
    return detail::log_outcome::logic_error;
  } catch (const cuda_error&) {
    error = std::current_exception();
    return detail::log_outcome::cuda_error;
  } catch (...) {
    error = std::current_exception();
    return detail::log_outcome::error;
  }
}

}  // namespace

logging_adaptor::logging_adaptor(memory_resource& upstream, const std::string& path,
                                 logging_options options)
    : resource_adaptor(upstream, "logging_adaptor"), log_(event_log::open(path)) {
  init(options);
}

logging_adaptor::logging_adaptor(std::shared_ptr<memory_resource> upstream, const std::string& path,
                                 logging_options options)
    : resource_adaptor(std::move(upstream), "logging_adaptor"), log_(event_log::open(path)) {
  init(options);
}

logging_adaptor::logging_adaptor(memory_resource& upstream, std::shared_ptr<event_log> log,
                                 logging_options options)
    : resource_adaptor(upstream, "logging_adaptor"), log_(std::move(log)) {
  init(options);
}

logging_adaptor::logging_adaptor(std::shared_ptr<memory_resource> upstream,
                                 std::shared_ptr<event_log> log, logging_options options)
    : resource_adaptor(std::move(upstream), "logging_adaptor"), log_(std::move(log)) {
  init(options);
}

void logging_adaptor::init(const logging_options& options) {
  if (!log_) throw logic_error("gpumem::logging_adaptor: null event_log");
  state_ = log_->impl_.get();
  source_ = state_->intern_source(options.source);
  device_ = upstream().properties().device;
  capture_sites_ = options.capture_sites;
}

logging_adaptor::~logging_adaptor() { state_->drain_all(); }

void* logging_adaptor::do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) {
  void* site = capture_sites_ ? detail::caller_outside_gpumem() : nullptr;
  void* p = nullptr;
  std::exception_ptr error;
  const detail::log_outcome outcome =
      outcome_of([&] { p = upstream_allocate(bytes, stream, alignment); }, error);
  event_log::impl& L = *state_;
  const log_event e{L.next_seq(), L.now(),  reinterpret_cast<std::uintptr_t>(stream.handle()),
                    reinterpret_cast<std::uintptr_t>(p), bytes, alignment, site,
                    detail::small_thread_id(), device_, source_, detail::log_op::allocate, outcome};
  L.push(L.local(), e);
  if (error) std::rethrow_exception(error);
  return p;
}

void logging_adaptor::do_deallocate(void* ptr, std::size_t bytes, stream_view stream,
                                    std::size_t alignment) {
  event_log::impl& L = *state_;
  const std::uint64_t seq = L.next_seq();  // before the upstream: Note [Sequence numbers and reuse]
  const std::uint64_t time = L.now();
  std::exception_ptr error;
  const detail::log_outcome outcome =
      outcome_of([&] { upstream_deallocate(ptr, bytes, stream, alignment); }, error);
  const log_event e{seq, time, reinterpret_cast<std::uintptr_t>(stream.handle()),
                    reinterpret_cast<std::uintptr_t>(ptr), bytes, alignment, nullptr,
                    detail::small_thread_id(), device_, source_, detail::log_op::deallocate, outcome};
  L.push(L.local(), e);
  if (error) std::rethrow_exception(error);
}

}  // namespace gpumem
