// What the pool programs (pool_program.cpp, vmm_pool_program.cpp,
// vmm_pool_threads_program.cpp) share: the byte string read as a program, a live
// allocation of the model, and the streams the programs run on.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "gpumem/stream.hpp"

namespace gpumem::test {

class program_reader {
 public:
  program_reader(const std::uint8_t* d, std::size_t n) : d_(d), n_(n) {}
  bool empty() const { return i_ >= n_; }
  std::uint8_t byte() { return i_ < n_ ? d_[i_++] : 0; }
  std::uint32_t u16() { return static_cast<std::uint32_t>(byte()) << 8 | byte(); }

 private:
  const std::uint8_t* d_;
  std::size_t n_;
  std::size_t i_ = 0;
};

struct program_allocation {
  void* ptr;
  std::size_t bytes;
  std::size_t alignment;
};

// The model's live allocations by address, and their addresses in the order made.
struct program_model {
  std::map<std::uintptr_t, program_allocation> live;
  std::vector<std::uintptr_t> order;

  // Records an allocation the pool handed out; what is wrong with it, or empty.
  std::string add(void* p, std::size_t bytes, std::size_t alignment) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    if (a % alignment != 0) return "misaligned allocation";
    auto next = live.lower_bound(a);
    if (next != live.end() && a + bytes > next->first) return "overlaps the next allocation";
    if (next != live.begin() && std::prev(next)->first + std::prev(next)->second.bytes > a) {
      return "overlaps the previous allocation";
    }
    live.emplace(a, program_allocation{p, bytes, alignment});
    order.push_back(a);
    return {};
  }
};

// Six streams, made once (sim streams are threads): the programs of one thread
// run on the first three, those on threads on two each.
inline std::array<stream, 6>& program_streams() {
  static std::array<stream, 6> s{stream(0), stream(0), stream(0), stream(0), stream(0), stream(0)};
  return s;
}

}  // namespace gpumem::test
