// What the pool programs (pool_program.cpp, vmm_pool_program.cpp) share: the
// byte string read as a program, a live allocation of the model, and the three
// streams the programs run on.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

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

inline std::array<stream, 3>& program_streams() {
  static std::array<stream, 3> s{stream(0), stream(0), stream(0)};  // made once: sim streams are threads
  return s;
}

}  // namespace gpumem::test
