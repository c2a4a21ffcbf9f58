// The engine's layout (Note [Fields that threads write apart from what the hot
// path reads], src/pool/stream_ordered_pool.hpp): no 128-byte line pair holds
// both a field that every call reads and a lock or counter that threads write.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "pool/stream_ordered_pool.hpp"

namespace gpumem::test {
namespace {

struct field {
  std::string name;
  std::uintptr_t first = 0;  // the first and last 128-byte line pair it touches
  std::uintptr_t last = 0;
};

template <class T>
field span_of(const char* name, const T& member) {
  const auto at = reinterpret_cast<std::uintptr_t>(&member);
  return {name, at / 128, (at + sizeof(T) - 1) / 128};
}

TEST(PoolLayout, WhatEveryCallReadsSharesNoLinePairWithWhatThreadsWrite) {
  // Where the members of a pool at this address would lie: the layout alone (the
  // engine is the library's own, not exported to construct here).
  alignas(detail::stream_ordered_pool) static unsigned char storage[sizeof(detail::stream_ordered_pool)];
  const auto& pool = *reinterpret_cast<const detail::stream_ordered_pool*>(storage);
  const std::vector<field> read = {
      span_of("name", pool.name),         span_of("device", pool.device),
      span_of("settings", pool.settings), span_of("id", pool.id),
      span_of("backing", pool.backing),   span_of("watched", pool.watched),
      span_of("periodic_fences", pool.periodic_fences), span_of("page_shift", pool.page_shift),
      span_of("several_streams", pool.several_streams),
  };
  const std::vector<field> written = {
      span_of("arenas_mutex", pool.arenas_mutex),     span_of("chunks_mutex", pool.chunks_mutex),
      span_of("reserved_bytes", pool.reserved_bytes), span_of("peak_reserved_bytes", pool.peak_reserved_bytes),
      span_of("growth_mutex", pool.growth_mutex),     span_of("maintenance_mutex", pool.maintenance_mutex),
  };
  for (const field& r : read) {
    for (const field& w : written) {
      EXPECT_TRUE(r.last < w.first || w.last < r.first) << r.name << " shares a 128-byte line pair with " << w.name;
    }
  }
}

}  // namespace
}  // namespace gpumem::test
