// libFuzzer target: IPC handle bytes (ipc_handle::deserialize). Whatever the bytes,
// deserialize gives a handle or ipc_error(malformed_handle), and a handle it
// gives is consistent and survives serialize/deserialize. Built by scripts/fuzz.
//
// An input whose first byte is odd is framed first (magic, version, length and
// checksum made right, as anyone can: the checksum finds damage, not forgery), so
// the fuzzer reaches the fields behind the frame instead of stopping at it; one
// whose two low bits are set is read as field values and laid out as a handle of
// a plausible shape first (the counts agreeing with the length), so the fuzzer
// reaches the checks of the fields themselves.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "gpumem/error.hpp"
#include "gpumem/ipc.hpp"

namespace {

constexpr std::size_t header_bytes = 64;  // the layout in src/ipc/ipc_handle.cpp
constexpr std::size_t trailer_bytes = 8;

std::uint64_t fnv1a(const std::byte* p, std::size_t n) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < n; ++i) {
    h ^= static_cast<std::uint64_t>(p[i]);
    h *= 0x100000001b3ull;
  }
  return h;
}

void frame(std::vector<std::byte>& b) {
  std::memcpy(b.data(), "GPUMIPC1", 8);
  const std::uint16_t version = 1;
  std::memcpy(b.data() + 8, &version, sizeof version);
  const auto total = static_cast<std::uint32_t>(b.size());
  std::memcpy(b.data() + 12, &total, sizeof total);
  const std::uint64_t sum = fnv1a(b.data(), b.size() - trailer_bytes);
  std::memcpy(b.data() + b.size() - trailer_bytes, &sum, sizeof sum);
}

// The fuzzer's bytes as field values, zeros once they run out.
class fields {
 public:
  fields(const unsigned char* p, std::size_t n) : p_(p), n_(n) {}
  template <class T>
  T next() {
    T v{};
    const std::size_t k = std::min(sizeof v, n_ - at_);
    std::memcpy(&v, p_ + at_, k);
    at_ += k;
    return v;
  }

 private:
  const unsigned char* p_;
  std::size_t n_, at_ = 0;
};

template <class T>
void put(std::vector<std::byte>& b, T v) {
  const auto* p = reinterpret_cast<const std::byte*>(&v);
  b.insert(b.end(), p, p + sizeof v);
}

std::vector<std::byte> shaped(const unsigned char* data, std::size_t size) {
  fields f(data + 1, size - 1);
  const auto kind = static_cast<std::uint8_t>(f.next<std::uint8_t>() % 4);  // 0: not a kind
  const auto shape = f.next<std::uint8_t>();
  std::vector<std::byte> b(12);  // magic, version, kind, reserved: framed below
  b[10] = std::byte{kind};
  put<std::uint32_t>(b, 0);  // total length: framed below
  put(b, f.next<std::int32_t>());   // pid
  put(b, f.next<std::int32_t>());   // device
  put(b, f.next<std::uint64_t>());  // size
  put(b, f.next<std::uint64_t>());  // offset
  for (int i = 0; i < 16; ++i) put(b, f.next<std::uint8_t>());  // uuid
  const std::uint32_t driver_count = (shape & 1) != 0 ? shape % 80 : (kind == 3 ? 0 : 64);
  const std::uint32_t piece_count = (shape & 2) != 0 ? (shape >> 2) % 6 : (kind == 1 ? 0 : kind == 2 ? 1 : 1 + (shape >> 2) % 4);
  put(b, driver_count);
  put(b, piece_count);
  for (std::uint32_t i = 0; i < driver_count; ++i) put(b, f.next<std::uint8_t>());
  for (std::uint32_t i = 0; i < piece_count; ++i) {
    put(b, f.next<std::uint64_t>());  // bytes
    put(b, f.next<std::int32_t>());   // descriptor number
    put<std::uint32_t>(b, 0);
  }
  put<std::uint64_t>(b, 0);  // trailer: framed below
  return b;
}

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "ipc_handle invariant broken: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  std::vector<std::byte> bytes;
  if (size >= 2 && (data[0] & 3) == 3) {
    bytes = shaped(data, size);
    frame(bytes);
  } else {
    bytes.assign(reinterpret_cast<const std::byte*>(data), reinterpret_cast<const std::byte*>(data) + size);
    if (size >= header_bytes + trailer_bytes && (data[0] & 1) != 0) frame(bytes);
  }
  gpumem::ipc_handle h;
  try {
    h = gpumem::ipc_handle::deserialize(std::span<const std::byte>(bytes));
  } catch (const gpumem::ipc_error& e) {
    if (e.code() != gpumem::ipc_errc::malformed_handle) broken("an error other than malformed_handle");
    return 0;
  }
  if (h.size() == 0 || h.exporter_pid() <= 0) broken("a zero size or a non-positive pid accepted");
  const std::vector<std::byte> again = h.serialize();
  const gpumem::ipc_handle h2 = gpumem::ipc_handle::deserialize(std::span<const std::byte>(again));
  if (h2.size() != h.size() || h2.kind() != h.kind() || h2.device() != h.device() || h2.exporter_pid() != h.exporter_pid() ||
      h2.descriptor_count() != h.descriptor_count()) {
    broken("serialize/deserialize changed the handle");
  }
  return 0;
}
