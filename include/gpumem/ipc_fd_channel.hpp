// Passing file descriptors between processes, for IPC handles that carry them
// (docs/ipc.md): a Unix-domain socket with SCM_RIGHTS, and pidfd_getfd.
#pragma once

#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include <sys/types.h>

#include "gpumem/export.hpp"

namespace gpumem {

class ipc_handle;

// One end of a connected Unix-domain stream socket. Messages are a length-prefixed
// block of bytes (up to 16 MiB) plus up to 65,536 descriptors (SCM_RIGHTS, 253 a
// system call: more go in continuation calls of the same message). Errors: ipc_error
// (descriptor_unavailable) naming the system call and errno.
class GPUMEM_EXPORT ipc_fd_channel {
 public:
  // Two connected ends (socketpair): fork, or pass one end's native_handle() to a child.
  static std::pair<ipc_fd_channel, ipc_fd_channel> make_pair();
  // Adopts a connected AF_UNIX socket (closed with the channel).
  explicit ipc_fd_channel(int socket_fd) noexcept : fd_(socket_fd) {}
  ~ipc_fd_channel();
  ipc_fd_channel(ipc_fd_channel&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  ipc_fd_channel& operator=(ipc_fd_channel&& other) noexcept;
  ipc_fd_channel(const ipc_fd_channel&) = delete;
  ipc_fd_channel& operator=(const ipc_fd_channel&) = delete;

  struct message {
    std::vector<std::byte> bytes;
    std::vector<int> descriptors;  // owned by the receiver: close them, or hand them on
  };
  void send(std::span<const std::byte> bytes, std::span<const int> descriptors = {});
  message receive();

  // A handle and its descriptors in one message.
  void send_handle(const ipc_handle& handle);
  ipc_handle receive_handle();

  int native_handle() const noexcept { return fd_; }
  // Gives the socket up without closing it.
  int release() noexcept { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
};

// A duplicate of descriptor `fd` of process `pid` (pidfd_open + pidfd_getfd, Linux
// 5.6+; the caller owns it). Needs ptrace access to `pid` (same user, and under Yama
// ptrace_scope 1 the caller must be an ancestor of `pid`). ipc_error(descriptor_unavailable)
// saying why otherwise: kernel too old, not permitted, process gone, descriptor gone.
GPUMEM_EXPORT int pidfd_get_fd(pid_t pid, int fd);

}  // namespace gpumem
