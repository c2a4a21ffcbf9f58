// pool_resource's state: the stream-ordering engine (stream_ordered_pool.hpp)
// over chunks of an upstream resource. This is the engine's backing for it
// (pool_reclaim.cpp): growing from the upstream, taking other streams' whole free
// chunks or lending their blocks, and giving fully free chunks back.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "gpumem/pool_resource.hpp"
#include "pool/stream_ordered_pool.hpp"

namespace gpumem {

struct pool_resource::impl final : detail::pool_backing {
  static constexpr std::size_t granule = detail::stream_ordered_pool::granule;

  impl(memory_resource& up, std::shared_ptr<memory_resource> owned, pool_options opt);
  ~impl() override;

  // ---- the backing (pool_reclaim.cpp) ----
  // When memory is not short, taking is opportunistic and whole chunks only (see
  // take_from_other_arenas there); when it is, fenced blocks are lent too.
  void* take_from_others(detail::arena& a, const detail::pool_request& r, bool memory_short) override;
  bool grow(detail::arena& a, std::size_t need, bool memory_short) override;
  std::size_t give_back(bool device_synchronized) override;
  std::string shortage(std::size_t requested) override;

  memory_resource* upstream;
  std::shared_ptr<memory_resource> owned_upstream;
  pool_options opt;
  detail::stream_ordered_pool pool;
};

}  // namespace gpumem
