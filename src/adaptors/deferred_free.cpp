// deferred_free_adaptor (include/gpumem/adaptors/deferred_free.hpp): the queue,
// its flush triggers, the OOM flush-and-retry, defer_cleanup scopes.
//
// Note [Deferred frees and stream order]
// A free made on stream S promises the upstream that the memory is reused only
// after S's work queued before the free. Handing the free over later, on S, would
// be wrong in two ways: S may be destroyed by then, and S may have queued more
// work meanwhile (harmless but needlessly late). So at the free the adaptor
// records an event on S (one event per stream and batch, re-recorded by each
// later free on S: its last record covers every earlier free), and at the flush
// its own stream waits for every batch event (on the device, the host never
// waits) and the frees are handed to the upstream on that stream. The upstream
// then orders reuse after its own stream, which is after every S. The per-thread
// default stream is a different stream on each thread under one handle, so frees
// on it get an event each.
#include "gpumem/adaptors/deferred_free.hpp"
#include "diagnose.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "driver/driver.hpp"
#include "text.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/event.hpp"
#include "gpumem/stream.hpp"

namespace gpumem {
namespace {

enum class trigger { count, bytes, oom, requested };

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

}  // namespace

deferred_free_options deferred_free_options::from_environment() {
  deferred_free_options o;
  if (auto v = env("GPUMEM_MAX_PENDING_DEALLOCS_COUNT")) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long n = std::strtoull(v->c_str(), &end, 10);
    if (end == v->c_str() || *end != '\0' || errno != 0 || (*v)[0] == '-') {
      throw logic_error("GPUMEM_MAX_PENDING_DEALLOCS_COUNT=\"" + *v + "\": not a count of frees");
    }
    o.max_pending_count = static_cast<std::size_t>(n);
  }
  if (auto v = env("GPUMEM_MAX_PENDING_DEALLOCS_RATIO")) {
    char* end = nullptr;
    const double r = std::strtod(v->c_str(), &end);
    if (end == v->c_str() || *end != '\0' || !(r > 0.0 && r <= 1.0)) {
      throw logic_error("GPUMEM_MAX_PENDING_DEALLOCS_RATIO=\"" + *v + "\": not a ratio in (0, 1]");
    }
    o.max_pending_ratio = r;
  }
  return o;
}

struct deferred_free_adaptor::impl {
  struct live_record {
    std::size_t bytes;
    std::size_t alignment;
  };
  struct pending {
    void* ptr;
    std::size_t bytes;
    std::size_t alignment;
    CUstream stream;  // host resources only: the stream to free on
  };
  struct batch {
    std::vector<pending> frees;
    std::vector<std::unique_ptr<event>> events;
  };

  impl(memory_resource& up, deferred_free_options o) : upstream(up), opt(o) {
    if (!(opt.max_pending_ratio > 0.0 && opt.max_pending_ratio <= 1.0)) {
      throw logic_error("gpumem::deferred_free_adaptor: max_pending_ratio must be in (0, 1]");
    }
    device = up.properties().device;
    if (device >= 0) {
      const double total = static_cast<double>(device_memory_info(device).total_bytes);
      max_bytes = static_cast<std::size_t>(total * opt.max_pending_ratio);
    } else {
      max_bytes = static_cast<std::size_t>(-1);
    }
  }

  // mutex held.
  std::optional<trigger> over_limit() const {
    if (holds > 0) return std::nullopt;
    if (queue.frees.size() > opt.max_pending_count) return trigger::count;
    if (queued_bytes > max_bytes) return trigger::bytes;
    return std::nullopt;
  }

  // mutex held. The event that orders a free on `s` (Note [Deferred frees and stream order]).
  void record_on(stream_view s) {
    if (device < 0) return;
    const bool per_thread = s.handle() == CU_STREAM_PER_THREAD;
    auto it = per_thread ? stream_events.end() : stream_events.find(s.handle());
    if (it != stream_events.end()) {
      it->second->record(s);
      return;
    }
    std::unique_ptr<event> e;
    if (!spare_events.empty()) {
      e = std::move(spare_events.back());
      spare_events.pop_back();
    } else {
      e = std::make_unique<event>(device);
    }
    e->record(s);  // may throw cuda_error: nothing changed yet
    if (!per_thread) stream_events.emplace(s.handle(), e.get());
    queue.events.push_back(std::move(e));
  }

  // Frees one batch (flush_mutex held, mutex not). Returns the first error.
  std::exception_ptr free_batch(batch& b) {
    std::exception_ptr error;
    std::size_t done = 0;
    try {
      if (device >= 0 && !b.frees.empty()) {
        if (!own_stream) own_stream = std::make_unique<stream>(device);
        for (const auto& e : b.events) own_stream->wait(*e);
      }
      for (; done < b.frees.size(); ++done) {
        const pending& p = b.frees[done];
        self->upstream_deallocate(p.ptr, p.bytes, device >= 0 ? own_stream->view() : stream_view{p.stream}, p.alignment);
      }
    } catch (...) {
      error = std::current_exception();
    }
    std::size_t cancelled_bytes_now = 0;
    for (std::size_t k = done + (error ? 1 : 0); k < b.frees.size(); ++k) cancelled_bytes_now += b.frees[k].bytes;
    const std::size_t cancelled_now = error ? b.frees.size() - done - 1 : 0;
    {
      std::lock_guard lock(mutex);
      stats.frees += done;
      stats.cancelled_frees += cancelled_now;
      stats.cancelled_bytes += cancelled_bytes_now;
      for (auto& e : b.events) spare_events.push_back(std::move(e));
    }
    if (error && cancelled_now > 0) {
      detail::diagnosef(diagnostic_level::error,
                   "gpumem deferred_free_adaptor: a deallocation failed; the %zu free(s) (%s) queued "
                   "after it were cancelled\n",
                   cancelled_now, detail::human_bytes(cancelled_bytes_now).c_str());
    }
    return error;
  }

  // Takes the queue (all of it) and frees it. Throws the first error.
  void flush(trigger why) {
    std::lock_guard serial(flush_mutex);
    batch b;
    {
      std::lock_guard lock(mutex);
      if (queue.frees.empty()) return;
      b = std::move(queue);
      queue = {};
      queued_bytes = 0;
      stream_events.clear();
      ++stats.flushes;
      switch (why) {
        case trigger::count: ++stats.flushes_by_count; break;
        case trigger::bytes: ++stats.flushes_by_bytes; break;
        case trigger::oom: ++stats.flushes_by_oom; break;
        case trigger::requested: ++stats.flushes_requested; break;
      }
    }
    if (std::exception_ptr e = free_batch(b)) std::rethrow_exception(e);
  }

  deferred_free_adaptor* self = nullptr;  // frees go to self->upstream_deallocate
  memory_resource& upstream;
  deferred_free_options opt;
  int device = -1;
  std::size_t max_bytes = 0;

  mutable std::mutex mutex;  // everything below but own_stream
  std::unordered_map<void*, live_record> live;
  batch queue;
  std::size_t queued_bytes = 0;
  std::unordered_map<CUstream, event*> stream_events;  // the queue's event per stream
  std::vector<std::unique_ptr<event>> spare_events;
  int holds = 0;
  deferred_free_statistics stats;

  std::mutex flush_mutex;  // one flush at a time; guards own_stream
  std::unique_ptr<stream> own_stream;
};

deferred_free_adaptor::deferred_free_adaptor(memory_resource& upstream, deferred_free_options options)
    : resource_adaptor(upstream, "deferred_free_adaptor"),
      impl_(std::make_unique<impl>(upstream, options)) {
  impl_->self = this;
}

deferred_free_adaptor::deferred_free_adaptor(std::shared_ptr<memory_resource> upstream,
                                             deferred_free_options options)
    : resource_adaptor(std::move(upstream), "deferred_free_adaptor"),
      impl_(std::make_unique<impl>(this->upstream(), options)) {
  impl_->self = this;
}

deferred_free_adaptor::~deferred_free_adaptor() {
  try {
    impl_->flush(trigger::requested);
  } catch (const std::exception& e) {
    detail::diagnosef(diagnostic_level::error, "gpumem deferred_free_adaptor: flushing at destruction: %s\n", e.what());
  }
  try {
    std::lock_guard serial(impl_->flush_mutex);
    if (impl_->own_stream) impl_->own_stream->synchronize();  // its waits use our events
  } catch (const std::exception& e) {
    detail::diagnosef(diagnostic_level::error, "gpumem deferred_free_adaptor: teardown: %s\n", e.what());
  }
}

void* deferred_free_adaptor::do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) {
  impl& st = *impl_;
  void* p = nullptr;
  try {
    p = upstream_allocate(bytes, stream, alignment);
  } catch (const out_of_memory&) {
    {
      std::lock_guard lock(st.mutex);
      if (st.holds > 0 || st.queue.frees.empty()) throw;  // nothing we may free
    }
    st.flush(trigger::oom);
    p = upstream_allocate(bytes, stream, alignment);  // once; its out_of_memory is the caller's
  }
  try {
    std::lock_guard lock(st.mutex);
    st.live.insert_or_assign(p, impl::live_record{bytes, alignment});
  } catch (...) {
    upstream_deallocate(p, bytes, stream, alignment);
    throw;
  }
  return p;
}

void deferred_free_adaptor::do_deallocate(void* ptr, std::size_t bytes, stream_view stream,
                                          std::size_t alignment) {
  impl& st = *impl_;
  const CUstream h = stream.handle();
  if (st.device >= 0 && !detail::is_default_stream(h) && stream.device() != st.device) {
    // Checked here, not left to the flush: the free must fail now, and the event
    // recorded on the stream would order nothing on this device.
    throw logic_error("gpumem::deferred_free_adaptor::deallocate: the stream belongs to device " +
                      std::to_string(stream.device()) + ", the resource to device " +
                      std::to_string(st.device));
  }
  std::optional<trigger> why;
  {
    std::lock_guard lock(st.mutex);
    auto it = st.live.find(ptr);
    if (it == st.live.end()) {
      throw logic_error("gpumem::deferred_free_adaptor::deallocate: " +
                        detail::hex_pointer(reinterpret_cast<std::uintptr_t>(ptr)) +
                        " is not a live allocation of this adaptor (foreign, interior or already freed)");
    }
    if (it->second.bytes != bytes) {
      throw logic_error("gpumem::deferred_free_adaptor::deallocate: " +
                        detail::hex_pointer(reinterpret_cast<std::uintptr_t>(ptr)) + " was allocated with " +
                        std::to_string(it->second.bytes) + " bytes, freed with " + std::to_string(bytes));
    }
    st.queue.frees.reserve(st.queue.frees.size() + 1);
    st.record_on(stream);  // throws before anything changed
    st.queue.frees.push_back({ptr, bytes, alignment, stream.handle()});
    st.queued_bytes += bytes;
    st.live.erase(it);
    why = st.over_limit();
  }
  if (why) st.flush(*why);
}

void deferred_free_adaptor::flush() { impl_->flush(trigger::requested); }

std::size_t deferred_free_adaptor::max_pending_count() const noexcept { return impl_->opt.max_pending_count; }

std::size_t deferred_free_adaptor::max_pending_bytes() const noexcept { return impl_->max_bytes; }

deferred_free_statistics deferred_free_adaptor::statistics() const {
  std::lock_guard lock(impl_->mutex);
  deferred_free_statistics s = impl_->stats;
  s.pending_count = impl_->queue.frees.size();
  s.pending_bytes = impl_->queued_bytes;
  return s;
}

int deferred_free_adaptor::cleanup_deferrals() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->holds;
}

defer_cleanup::defer_cleanup(deferred_free_adaptor& resource) : resource_(resource) {
  std::lock_guard lock(resource_.impl_->mutex);
  ++resource_.impl_->holds;
}

defer_cleanup::~defer_cleanup() {
  auto& st = *resource_.impl_;
  std::optional<trigger> why;
  {
    std::lock_guard lock(st.mutex);
    --st.holds;
    why = st.over_limit();
  }
  if (!why) return;
  try {
    st.flush(*why);
  } catch (const std::exception& e) {
    detail::diagnosef(diagnostic_level::error, "gpumem defer_cleanup: flushing at the end of the scope: %s\n", e.what());
  }
}

}  // namespace gpumem
