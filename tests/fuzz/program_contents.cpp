// program_contents (program_contents.hpp).
#include "fuzz/program_contents.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "driver/driver.hpp"
#include "gpumem/copy.hpp"

namespace gpumem::test {
namespace {

constexpr std::size_t stamp_bytes = sizeof(std::uint64_t);
constexpr std::size_t staging_words = std::size_t{1} << 17;  // 1 MiB

std::uint64_t stamp_value(std::uint64_t number, std::size_t index) { return number << 24 | index; }

// Queues a sleep of `hold_us` on `s`: the device busy for that long, as far as
// stream order can tell.
void hold(stream_view s, unsigned hold_us) {
  if (hold_us == 0) return;
  GPUMEM_CU(cuLaunchHostFunc, s.handle(),
            [](void* us) {
              std::this_thread::sleep_for(std::chrono::microseconds(reinterpret_cast<std::uintptr_t>(us)));
            },
            reinterpret_cast<void*>(static_cast<std::uintptr_t>(hold_us)));
}

}  // namespace

program_contents::program_contents(std::size_t page_bytes, std::vector<stream_view> streams)
    : page_bytes_(page_bytes), streams_(std::move(streams)), pinned_(pinned_options{}, 0) {
  staging_ = static_cast<std::uint64_t*>(pinned_.allocate_sync(staging_words * stamp_bytes));
}

program_contents::~program_contents() {
  for (stream_view s : streams_) (void)detail::driver().cuStreamSynchronize(s.handle());
  pinned_.deallocate_sync(staging_, staging_words * stamp_bytes);
}

std::vector<program_contents::stamp_at> program_contents::places_of(std::uintptr_t address,
                                                                    std::size_t bytes) const {
  std::vector<stamp_at> places;
  auto add = [&](std::size_t offset) {
    const std::size_t end = places.empty() ? 0 : places.back().offset + places.back().bytes;
    if ((!places.empty() && offset < end) || offset >= bytes) return;
    places.push_back({offset, std::min(stamp_bytes, bytes - offset)});
  };
  add(0);
  const std::size_t first_page = (address + page_bytes_ - 1) / page_bytes_ * page_bytes_ - address;
  for (std::size_t offset = first_page; offset < bytes; offset += page_bytes_) add(offset);
  if (bytes >= stamp_bytes) add(bytes - stamp_bytes);
  return places;
}

std::uint64_t* program_contents::staging(std::size_t n) {
  if (staged_ + n > staging_words) {
    if (std::string f = finish_queued(); failure_.empty()) failure_ = std::move(f);
  }
  std::uint64_t* words = staging_ + staged_;
  staged_ += n;
  return words;
}

void program_contents::stamp(void* p, std::size_t bytes, stream_view s) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  stamped a{next_number_++, s, places_of(address, bytes)};
  std::uint64_t* words = staging(a.places.size());
  for (std::size_t i = 0; i < a.places.size(); ++i) {
    words[i] = stamp_value(a.number, i);
    copy(static_cast<char*>(p) + a.places[i].offset, &words[i], a.places[i].bytes, s);
  }
  live_[address] = std::move(a);
}

void program_contents::read_before_free(void* p, stream_view t, unsigned hold_us) {
  auto it = live_.find(reinterpret_cast<std::uintptr_t>(p));
  stamped a = std::move(it->second);
  live_.erase(it);
  if (a.stream != t) {
    order_.record(a.stream);
    t.wait(order_);
  }
  hold(t, hold_us);
  std::uint64_t* words = staging(a.places.size());
  for (std::size_t i = 0; i < a.places.size(); ++i) {
    words[i] = 0;
    copy(&words[i], static_cast<const char*>(p) + a.places[i].offset, a.places[i].bytes, t);
  }
  reads_.push_back({std::move(a), words});
}

std::string program_contents::finish_queued() {
  for (stream_view s : streams_) s.synchronize();
  std::string failure;
  for (const queued_read& r : reads_) {
    const stamped& a = r.allocation;
    for (std::size_t i = 0; i < a.places.size() && failure.empty(); ++i) {
      const std::uint64_t want = stamp_value(a.number, i);
      if (std::memcmp(&r.read[i], &want, a.places[i].bytes) == 0) continue;
      std::uint64_t found = 0;
      std::memcpy(&found, &r.read[i], a.places[i].bytes);
      failure = "the memory's contents: allocation " + std::to_string(a.number) + " at offset " +
                std::to_string(a.places[i].offset) + " holds stamp " + std::to_string(found >> 24) + "/" +
                std::to_string(found & 0xffffff) + " instead of its own (" + std::to_string(a.number) + "/" +
                std::to_string(i) + "): another allocation wrote to its memory";
    }
  }
  reads_.clear();
  staged_ = 0;
  return failure;
}

std::string program_contents::check() {
  // The live allocations' reads, queued on their own streams (after their stamps).
  for (auto& [address, a] : live_) {
    std::uint64_t* words = staging(a.places.size());
    for (std::size_t i = 0; i < a.places.size(); ++i) {
      words[i] = 0;
      copy(&words[i], reinterpret_cast<const char*>(address) + a.places[i].offset, a.places[i].bytes, a.stream);
    }
    reads_.push_back({a, words});
  }
  if (std::string f = finish_queued(); failure_.empty()) failure_ = std::move(f);
  return std::exchange(failure_, {});
}

}  // namespace gpumem::test
