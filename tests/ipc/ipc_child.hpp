// The importing side of the multi-process IPC tests: the test binary re-executes itself
// with --gpumem-ipc-child (ipc_test_main.cpp), receives a handle over the inherited
// socket, checks what the parent wrote, writes its own pattern and reports back.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace gpumem_test {

// What the exporter writes, and what the importer writes back.
inline std::uint8_t parent_byte(std::size_t i) { return static_cast<std::uint8_t>(i * 7 + 1); }
inline std::uint8_t child_byte(std::size_t i) { return static_cast<std::uint8_t>(i * 13 + 5); }
using pattern_byte = std::uint8_t (*)(std::size_t);

// Note [Patterns a period at a time]
// Both patterns repeat every 256 bytes (i * k mod 256), so n bytes of one are its
// first period copied over and over, and a check compares a block at a time with
// memcmp. Byte by byte, the checks of the large IPC tests (600 MiB, in both
// processes) were most of their time under the sanitizers, which check every byte
// read one call at a time but a memcmp or memcpy as one range.
inline constexpr std::size_t pattern_period = 256;

inline std::vector<std::uint8_t> pattern(std::size_t n, pattern_byte byte) {
  std::vector<std::uint8_t> out(n);
  const std::size_t period = std::min(n, pattern_period);
  for (std::size_t i = 0; i < period; ++i) out[i] = byte(i);
  for (std::size_t done = period; done < n;) {
    const std::size_t len = std::min(done, n - done);
    std::memcpy(out.data() + done, out.data(), len);
    done += len;
  }
  return out;
}

// The first index of [host, host + n) that is not the pattern, or n.
inline std::size_t first_difference(const std::uint8_t* host, std::size_t n, pattern_byte byte) {
  constexpr std::size_t block = std::size_t{1} << 20;  // a multiple of the period
  const std::vector<std::uint8_t> expected = pattern(std::min(n, block), byte);
  for (std::size_t at = 0; at < n; at += block) {
    const std::size_t len = std::min(block, n - at);
    if (std::memcmp(host + at, expected.data(), len) == 0) continue;
    return at + static_cast<std::size_t>(std::mismatch(host + at, host + at + len, expected.data()).first - (host + at));
  }
  return n;
}

// How many bytes of [host, host + n) are not the pattern.
inline std::size_t count_differences(const std::uint8_t* host, std::size_t n, pattern_byte byte) {
  std::size_t count = 0;
  for (std::size_t at = first_difference(host, n, byte); at < n; ++at) count += host[at] != byte(at) ? 1 : 0;
  return count;
}

// Runs the child's side: argv after --gpumem-ipc-child is <mode> <socket fd>. Returns
// the exit status.
int run_ipc_child(int argc, char** argv);

}  // namespace gpumem_test
