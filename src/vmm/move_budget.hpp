// vmm_pool_resource: the time budget for moves (Note [A time budget for moves],
// page_backing.cpp), as a pure function so that it is tested on its own.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace gpumem::detail {

// The extra slack after a window of `elapsed_ns` in which `moves` pages moved at
// `ns_per_page` each, the peak in use being `peak`: one step (peak / 16) more when
// the moves cost over 1% of the window, up to peak / 4 of slack in all with the
// base 1/16; one step less when they cost under 0.1%.
inline std::size_t budgeted_slack(std::size_t extra, std::size_t peak, std::size_t moves, std::int64_t ns_per_page,
                                  std::int64_t elapsed_ns) {
  const std::int64_t cost = static_cast<std::int64_t>(moves) * ns_per_page;
  const std::size_t step = peak / 16;
  if (cost * 100 > elapsed_ns) return std::min(extra + step, peak / 4 - peak / 16);
  if (cost * 1000 < elapsed_ns) return extra - std::min(extra, step);
  return extra;
}

}  // namespace gpumem::detail
