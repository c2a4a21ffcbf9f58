// vmm_pool_resource: the stream-ordering engine (src/pool/stream_ordered_pool.hpp)
// over paged address segments (docs/vmm.md). This file makes the pool, answers
// its queries and gives everything back at the end; page_backing.cpp grows it,
// page_blocks.cpp edits its blocks page by page.
#include "gpumem/vmm_pool_resource.hpp"
#include "diagnose.hpp"
#include "gpumem/ipc.hpp"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <limits>

#include "driver/driver.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "vmm/virtual_memory.hpp"
#include "vmm/vmm_pool_impl.hpp"

namespace gpumem {
namespace vm = detail::vmm;

namespace {

detail::stream_pool_settings settings_of(const vmm_pool_options& o, std::size_t page) {
  return {.reuse_across_streams = o.reuse_across_streams, .quick_cache = o.quick_cache,
          .fence_interval = o.fence_interval, .fence_bytes = o.fence_bytes,
          .check_capture = o.check_capture, .watch_captures = o.watch_captures, .page_bytes = page,
          .slot_min_bytes = o.slot_min_bytes != 0 ? std::max(o.slot_min_bytes, page) : page};
}

// The devices a mapping gives access to besides the owner (impl::access_devices).
std::vector<int> access_devices_of(int device, const vmm_pool_options& o) {
  std::vector<int> out = o.peer_devices;
  if (o.access_for_every_peer) {
    for (int p : peers_of(device)) {
      if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
    }
  }
  return out;
}

int checked_device(int device, const vmm_pool_options& o) {
  detail::validate_device(device, "vmm_pool_resource");
  for (int p : o.peer_devices) detail::validate_device(p, "vmm_pool_resource peer_devices");
  return device;
}

}  // namespace

std::size_t vmm_pool_resource::impl::page_of(int device, const vmm_pool_options& o) {
  const std::size_t g = vm::granularity(checked_device(device, o));
  if (o.page_bytes != 0 && (o.page_bytes % g != 0 || (o.page_bytes & (o.page_bytes - 1)) != 0)) {
    throw logic_error("gpumem::vmm_pool_resource: page_bytes (" + std::to_string(o.page_bytes) +
                      ") must be a power of two and a multiple of the device's granularity (" + std::to_string(g) + ")");
  }
  // Page indices are shifts (the engine's page_shift, impl::page_index): a
  // granularity that is not a power of two (none is known) is refused.
  if (!std::has_single_bit(g)) {
    throw logic_error("gpumem::vmm_pool_resource: the device's allocation granularity (" + std::to_string(g) +
                      ") is not a power of two");
  }
  return o.page_bytes != 0 ? o.page_bytes : g;
}

vmm_pool_resource::impl::impl(int dev, vmm_pool_options o)
    : opt(std::move(o)),
      page(page_of(dev, opt)),
      pool("vmm_pool_resource", dev, settings_of(opt, page)) {
  pool.set_backing(this);
  access_devices = access_devices_of(dev, opt);
  device_total = device_memory_info(dev).total_bytes;
  if (page > device_total) {
    throw logic_error("gpumem::vmm_pool_resource: page_bytes (" + std::to_string(page) +
                      ") exceeds the device's memory (" + std::to_string(device_total) + " bytes)");
  }
  maximum = opt.maximum_bytes != 0 ? std::min(opt.maximum_bytes, device_total) : device_total;
  if (opt.maximum_bytes != 0 && opt.maximum_bytes < page) {
    throw logic_error("gpumem::vmm_pool_resource: maximum_bytes (" + std::to_string(opt.maximum_bytes) +
                      ") is less than one page (" + std::to_string(page) + " bytes)");
  }
  if (opt.segment_bytes > (std::size_t{1} << 50)) {  // past any address space; its rounding would overflow
    throw logic_error("gpumem::vmm_pool_resource: segment_bytes (" + std::to_string(opt.segment_bytes) +
                      ") is larger than 1 PiB (2^50 bytes)");
  }
  if (opt.idle_stream_ms == 0 || opt.idle_stream_ms > 3'600'000) {
    throw logic_error("gpumem::vmm_pool_resource: idle_stream_ms (" + std::to_string(opt.idle_stream_ms) +
                      ") must be 1 to 3600000 (an hour)");
  }
  idle_ns = std::int64_t{opt.idle_stream_ms} * 1'000'000;
  segment_bytes = vm::round_up(opt.segment_bytes != 0 ? opt.segment_bytes : device_total, page);
}

vmm_pool_resource::impl::~impl() { release_everything(); }

void vmm_pool_resource::impl::release_everything() noexcept {
  try {
    std::size_t live_count = 0;
    std::size_t live_bytes = 0;
    for (auto& [key, a] : pool.arenas) {
      live_count += a->live.size() - a->quick.count() - a->slots.count();
      live_bytes += a->used_bytes;
    }
    if (live_count != 0) {
      detail::diagnosef(diagnostic_level::warning, "gpumem: vmm_pool_resource on device %d destroyed with %zu live allocation(s), %zu bytes\n",
                   pool.device, live_count, live_bytes);
    }
    // Every free must be complete before anything is unmapped.
    detail::device_context_guard guard(pool.device);
    GPUMEM_CU(cuCtxSynchronize);
    // Every mapping goes (primary places and aliases), then every handle once.
    for (auto& [base, c] : pool.chunks) {
      chunk& k = *c;
      k.for_each_where(0, k.pages.size(), [&](std::size_t w) { return k.mapped[w]; }, [&](std::size_t i) {
        vm::unmap(pool.device, k.base + i * page, page);
        k.set_page(i, 0);
        return true;
      });
      vm::free_addresses(pool.device, k.base, k.size);
    }
    for (const auto& [handle, home] : homes) vm::release(pool.device, handle);
    homes.clear();
  } catch (const std::exception& e) {
    detail::diagnosef(diagnostic_level::error, "gpumem: vmm_pool_resource: giving memory back failed: %s\n", e.what());
  }
}

// ---------------------------------------------------------------------------

vmm_pool_resource::vmm_pool_resource(int device, vmm_pool_options options)
    : impl_(std::make_unique<impl>(device, std::move(options))) {}

vmm_pool_resource::~vmm_pool_resource() = default;

void* vmm_pool_resource::do_allocate(std::size_t bytes, stream_view stream, std::size_t alignment) {
  return impl_->pool.allocate(bytes, stream, alignment);
}

void vmm_pool_resource::do_deallocate(void* ptr, std::size_t bytes, stream_view stream, std::size_t /*alignment*/) {
  impl_->pool.deallocate(ptr, bytes, stream);
}

void* vmm_pool_resource::do_try_allocate_now(std::size_t bytes, stream_view stream, std::size_t alignment) {
  return impl_->pool.try_allocate_now(bytes, stream, alignment);
}

bool vmm_pool_resource::do_try_deallocate_now(void* ptr, std::size_t bytes, stream_view stream, std::size_t /*alignment*/) {
  return impl_->pool.try_deallocate_now(ptr, bytes, stream);
}

std::size_t vmm_pool_resource::trim() {
  impl_->pool.take_back_from_graphs();
  std::size_t released = 0;
  {
    std::lock_guard growing(impl_->pool.growth_mutex);
    released = impl_->give_back(false);
  }
  impl_->pool.request_fences();  // so that a later trim() finds what was freed before this one
  return released;
}

std::size_t vmm_pool_resource::trim(stream_view stream) {
  impl_->pool.take_back_from_graphs();
  detail::arena& a = impl_->pool.arena_for(stream, "trim");
  {
    std::lock_guard lock(a.lock);
    impl_->pool.record_fence(a);
  }
  std::lock_guard growing(impl_->pool.growth_mutex);
  return impl_->give_back(false);
}

std::size_t vmm_pool_resource::release() {
  impl_->pool.take_back_from_graphs();
  std::lock_guard growing(impl_->pool.growth_mutex);
  const bool synchronized = impl_->pool.synchronize_and_fence_everything();
  return impl_->give_back(synchronized);
}

std::vector<vmm_pool_resource::physical_piece> vmm_pool_resource::physical_pieces(const void* ptr,
                                                                                  std::size_t bytes) const {
  const impl& m = *impl_;
  const auto at = reinterpret_cast<std::uintptr_t>(ptr);
  auto refuse = [&] {
    return logic_error("gpumem::vmm_pool_resource::physical_pieces: " + detail::pointer_text(ptr) + " (" +
                       std::to_string(bytes) + " bytes) is not within a live allocation of this pool");
  };
  detail::chunk* c = m.pool.chunk_of(at);
  if (c == nullptr || bytes == 0) throw refuse();
  detail::arena& a = *c->owner;
  std::lock_guard lock(a.lock);
  const detail::block* b = a.live.find(at);
  if (b == nullptr || b->cached || bytes > b->requested_bytes) throw refuse();
  std::vector<physical_piece> out;
  const std::uintptr_t first = at / m.page * m.page;
  for (std::uintptr_t p = first; p < at + bytes; p += m.page) out.push_back({p, m.page});
  return out;
}

void vmm_pool_resource::reset_peak() { impl_->pool.reset_peak_reserved(); }

vmm_pool_statistics vmm_pool_resource::statistics() const {
  impl& m = *impl_;
  std::lock_guard growing(m.pool.growth_mutex);  // no page moves, is made or goes (a swap keeps each arena's count)
  const detail::pool_totals t = m.pool.collect();
  std::size_t revived = 0;
  {
    std::shared_lock lock(m.pool.arenas_mutex);
    for (auto& [key, a] : m.pool.arenas) {
      std::lock_guard g(a->lock);
      revived += a->pages_revived;
    }
  }
  // Counted over the handles, not over the segments' pages, which run to the
  // device's memory per segment; a swap (no growth mutex) keeps each handle's count.
  std::size_t alias_pages = 0;
  for (const auto& [handle, home] : m.homes) alias_pages += home.aliases();
  vmm_pool_statistics s;
  s.used_bytes = t.used_bytes;
  s.mapped_bytes = m.pool.reserved_bytes.load();
  s.peak_mapped_bytes = std::max(m.pool.peak_reserved_bytes.load(), s.mapped_bytes);
  s.free_bytes = t.free_bytes;
  s.address_bytes = m.address_bytes.load();
  s.largest_free_block = t.largest_free_block;
  s.allocations = t.allocations;
  s.pages = s.mapped_bytes / m.page;
  s.pages_created = m.pages_created.load();
  s.pages_moved = m.pages_moved.load();
  s.pages_revived = revived;
  s.pages_released = m.pages_released.load();
  s.alias_pages = alias_pages;
  s.streams = t.streams;
  return s;
}

const vmm_pool_options& vmm_pool_resource::options() const noexcept { return impl_->opt; }

std::size_t vmm_pool_resource::page_bytes() const noexcept { return impl_->page; }

resource_properties vmm_pool_resource::properties() const noexcept {
  return resource_properties{.device = impl_->pool.device, .device_accessible = true, .host_accessible = false,
                             .thread_safe = true};
}


std::optional<std::size_t> vmm_pool_resource::available_bytes() const {
  const vmm_pool_statistics st = statistics();
  return device_memory_info(impl_->pool.device).free_bytes + (st.mapped_bytes - std::min(st.used_bytes, st.mapped_bytes));
}

std::size_t vmm_pool_resource::release_free_memory() { return release(); }

ipc_export_route vmm_pool_resource::ipc_route(const void* ptr, std::size_t bytes) const {
  ipc_export_route route;
  if (!impl_->opt.posix_fd_shareable) {
    route.how = ipc_export_route::way::refused;
    route.refusal = "this vmm_pool_resource's memory is not shareable; construct it with "
                    "vmm_pool_options::posix_fd_shareable = true";
    return route;
  }
  route.how = ipc_export_route::way::pages;
  route.device = impl_->pool.device;
  for (const physical_piece& piece : physical_pieces(ptr, bytes)) route.pieces.emplace_back(piece.address, piece.bytes);
  return route;
}

}  // namespace gpumem
