// ipc_fd_channel: bytes and file descriptors over a Unix-domain socket (SCM_RIGHTS).
#include "gpumem/ipc_fd_channel.hpp"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "gpumem/error.hpp"
#include "gpumem/ipc.hpp"

namespace gpumem {
namespace {

// Linux's per-message limit on SCM_RIGHTS descriptors.
constexpr std::size_t max_descriptors = 253;
constexpr std::uint64_t max_message_bytes = std::uint64_t{1} << 24;

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

// A message: one sendmsg of a header (u64 byte count, u32 descriptor count) carrying the
// descriptors, then the bytes.
void ipc_fd_channel::send(std::span<const std::byte> bytes, std::span<const int> descriptors) {
  if (descriptors.size() > max_descriptors || bytes.size() > max_message_bytes) {
    throw logic_error("gpumem::ipc_fd_channel::send: at most 253 descriptors and 16 MiB a message");
  }
  for (int fd : descriptors) {
    if (fd < 0) throw logic_error("gpumem::ipc_fd_channel::send: a descriptor this process does not hold");
  }
  struct {
    std::uint64_t bytes;
    std::uint32_t descriptors;
    std::uint32_t reserved;
  } header{bytes.size(), static_cast<std::uint32_t>(descriptors.size()), 0};
  iovec iov{&header, sizeof header};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * max_descriptors)] = {};
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
    sent = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent < 0) fail("sendmsg", errno);
  // A stream socket may take the header in parts; the descriptors went with the first byte.
  if (static_cast<std::size_t>(sent) < sizeof header) {
    write_all(fd_, reinterpret_cast<const char*>(&header) + sent, sizeof header - static_cast<std::size_t>(sent));
  }
  write_all(fd_, bytes.data(), bytes.size());
}

ipc_fd_channel::message ipc_fd_channel::receive() {
  struct {
    std::uint64_t bytes;
    std::uint32_t descriptors;
    std::uint32_t reserved;
  } header{};
  iovec iov{&header, sizeof header};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * max_descriptors)] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t got = -1;
  do {
    got = ::recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC);
  } while (got < 0 && errno == EINTR);
  if (got < 0) fail("recvmsg", errno);
  if (got == 0) fail("recvmsg", ECONNRESET);
  message out;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      const std::size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < n; ++i) {
        int fd = -1;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        out.descriptors.push_back(fd);
      }
    }
  }
  auto close_received = [&] {
    for (int fd : out.descriptors) ::close(fd);
  };
  try {
    if (msg.msg_flags & MSG_CTRUNC) fail("recvmsg", EMSGSIZE);
    if (static_cast<std::size_t>(got) < sizeof header) {
      read_all(fd_, reinterpret_cast<char*>(&header) + got, sizeof header - static_cast<std::size_t>(got));
    }
    if (header.bytes > max_message_bytes || header.descriptors != out.descriptors.size()) {
      fail("a malformed message", EPROTO);
    }
    out.bytes.resize(header.bytes);
    read_all(fd_, out.bytes.data(), out.bytes.size());
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
