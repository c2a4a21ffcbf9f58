// pidfd_get_fd: another process's descriptor, with pidfd_open + pidfd_getfd (Linux 5.6+).
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "gpumem/error.hpp"
#include "gpumem/ipc_fd_channel.hpp"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

namespace gpumem {
namespace {

[[noreturn]] void fail(pid_t pid, int fd, const char* call, int error) {
  std::string why;
  switch (error) {
    case ENOSYS:
      why = "the kernel lacks it (pidfd_getfd needs Linux 5.6 or newer, and no seccomp filter refusing it)";
      break;
    case EPERM:
    case EACCES:
      why = "not permitted: it needs ptrace access to the exporter (the same user, a dumpable process, and under "
            "Yama kernel.yama.ptrace_scope >= 1 only an ancestor of the exporter may); pass the descriptors over "
            "an ipc_fd_channel instead";
      break;
    case ESRCH: why = "the exporting process has exited"; break;
    case EBADF:
      why = "the exporter no longer holds that descriptor (keep its ipc_handle alive until the import is done)";
      break;
    default: why = std::strerror(error); break;
  }
  throw ipc_error(ipc_errc::descriptor_unavailable, "gpumem::pidfd_get_fd(pid " + std::to_string(pid) + ", fd " +
                                                        std::to_string(fd) + "): " + call + " failed: " + why);
}

}  // namespace

int pidfd_get_fd(pid_t pid, int fd) {
  const long pidfd = ::syscall(SYS_pidfd_open, pid, 0);
  if (pidfd < 0) fail(pid, fd, "pidfd_open", errno);
  const long got = ::syscall(SYS_pidfd_getfd, static_cast<int>(pidfd), fd, 0);
  const int error = errno;
  ::close(static_cast<int>(pidfd));
  if (got < 0) fail(pid, fd, "pidfd_getfd", error);
  return static_cast<int>(got);  // pidfd_getfd sets FD_CLOEXEC
}

}  // namespace gpumem
