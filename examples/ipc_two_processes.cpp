// Sharing gpumem memory with another process: the parent fills a buffer from the
// default resource and exports it; a child process (this program again, started
// with fork + exec) imports it, checks the bytes, writes its own and says so; the
// parent reads what the child wrote. The handle and its file descriptors travel
// over a Unix-domain socket (gpumem::ipc_fd_channel). docs/ipc.md has the rules.
// Runs on the GPU when one is usable, else on the host simulator.
#include <gpumem/backend.hpp>
#include <gpumem/copy.hpp>
#include <gpumem/current_resource.hpp>
#include <gpumem/error.hpp>
#include <gpumem/ipc.hpp>
#include <gpumem/ipc_fd_channel.hpp>
#include <gpumem/stream.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr std::size_t bytes = std::size_t{8} << 20;

std::string text_of(const gpumem::ipc_fd_channel::message& m) {
  return std::string(reinterpret_cast<const char*>(m.bytes.data()), m.bytes.size());
}

void say(gpumem::ipc_fd_channel& channel, const std::string& text) {
  channel.send(std::span(reinterpret_cast<const std::byte*>(text.data()), text.size()));
}

// The child: import, check the parent's bytes (i % 251), write its own (7), reply.
int child(int socket_fd) {
  gpumem::ipc_fd_channel channel(socket_fd);
  std::string reply;
  try {
    gpumem::select_backend(gpumem::backend_choice::cuda_or_sim);
    const gpumem::ipc_handle handle = channel.receive_handle();
    gpumem::ipc_mapping mapping = gpumem::import_allocation(handle);
    gpumem::stream s{mapping.device()};
    std::vector<unsigned char> host(mapping.size());
    gpumem::copy(host.data(), mapping.data(), host.size(), s);
    s.synchronize();
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < host.size(); ++i) wrong += host[i] != static_cast<unsigned char>(i % 251);
    std::vector<unsigned char> mine(host.size(), 7);
    gpumem::copy(mapping.data(), mine.data(), mine.size(), s);
    s.synchronize();
    mapping.close();
    const char* kind = handle.kind() == gpumem::ipc_kind::vmm ? "vmm" : handle.kind() == gpumem::ipc_kind::pool ? "pool" : "legacy";
    reply = "child: imported " + std::to_string(handle.size()) + " bytes (a " + kind + " handle), " +
            std::to_string(wrong) + " bytes wrong";
  } catch (const std::exception& e) {
    reply = std::string("child failed: ") + e.what();
  }
  say(channel, reply);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "child") return child(std::atoi(argv[2]));
  try {
    const auto backend = gpumem::select_backend(gpumem::backend_choice::cuda_or_sim);
    std::printf("backend: %s\n", backend == gpumem::backend_kind::sim ? "the host simulator" : "the CUDA driver");
    gpumem::stream s{0};
    auto mr = gpumem::get_current_resource(0);
    void* p = mr->allocate(bytes, s);
    std::vector<unsigned char> host(bytes);
    for (std::size_t i = 0; i < bytes; ++i) host[i] = static_cast<unsigned char>(i % 251);
    gpumem::copy(p, host.data(), bytes, s);
    s.synchronize();

    // The child, started as a fresh process (a CUDA context does not survive fork).
    auto [ours, theirs] = gpumem::ipc_fd_channel::make_pair();
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      dup2(theirs.native_handle(), 3);  // a known number; dup2 clears close-on-exec
      execl("/proc/self/exe", argv[0], "child", "3", static_cast<char*>(nullptr));
      _exit(127);
    }
    ours.send_handle(gpumem::export_allocation(*mr, p, bytes));
    const std::string reply = text_of(ours.receive());
    std::printf("%s\n", reply.c_str());
    int status = 0;
    waitpid(pid, &status, 0);

    // What the child wrote is here now.
    gpumem::copy(host.data(), p, bytes, s);
    s.synchronize();
    std::size_t sevens = 0;
    for (unsigned char c : host) sevens += c == 7;
    std::printf("parent: %zu of %zu bytes are the child's\n", sevens, bytes);
    mr->deallocate(p, bytes, s);
    s.synchronize();
    const bool ok = reply.find(" 0 bytes wrong") != std::string::npos && sevens == bytes;
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpumem-example-ipc: %s\n", e.what());
    return 1;
  }
}
