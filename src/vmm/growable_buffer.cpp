// growable_buffer: growth by mapping at the end, in place or by remapping the same
// physical memory into a larger range; shrinking ordered after the stream's work.
#include "gpumem/vmm/growable_buffer.hpp"
#include "diagnose.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <utility>

#include "driver/driver.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "stream_device.hpp"
#include "vmm/virtual_memory.hpp"

namespace gpumem {
namespace {

[[noreturn]] void throw_oom(int device, std::size_t requested, std::size_t held, const std::string& reason) {
  detail::vmm::throw_out_of_memory("growable_buffer", device, requested, held, reason);
}

// Addresses every growable_buffer of the process holds (reserved, mapped or not),
// and how much of them a buffer may add by default (growable_options::address_bytes).
constexpr std::size_t default_address_budget = std::size_t{16} << 40;
std::atomic<std::size_t> addresses_held{0};

CUdeviceptr take_addresses(int device, std::size_t bytes, CUdeviceptr hint = 0) {
  const CUdeviceptr p = detail::vmm::reserve(device, bytes, hint);
  if (p != 0) addresses_held.fetch_add(bytes, std::memory_order_relaxed);
  return p;
}

void give_back_addresses(int device, CUdeviceptr base, std::size_t bytes) {
  detail::vmm::free_addresses(device, base, bytes);
  addresses_held.fetch_sub(bytes, std::memory_order_relaxed);
}

// The device's memory size (cuDeviceTotalMem), cached per device.
std::size_t device_memory_bytes(int device) {
  static std::array<std::atomic<std::size_t>, 64> cache{};
  const bool cached = device >= 0 && static_cast<std::size_t>(device) < cache.size();
  if (cached) {
    if (std::size_t b = cache[static_cast<std::size_t>(device)].load(std::memory_order_relaxed)) return b;
  }
  CUdevice d = 0;
  GPUMEM_CU(cuDeviceGet, &d, device);
  std::size_t bytes = 0;
  GPUMEM_CU(cuDeviceTotalMem, &bytes, d);
  if (cached) cache[static_cast<std::size_t>(device)].store(bytes, std::memory_order_relaxed);
  return bytes;
}

}  // namespace

growable_buffer::growable_buffer(int device, stream_view stream, growable_options options)
    : device_(device), stream_(stream), options_(std::move(options)),
      pending_(std::make_unique<detail::vmm::release_queue>()) {
  granularity_ = detail::vmm::granularity(device);
  for (int peer : options_.peer_devices) detail::validate_device(peer, "growable_buffer peer_devices");
  // Past any address space, and the rounding below would overflow (to 0: a division by zero later).
  constexpr std::size_t largest = std::size_t{1} << 50;  // 1 PiB
  for (auto [field, value] : {std::pair{"min_chunk_bytes", options_.min_chunk_bytes},
                              std::pair{"max_chunk_bytes", options_.max_chunk_bytes}}) {
    if (value > largest) {
      throw logic_error(std::string("growable_buffer: ") + field + " (" + std::to_string(value) +
                        ") is larger than 1 PiB (2^50 bytes)");
    }
  }
  options_.min_chunk_bytes = detail::vmm::round_up(std::max(options_.min_chunk_bytes, granularity_), granularity_);
  options_.max_chunk_bytes = std::max(detail::vmm::round_up(options_.max_chunk_bytes, granularity_), options_.min_chunk_bytes);
  options_.address_bytes = detail::vmm::round_up(std::min(options_.address_bytes, SIZE_MAX / 4), granularity_);
  check_stream(stream_);
}

void growable_buffer::check_stream(stream_view s) const { detail::check_stream_device(s, device_, "growable_buffer"); }

growable_buffer::growable_buffer(std::size_t bytes, int device, stream_view stream, growable_options options)
    : growable_buffer(device, stream, std::move(options)) {
  resize(bytes);
}

growable_buffer::~growable_buffer() { give_back_everything(); }

growable_buffer::growable_buffer(growable_buffer&& other) noexcept
    : device_(other.device_), stream_(other.stream_), options_(std::move(other.options_)),
      granularity_(other.granularity_), base_(std::exchange(other.base_, 0)), size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)), reserved_(std::exchange(other.reserved_, 0)),
      relocations_(other.relocations_), chunks_(std::move(other.chunks_)), ranges_(std::move(other.ranges_)),
      pending_(std::exchange(other.pending_, std::make_unique<detail::vmm::release_queue>())) {
  other.chunks_.clear();
  other.ranges_.clear();
}

growable_buffer& growable_buffer::operator=(growable_buffer&& other) noexcept {
  if (this != &other) {
    give_back_everything();
    device_ = other.device_;
    stream_ = other.stream_;
    options_ = std::move(other.options_);
    granularity_ = other.granularity_;
    base_ = std::exchange(other.base_, 0);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
    reserved_ = std::exchange(other.reserved_, 0);
    relocations_ = other.relocations_;
    chunks_ = std::move(other.chunks_);
    ranges_ = std::move(other.ranges_);
    other.chunks_.clear();
    other.ranges_.clear();
    std::swap(pending_, other.pending_);
  }
  return *this;
}

void growable_buffer::set_stream(stream_view s) {
  check_stream(s);  // before anything changes
  // Shrinks queued behind the old stream run first (a wait for that stream only).
  pending_->drain();
  stream_ = s;
}

void growable_buffer::reserve(std::size_t bytes) { ensure_addresses(bytes); }

void growable_buffer::resize(std::size_t bytes) {
  if (bytes > mapped_) map_more(bytes);
  size_ = bytes;
}

// Note [Growing the address range]
// The buffer's addresses are one or more reservations back to back from base_.
// The first one is large: growable_options::address_bytes, by default the device's
// memory size, which no growth can exceed. Addresses cost nothing until mapped, and
// a driver that ignores address hints (some do) would otherwise make every growth
// past the range a relocation: every handle mapped again and its access set again
// (the costly driver calls) and the old mappings unmapped: doubling from 2 MiB to
// 4 GiB relocated at every step, paying for remapped handles that mapping into
// one pre-reserved range never pays for (docs/benchmarks.md, W6). Only while the process's buffers hold
// more than default_address_budget of addresses does a new buffer reserve just
// what it needs, so that thousands of buffers cannot exhaust the address space
// that every other allocation needs too.
//
// Past the range (reserve() beyond it, or a small address_bytes), the buffer first
// asks for the range right after the last one (an address hint: the driver may
// place it elsewhere, then it is given back), so data() stays. Else it reserves a
// new range of the full size, maps every existing handle there at the same offset
// (the same physical memory: the contents are there, nothing is copied), sets
// access once, and only then queues the old mappings' unmap behind the stream's
// work: kernels already queued may still use the old addresses. Reservations grow
// by doubling, so relocations are logarithmic in the final size.
void growable_buffer::ensure_addresses(std::size_t bytes) {
  if (bytes > SIZE_MAX / 2) throw_oom(device_, bytes, mapped_, "larger than any address range");
  const std::size_t need = detail::vmm::round_up(bytes, granularity_);
  if (need <= reserved_) return;
  detail::vmm::global_release_queue().poll();

  if (base_ == 0) {
    std::size_t first = options_.address_bytes;
    if (first == 0) {
      first = detail::vmm::round_up(device_memory_bytes(device_), granularity_);
      if (addresses_held.load(std::memory_order_relaxed) + first > default_address_budget) first = need;
    }
    const std::size_t target = std::max(need, first);
    CUdeviceptr p = take_addresses(device_, target);
    std::size_t got = target;
    if (p == 0 && target != need) {
      p = take_addresses(device_, need);
      got = need;
    }
    if (p == 0) throw_oom(device_, bytes, mapped_, "no address range of that size is free");
    base_ = p;
    reserved_ = got;
    ranges_.push_back({p, got});
    return;
  }

  const std::size_t target = std::max(need, detail::vmm::round_up(reserved_ * 2, granularity_));
  // In place: right after the current range.
  for (std::size_t want : {target, need}) {
    const std::size_t extra = want - reserved_;
    const CUdeviceptr end = base_ + reserved_;
    const CUdeviceptr p = take_addresses(device_, extra, end);
    if (p == end) {
      ranges_.push_back({p, extra});
      reserved_ = want;
      return;
    }
    if (p != 0) give_back_addresses(device_, p, extra);
    if (want == need) break;
  }

  // Elsewhere: a fresh range, the same physical memory mapped there.
  std::size_t got = target;
  CUdeviceptr fresh = take_addresses(device_, target);
  if (fresh == 0) {
    got = need;
    fresh = take_addresses(device_, need);
  }
  if (fresh == 0) throw_oom(device_, bytes, mapped_, "no address range of that size is free");
  std::size_t offset = 0;
  try {
    for (const chunk& c : chunks_) {
      detail::vmm::map(device_, fresh + offset, c.bytes, c.handle);
      offset += c.bytes;
    }
    if (mapped_ > 0) detail::vmm::set_access(device_, fresh, mapped_, options_.peer_devices);
  } catch (...) {
    std::size_t undo = 0;
    for (const chunk& c : chunks_) {
      if (undo >= offset) break;
      detail::vmm::unmap(device_, fresh + undo, c.bytes);
      undo += c.bytes;
    }
    give_back_addresses(device_, fresh, got);
    throw;
  }
  // The old addresses go once the work queued on the stream so far is done.
  std::vector<chunk> old_chunks = chunks_;
  std::vector<range> old_ranges = std::move(ranges_);
  const CUdeviceptr old_base = base_;
  const int device = device_;
  auto give_back_old = [device, old_base, old_chunks, old_ranges] {
    CUdeviceptr at = old_base;
    for (const chunk& c : old_chunks) {
      detail::vmm::unmap(device, at, c.bytes);
      at += c.bytes;
    }
    for (const range& r : old_ranges) give_back_addresses(device, r.base, r.bytes);
  };
  // Shrinks of the old range queued earlier on the stream run before its addresses are freed.
  pending_->move_into(detail::vmm::global_release_queue());
  detail::vmm::global_release_queue().enqueue(device_, stream_, give_back_old);
  base_ = fresh;
  reserved_ = got;
  ranges_.assign(1, {fresh, got});
  ++relocations_;
}

void growable_buffer::map_more(std::size_t bytes) {
  // Before any rounding: a size past any address range would wrap (and leave the
  // buffer claiming bytes it never mapped). The buffer is left as it was.
  if (bytes > SIZE_MAX / 2) throw_oom(device_, bytes, mapped_, "larger than any address range");
  const std::size_t target = detail::vmm::round_up(bytes, options_.min_chunk_bytes);
  // A shrink still waiting on the stream holds mappings where growth maps now.
  if (!pending_->empty() && (pending_->poll(), !pending_->empty())) pending_->drain();
  ensure_addresses(target);

  std::vector<chunk> added;
  std::size_t at = mapped_;
  auto roll_back = [&] {
    std::size_t undo = mapped_;
    for (const chunk& c : added) {
      try {
        detail::vmm::unmap(device_, base_ + undo, c.bytes);  // nothing used it yet
      } catch (...) {
      }
      undo += c.bytes;
      try {
        detail::vmm::release(device_, c.handle);
      } catch (...) {
      }
    }
  };
  try {
    while (at < target) {
      // A handle lies inside one reservation (a mapping cannot span two).
      std::size_t range_end = 0;
      for (const range& r : ranges_) {
        if (base_ + at >= r.base && base_ + at < r.base + r.bytes) range_end = r.base + r.bytes - base_;
      }
      const std::size_t piece = std::min({options_.max_chunk_bytes, target - at, range_end - at});
      auto h = detail::vmm::create(device_, piece, options_.posix_fd_shareable);
      if (!h && detail::vmm::global_release_queue().poll() > 0) h = detail::vmm::create(device_, piece, options_.posix_fd_shareable);
      if (!h && !detail::vmm::global_release_queue().empty()) {
        detail::vmm::global_release_queue().drain();  // slow path: memory other buffers are giving back
        h = detail::vmm::create(device_, piece, options_.posix_fd_shareable);
      }
      if (!h) {
        roll_back();
        throw_oom(device_, bytes, mapped_,
                  "the device has no physical memory for the next " + std::to_string(piece) +
                      " bytes of growth; the buffer is unchanged");
      }
      try {
        detail::vmm::map(device_, base_ + at, piece, *h);
      } catch (...) {
        detail::vmm::release(device_, *h);
        throw;
      }
      added.push_back({*h, piece});
      at += piece;
    }
    // Access once per reservation the new memory lies in.
    for (const range& r : ranges_) {
      const CUdeviceptr lo = std::max(r.base, base_ + mapped_);
      const CUdeviceptr hi = std::min(r.base + r.bytes, base_ + target);
      if (lo < hi) detail::vmm::set_access(device_, lo, hi - lo, options_.peer_devices);
    }
  } catch (const out_of_memory&) {
    throw;
  } catch (...) {
    roll_back();
    throw;
  }
  chunks_.insert(chunks_.end(), added.begin(), added.end());
  mapped_ = target;
}

void growable_buffer::shrink_to_fit() {
  std::size_t keep = 0;
  std::size_t k = 0;
  while (k < chunks_.size() && keep < size_) keep += chunks_[k++].bytes;
  if (k == chunks_.size()) return;
  std::vector<chunk> tail(chunks_.begin() + static_cast<std::ptrdiff_t>(k), chunks_.end());
  const int device = device_;
  const CUdeviceptr at = base_ + keep;
  auto give_back_tail = [device, at, tail] {
    CUdeviceptr p = at;
    for (const chunk& c : tail) {
      detail::vmm::unmap(device, p, c.bytes);
      detail::vmm::release(device, c.handle);
      p += c.bytes;
    }
  };
  chunks_.resize(k);
  mapped_ = keep;
  pending_->enqueue(device_, stream_, give_back_tail);
}

void growable_buffer::give_back_everything() noexcept {
  if (base_ == 0) return;
  const int device = device_;
  const CUdeviceptr base = base_;
  std::vector<chunk> all = std::move(chunks_);
  std::vector<range> ranges = std::move(ranges_);
  auto give_back = [device, base, all, ranges] {
    CUdeviceptr p = base;
    for (const chunk& c : all) {
      detail::vmm::unmap(device, p, c.bytes);
      detail::vmm::release(device, c.handle);
      p += c.bytes;
    }
    for (const range& r : ranges) give_back_addresses(device, r.base, r.bytes);
  };
  try {
    // Earlier shrinks of this range first: queued ahead, on the same stream.
    pending_->move_into(detail::vmm::global_release_queue());
    detail::vmm::global_release_queue().enqueue(device_, stream_, give_back);
  } catch (const std::exception& e) {
    // The stream is gone (recording failed): nothing can still be queued on it.
    detail::diagnosef(diagnostic_level::error, "gpumem: growable_buffer: %s; giving the memory back now\n", e.what());
    try {
      give_back();
    } catch (const std::exception& e2) {
      detail::diagnosef(diagnostic_level::error, "gpumem: growable_buffer: giving %zu bytes back failed: %s\n", mapped_, e2.what());
    }
  }
  base_ = 0;
  size_ = mapped_ = reserved_ = 0;
  chunks_.clear();
  ranges_.clear();
}

}  // namespace gpumem
