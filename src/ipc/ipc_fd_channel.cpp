// ipc_fd_channel: bytes and file descriptors over a Unix-domain socket (SCM_RIGHTS).
#include "gpumem/ipc_fd_channel.hpp"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "gpumem/error.hpp"
#include "gpumem/ipc.hpp"

namespace gpumem {
namespace {

// Linux's limit on SCM_RIGHTS descriptors in one sendmsg; a message with more
// sends them in several (Note [Descriptors in chunks]).
constexpr std::size_t descriptors_per_call = 253;
constexpr std::size_t max_descriptors = 65536;  // a message's (the default pool's pages of 128 GiB)
constexpr std::uint64_t max_message_bytes = std::uint64_t{1} << 24;
constexpr char continuation = 'D';

[[noreturn]] void fail(const char* what, int error) {
  throw ipc_error(ipc_errc::descriptor_unavailable,
                  std::string("gpumem::ipc_fd_channel: ") + what + ": " + std::strerror(error));
}

void write_all(int fd, const void* data, std::size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("send", w < 0 ? errno : EPIPE);
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void read_all(int fd, void* data, std::size_t n) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) fail("recv", ECONNRESET);
    if (r < 0) fail("recv", errno);
    p += r;
    n -= static_cast<std::size_t>(r);
  }
}

struct message_header {
  std::uint64_t bytes;
  std::uint32_t descriptors;
  std::uint32_t reserved;
};

// One sendmsg of `data` carrying `descriptors` (at most descriptors_per_call);
// returns how much of `data` went.
std::size_t send_with_descriptors(int fd, const void* data, std::size_t n, std::span<const int> descriptors) {
  iovec iov{const_cast<void*>(data), n};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * descriptors_per_call)] = {};
  if (!descriptors.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * descriptors.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * descriptors.size());
    std::memcpy(CMSG_DATA(c), descriptors.data(), sizeof(int) * descriptors.size());
  }
  ssize_t sent = -1;
  do {
    sent = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent < 0) fail("sendmsg", errno);
  return static_cast<std::size_t>(sent);
}

// One recvmsg into `data` (up to n bytes), appending the descriptors that came
// with it to `out`; returns how many bytes came.
std::size_t receive_with_descriptors(int fd, void* data, std::size_t n, std::vector<int>& out) {
  iovec iov{data, n};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * descriptors_per_call)] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t got = -1;
  do {
    got = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  } while (got < 0 && errno == EINTR);
  if (got < 0) fail("recvmsg", errno);
  if (got == 0) fail("recvmsg", ECONNRESET);
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      const std::size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < k; ++i) {
        int received = -1;
        std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof received);
        out.push_back(received);
      }
    }
  }
  if (msg.msg_flags & MSG_CTRUNC) fail("recvmsg", EMSGSIZE);
  return static_cast<std::size_t>(got);
}


}  // namespace

std::pair<ipc_fd_channel, ipc_fd_channel> ipc_fd_channel::make_pair() {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) fail("socketpair", errno);
  return {ipc_fd_channel(fds[0]), ipc_fd_channel(fds[1])};
}

ipc_fd_channel::~ipc_fd_channel() {
  if (fd_ >= 0) ::close(fd_);
}

ipc_fd_channel& ipc_fd_channel::operator=(ipc_fd_channel&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

// Note [Descriptors in chunks]
// A message: one sendmsg of a header (u64 byte count, u32 descriptor count)
// carrying the first descriptors, then the bytes; then, for every further 253
// descriptors, one sendmsg of a single continuation byte carrying them. Linux
// takes at most 253 descriptors a sendmsg (SCM_MAX_FD), and a handle of the
// default pool has one descriptor a page: 2 MiB pages make 253 at 506 MiB. The
// receiver reads the header and the bytes with plain reads of exact lengths
// (which never reach into the continuation bytes, sent after), then the
// continuations until it holds the count the header names.
void ipc_fd_channel::send(std::span<const std::byte> bytes, std::span<const int> descriptors) {
  if (descriptors.size() > max_descriptors || bytes.size() > max_message_bytes) {
    throw logic_error("gpumem::ipc_fd_channel::send: at most " + std::to_string(max_descriptors) +
                      " descriptors and 16 MiB a message");
  }
  for (int fd : descriptors) {
    if (fd < 0) throw logic_error("gpumem::ipc_fd_channel::send: a descriptor this process does not hold");
  }
  const message_header header{bytes.size(), static_cast<std::uint32_t>(descriptors.size()), 0};
  const std::size_t first = std::min(descriptors.size(), descriptors_per_call);
  const std::size_t sent = send_with_descriptors(fd_, &header, sizeof header, descriptors.first(first));
  // A stream socket may take the header in parts; the descriptors went with the first byte.
  if (sent < sizeof header) write_all(fd_, reinterpret_cast<const char*>(&header) + sent, sizeof header - sent);
  write_all(fd_, bytes.data(), bytes.size());
  for (std::size_t at = first; at < descriptors.size(); at += descriptors_per_call) {
    const std::size_t n = std::min(descriptors_per_call, descriptors.size() - at);
    (void)send_with_descriptors(fd_, &continuation, 1, descriptors.subspan(at, n));
  }
}

ipc_fd_channel::message ipc_fd_channel::receive() {
  message_header header{};
  message out;
  auto close_received = [&] {
    for (int fd : out.descriptors) ::close(fd);
  };
  try {
    const std::size_t got = receive_with_descriptors(fd_, &header, sizeof header, out.descriptors);
    if (got < sizeof header) read_all(fd_, reinterpret_cast<char*>(&header) + got, sizeof header - got);
    if (header.bytes > max_message_bytes || header.descriptors > max_descriptors ||
        out.descriptors.size() != std::min<std::size_t>(header.descriptors, descriptors_per_call)) {
      fail("a malformed message", EPROTO);
    }
    out.bytes.resize(header.bytes);
    read_all(fd_, out.bytes.data(), out.bytes.size());
    while (out.descriptors.size() < header.descriptors) {
      const std::size_t before = out.descriptors.size();
      char marker = 0;
      (void)receive_with_descriptors(fd_, &marker, 1, out.descriptors);
      const std::size_t expected = std::min(descriptors_per_call, header.descriptors - before);
      if (marker != continuation || out.descriptors.size() - before != expected) fail("a malformed message", EPROTO);
    }
  } catch (...) {
    close_received();
    throw;
  }
  return out;
}

void ipc_fd_channel::send_handle(const ipc_handle& handle) {
  const std::vector<std::byte> bytes = handle.serialize();
  const std::vector<int> fds = handle.descriptors();
  send(bytes, fds);
}

ipc_handle ipc_fd_channel::receive_handle() {
  message m = receive();
  return ipc_handle::deserialize(m.bytes, m.descriptors);
}

}  // namespace gpumem
