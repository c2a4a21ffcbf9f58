// run_vmm_pool_threads_program (vmm_pool_threads_program.hpp).
#include "fuzz/vmm_pool_threads_program.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "fuzz/program_contents.hpp"
#include "fuzz/program_input.hpp"
#include "fuzz/vmm_program_checks.hpp"
#include "gpumem/error.hpp"
#include "gpumem/stream.hpp"
#include "gpumem/vmm/virtual_memory.hpp"
#include "gpumem/vmm_pool_resource.hpp"
#include "pool/pool_inspector.hpp"

namespace gpumem::test {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr int max_threads = 3;  // two streams each: program_streams() has six

// What the threads share: the pool, and the pages the live allocations of every
// thread can pin (each allocation's whole pages and one it may share), counted
// before an allocation is asked for and after its free returns, so that the
// count is never below what the pool must hold.
struct shared_state {
  vmm_pool_resource& pool;
  std::size_t page;
  std::size_t capacity_pages;
  std::atomic<std::size_t> pinned_pages{0};
  std::atomic<std::uint64_t> allocations_begun{0};
};

struct thread_program {
  const std::uint8_t* data;
  std::size_t size;
  std::array<stream_view, 2> streams;
  std::unique_ptr<program_contents> contents;
  std::string failure;
};

// One thread's part. Note [Failing with room, on threads]: an allocation that
// fails is wrong only if the pinned pages, counted when it began, fit the
// capacity and no other thread began an allocation meanwhile (frees meanwhile
// only lower the count, so the count at the start was the most the pool was asked
// to hold). Otherwise the failure may be another thread's doing, and is allowed.
void run_thread(shared_state& sh, thread_program& t) {
  program_reader in(t.data, t.size);
  vmm_pool_resource& pool = sh.pool;
  struct live_allocation {
    void* ptr;
    std::size_t bytes;
    std::size_t alignment;
  };
  std::vector<live_allocation> live;
  auto free_one = [&](std::size_t k, stream_view s, unsigned hold_us) {
    const live_allocation a = live[k];
    t.contents->read_before_free(a.ptr, s, hold_us);
    pool.deallocate(a.ptr, a.bytes, s, a.alignment);
    sh.pinned_pages -= pages_pinned(a.bytes, a.alignment, sh.page);
    live[k] = live.back();
    live.pop_back();
  };
  for (int step = 0; !in.empty() && step < 200 && t.failure.empty(); ++step) {
    const std::uint8_t op = in.byte() % 8;
    stream_view s = t.streams[in.byte() % 2];
    if (op <= 2) {  // allocate: a few bytes to 64 MiB
      const std::size_t bytes = 1 + (static_cast<std::size_t>(in.u16()) << (in.byte() % 11));
      const std::size_t alignment = std::size_t{256} << (in.byte() % 4 == 0 ? in.byte() % 6 : 0);
      const std::size_t pinned = pages_pinned(bytes, alignment, sh.page);
      const std::size_t pinned_before = (sh.pinned_pages += pinned);
      const std::uint64_t begun = ++sh.allocations_begun;
      void* p = nullptr;
      try {
        p = pool.allocate(bytes, s, alignment);
      } catch (const out_of_memory& e) {
        sh.pinned_pages -= pinned;
        if (sh.allocations_begun.load() == begun && pinned_before <= sh.capacity_pages) {
          t.failure = "an allocation of " + std::to_string(bytes) + " bytes failed with room for it: " + e.what();
        }
        continue;
      }
      for (const live_allocation& a : live) {
        const auto x = reinterpret_cast<std::uintptr_t>(p), y = reinterpret_cast<std::uintptr_t>(a.ptr);
        if (x < y + a.bytes && y < x + bytes) t.failure = "an allocation overlaps one the same thread holds";
      }
      if (reinterpret_cast<std::uintptr_t>(p) % alignment != 0) t.failure = "misaligned allocation";
      t.contents->stamp(p, bytes, s);
      live.push_back({p, bytes, alignment});
    } else if (op <= 5 && !live.empty()) {  // free, on either of the thread's streams
      free_one(in.u16() % live.size(), s, in.byte() % 4 == 0 ? 2U * in.byte() : 0U);
    } else if (op == 6) {  // a trim of this stream, or of every stream
      const std::size_t given_back = (in.byte() & 1U) ? pool.trim(s) : pool.trim();
      (void)given_back;
    } else {
      const vmm_pool_statistics st = pool.statistics();
      if (st.mapped_bytes > pool.options().maximum_bytes) t.failure = "the pool holds more than maximum_bytes";
      if (std::string v = t.contents->check(); !v.empty()) t.failure = v;
      if (in.byte() % 8 == 0) pool.release();
    }
  }
  while (!live.empty()) free_one(live.size() - 1, t.streams[0], 0);
  if (std::string v = t.contents->check(); !v.empty() && t.failure.empty()) t.failure = v;
}

}  // namespace

std::string run_vmm_pool_threads_program(const std::uint8_t* data, std::size_t size) {
  program_reader in(data, size);
  vmm_pool_options o;
  const std::size_t granule = vmm::granularity(0);
  o.page_bytes = granule << (in.byte() % 2);
  o.maximum_bytes = (128 * MiB) << (in.byte() % 3);  // small: the threads must share pages
  if (in.byte() % 2 == 0) o.segment_bytes = (64 * MiB) << (in.byte() % 4);
  if (in.byte() % 2 == 0) o.idle_stream_ms = 1 + in.byte() % 4;  // streams found idle, their pages taken
  if (in.byte() % 2 == 0) o.fence_interval = 1 + in.byte() % 32;
  o.quick_cache = in.byte() % 4 != 0;
  const int threads = 2 + in.byte() % (max_threads - 1);
  std::vector<thread_program> parts(static_cast<std::size_t>(threads));
  const std::size_t header = 7, part = (size > header ? size - header : 0) / static_cast<std::size_t>(threads);
  for (int i = 0; i < threads; ++i) {
    thread_program& t = parts[static_cast<std::size_t>(i)];
    t.data = data + header + part * static_cast<std::size_t>(i);
    t.size = part;
    t.streams = {program_streams()[2 * i], program_streams()[2 * i + 1]};
    t.contents = std::make_unique<program_contents>(o.page_bytes, std::vector<stream_view>{t.streams[0], t.streams[1]});
  }
  warm_streams(program_streams());
  const std::size_t device_free_before = device_free_bytes();
  {
    vmm_pool_resource pool(0, o);
    shared_state sh{pool, pool.page_bytes(), std::min(o.maximum_bytes, device_free_before) / pool.page_bytes()};
    std::vector<std::thread> running;
    for (thread_program& t : parts) running.emplace_back([&sh, &t] { run_thread(sh, t); });
    for (std::thread& r : running) r.join();
    for (std::size_t i = 0; i < parts.size(); ++i) {
      if (!parts[i].failure.empty()) return "thread " + std::to_string(i) + ": " + parts[i].failure;
    }
    if (std::string v = detail::pool_inspector::violations(pool); !v.empty()) return v;
    if (sh.pinned_pages.load() != 0) return "the model's count of pinned pages did not return to zero";
    if (std::string v = released_to_nothing(pool); !v.empty()) return v;
  }
  return device_memory_kept(device_free_before);
}

}  // namespace gpumem::test
