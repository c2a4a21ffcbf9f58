// ipc_handle: ownership of its descriptors, and its byte form (docs/ipc.md, "The bytes").
#include <unistd.h>

#include <cstring>
#include <string>
#include <utility>

#include "ipc/ipc_access.hpp"

namespace gpumem {
namespace {

// Layout, native byte order (handles travel between processes of one machine):
//   header   magic "GPUMIPC1" | u16 version | u8 kind | u8 reserved | u32 total length
//            i32 pid | i32 device | u64 size | u64 offset | 16 bytes device UUID
//            u32 driver byte count (0 or 64) | u32 piece count (at most max_pieces)
//   driver bytes, then per piece: u64 bytes | i32 descriptor number in the exporter | u32 0
//   trailer  u64 FNV-1a of everything before it
constexpr char magic[8] = {'G', 'P', 'U', 'M', 'I', 'P', 'C', '1'};
constexpr std::uint16_t version = 1;
constexpr std::size_t header_bytes = 8 + 2 + 1 + 1 + 4 + 4 + 4 + 8 + 8 + 16 + 4 + 4;
constexpr std::size_t piece_bytes = 16;
constexpr std::size_t trailer_bytes = 8;
constexpr std::size_t max_driver_bytes = 64;
constexpr std::uint32_t max_pieces = 1u << 16;

std::uint64_t fnv1a(const std::byte* p, std::size_t n) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < n; ++i) {
    h ^= static_cast<std::uint64_t>(p[i]);
    h *= 0x100000001b3ull;
  }
  return h;
}

class writer {
 public:
  explicit writer(std::vector<std::byte>& out) : out_(out) {}
  template <class T>
  void put(const T& v) {
    put_bytes(&v, sizeof(T));
  }
  // resize + memcpy rather than insert of a byte range: g++ 12 warns
  // (-Wstringop-overflow) about the inlined insert, wrongly.
  void put_bytes(const void* p, std::size_t n) {
    if (n == 0) return;
    const std::size_t at = out_.size();
    out_.resize(at + n);
    std::memcpy(out_.data() + at, p, n);
  }

 private:
  std::vector<std::byte>& out_;
};

[[noreturn]] void malformed(const std::string& why) {
  detail::throw_ipc(ipc_errc::malformed_handle, "gpumem::ipc_handle::deserialize: " + why);
}

class reader {
 public:
  explicit reader(std::span<const std::byte> in) : in_(in) {}
  template <class T>
  T get() {
    T v{};
    get_bytes(&v, sizeof(T));
    return v;
  }
  void get_bytes(void* p, std::size_t n) {
    if (n == 0) return;  // p may be an empty vector's null data()
    if (n > in_.size() - at_) malformed("the bytes end early (truncated)");
    std::memcpy(p, in_.data() + at_, n);
    at_ += n;
  }

 private:
  std::span<const std::byte> in_;
  std::size_t at_ = 0;
};

}  // namespace

ipc_handle::~ipc_handle() { close_descriptors(); }

ipc_handle::ipc_handle(ipc_handle&& other) noexcept
    : kind_(other.kind_),
      size_(other.size_),
      offset_(other.offset_),
      device_(other.device_),
      uuid_(other.uuid_),
      pid_(other.pid_),
      driver_bytes_(std::move(other.driver_bytes_)),
      pieces_(std::move(other.pieces_)) {
  other.pieces_.clear();
}

ipc_handle& ipc_handle::operator=(ipc_handle&& other) noexcept {
  if (this != &other) {
    close_descriptors();
    kind_ = other.kind_;
    size_ = other.size_;
    offset_ = other.offset_;
    device_ = other.device_;
    uuid_ = other.uuid_;
    pid_ = other.pid_;
    driver_bytes_ = std::move(other.driver_bytes_);
    pieces_ = std::move(other.pieces_);
    other.pieces_.clear();
  }
  return *this;
}

void ipc_handle::close_descriptors() noexcept {
  for (piece& p : pieces_) {
    if (p.fd >= 0) ::close(p.fd);
    p.fd = -1;
  }
}

std::vector<int> ipc_handle::descriptors() const {
  std::vector<int> out;
  out.reserve(pieces_.size());
  for (const piece& p : pieces_) out.push_back(p.fd);
  return out;
}

std::vector<std::byte> ipc_handle::serialize() const {
  std::vector<std::byte> out;
  out.reserve(header_bytes + driver_bytes_.size() + pieces_.size() * piece_bytes + trailer_bytes);
  writer w(out);
  w.put_bytes(magic, sizeof magic);
  w.put(version);
  w.put(static_cast<std::uint8_t>(kind_));
  w.put(std::uint8_t{0});
  const auto total =
      static_cast<std::uint32_t>(header_bytes + driver_bytes_.size() + pieces_.size() * piece_bytes + trailer_bytes);
  w.put(total);
  w.put(static_cast<std::int32_t>(pid_));
  w.put(static_cast<std::int32_t>(device_));
  w.put(static_cast<std::uint64_t>(size_));
  w.put(static_cast<std::uint64_t>(offset_));
  w.put_bytes(uuid_.data(), uuid_.size());
  w.put(static_cast<std::uint32_t>(driver_bytes_.size()));
  w.put(static_cast<std::uint32_t>(pieces_.size()));
  w.put_bytes(driver_bytes_.data(), driver_bytes_.size());
  for (const piece& p : pieces_) {
    w.put(static_cast<std::uint64_t>(p.bytes));
    w.put(static_cast<std::int32_t>(p.remote_fd));
    w.put(std::uint32_t{0});
  }
  w.put(fnv1a(out.data(), out.size()));
  return out;
}

ipc_handle ipc_handle::deserialize(std::span<const std::byte> bytes) {
  if (bytes.size() < header_bytes + trailer_bytes) {
    malformed("got " + std::to_string(bytes.size()) + " bytes, fewer than any handle has (truncated?)");
  }
  if (std::memcmp(bytes.data(), magic, sizeof magic) != 0) malformed("not a gpumem IPC handle (wrong magic)");
  reader r(bytes.subspan(sizeof magic));
  const auto ver = r.get<std::uint16_t>();
  if (ver != version) {
    malformed("version " + std::to_string(ver) + ", this gpumem reads version " + std::to_string(version));
  }
  const auto kind = r.get<std::uint8_t>();
  r.get<std::uint8_t>();
  const auto total = r.get<std::uint32_t>();
  if (total != bytes.size()) {
    malformed("the handle says " + std::to_string(total) + " bytes, got " + std::to_string(bytes.size()) +
              (bytes.size() < total ? " (truncated)" : " (trailing bytes)"));
  }
  std::uint64_t sum = 0;
  std::memcpy(&sum, bytes.data() + bytes.size() - trailer_bytes, sizeof sum);
  if (sum != fnv1a(bytes.data(), bytes.size() - trailer_bytes)) malformed("checksum mismatch (damaged bytes: the checksum finds damage, not forgery)");
  if (kind < 1 || kind > 3) malformed("unknown kind " + std::to_string(kind));

  ipc_handle h;
  h.kind_ = static_cast<ipc_kind>(kind);
  h.pid_ = static_cast<pid_t>(r.get<std::int32_t>());
  h.device_ = r.get<std::int32_t>();
  h.size_ = static_cast<std::size_t>(r.get<std::uint64_t>());
  h.offset_ = static_cast<std::size_t>(r.get<std::uint64_t>());
  r.get_bytes(h.uuid_.data(), h.uuid_.size());
  const auto driver_count = r.get<std::uint32_t>();
  const auto piece_count = r.get<std::uint32_t>();
  if (driver_count > max_driver_bytes || piece_count > max_pieces) malformed("impossible counts");
  if (header_bytes + driver_count + std::size_t{piece_count} * piece_bytes + trailer_bytes != bytes.size()) {
    malformed("the counts do not match the length");
  }
  const bool shape_ok = (h.kind_ == ipc_kind::legacy && driver_count == 64 && piece_count == 0) ||
                        (h.kind_ == ipc_kind::pool && driver_count == 64 && piece_count == 1) ||
                        (h.kind_ == ipc_kind::vmm && driver_count == 0 && piece_count >= 1);
  if (!shape_ok || h.size_ == 0 || h.pid_ <= 0) malformed("fields inconsistent with the kind");
  h.driver_bytes_.resize(driver_count);
  r.get_bytes(h.driver_bytes_.data(), driver_count);
  std::size_t mapped = 0;
  for (std::uint32_t i = 0; i < piece_count; ++i) {
    piece p;
    p.bytes = static_cast<std::size_t>(r.get<std::uint64_t>());
    p.remote_fd = r.get<std::int32_t>();
    r.get<std::uint32_t>();
    if (p.remote_fd < 0) malformed("a negative descriptor number");
    if (h.kind_ == ipc_kind::vmm) {
      if (p.bytes == 0 || p.bytes > (std::size_t{1} << 48) || mapped > (std::size_t{1} << 56)) malformed("bad piece size");
      mapped += p.bytes;
    }
    h.pieces_.push_back(p);
  }
  if (h.kind_ == ipc_kind::vmm && (h.offset_ > mapped || h.size_ > mapped - h.offset_)) {
    malformed("offset and size lie outside the pieces");
  }
  return h;
}

ipc_handle ipc_handle::deserialize(std::span<const std::byte> bytes, std::span<const int> descriptors) {
  // The descriptors are ours from here on, whatever happens.
  auto close_all = [&] {
    for (int fd : descriptors) {
      if (fd >= 0) ::close(fd);
    }
  };
  ipc_handle h;
  try {
    h = deserialize(bytes);
  } catch (...) {
    close_all();
    throw;
  }
  if (descriptors.size() != h.pieces_.size()) {
    close_all();
    malformed("the handle needs " + std::to_string(h.pieces_.size()) + " descriptors, got " +
              std::to_string(descriptors.size()));
  }
  for (std::size_t i = 0; i < descriptors.size(); ++i) h.pieces_[i].fd = descriptors[i];
  return h;
}

}  // namespace gpumem
