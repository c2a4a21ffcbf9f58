// The importing process of the multi-process IPC tests (see ipc_child.hpp).
#include "ipc/ipc_child.hpp"

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "driver/driver.hpp"
#include "gpumem/error.hpp"
#include "gpumem/ipc.hpp"
#include "gpumem/ipc_fd_channel.hpp"

namespace gpumem_test {
namespace {

void reply(gpumem::ipc_fd_channel& channel, const std::string& text) {
  channel.send(std::span(reinterpret_cast<const std::byte*>(text.data()), text.size()));
}

// Modes: "channel" (descriptors come with the bytes), "pidfd" (bytes only: descriptors
// are taken from the parent), "crash" (imports, writes, exits without closing),
// "expect-error" (the import must fail with a typed error).
std::string run(const std::string& mode, gpumem::ipc_fd_channel& channel) {
  gpumem::ipc_fd_channel::message m = channel.receive();
  gpumem::ipc_handle handle;
  if (mode == "pidfd") {
    for (int fd : m.descriptors) close(fd);
    handle = gpumem::ipc_handle::deserialize(m.bytes);
  } else {
    handle = gpumem::ipc_handle::deserialize(m.bytes, m.descriptors);
  }
  if (mode == "expect-error") {
    try {
      gpumem::ipc_mapping mapping = gpumem::import_allocation(handle);
      return "import of a freed allocation succeeded";
    } catch (const gpumem::cuda_error& e) {
      return std::string("ok typed: ") + e.what();
    } catch (const gpumem::ipc_error& e) {
      return std::string("ok typed: ") + e.what();
    }
  }
  gpumem::ipc_mapping mapping;
  try {
    mapping = gpumem::import_allocation(handle);
  } catch (const gpumem::ipc_error& e) {
    if (e.code() == gpumem::ipc_errc::descriptor_unavailable) return std::string("skip: ") + e.what();
    throw;
  }
  if (mapping.size() != handle.size()) return "mapping of the wrong size";
  const std::size_t n = mapping.size();
  std::vector<std::uint8_t> host(n);
  {
    const gpumem::detail::device_context_guard guard(mapping.device());
    GPUMEM_CU(cuMemcpy, reinterpret_cast<CUdeviceptr>(host.data()), reinterpret_cast<CUdeviceptr>(mapping.data()), n);
    for (std::size_t i = 0; i < n; ++i) {
      if (host[i] != parent_byte(i)) return "byte " + std::to_string(i) + " is not what the parent wrote";
    }
    for (std::size_t i = 0; i < n; ++i) host[i] = child_byte(i);
    GPUMEM_CU(cuMemcpy, reinterpret_cast<CUdeviceptr>(mapping.data()), reinterpret_cast<CUdeviceptr>(host.data()), n);
  }
  if (handle.kind() == gpumem::ipc_kind::legacy) {
    // A second import of the same base allocation in this process shares the open handle.
    gpumem::ipc_mapping again = gpumem::import_allocation(handle);
    if (again.data() != mapping.data()) return "a second import of one legacy handle mapped elsewhere";
  }
  if (mode == "crash") {
    const gpumem::detail::device_context_guard guard(mapping.device());
    GPUMEM_CU(cuCtxSynchronize);
    reply(channel, "ok");
    _exit(0);  // no close, no destructors: the exporter must not care
  }
  mapping.close();
  return "ok";
}

}  // namespace

int run_ipc_child(int argc, char** argv) {
  if (argc < 2) return 2;
  gpumem::ipc_fd_channel channel(std::atoi(argv[1]));
  std::string result;
  try {
    result = run(argv[0], channel);
  } catch (const std::exception& e) {
    result = std::string("child failed: ") + e.what();
  }
  try {
    reply(channel, result);
  } catch (...) {
    return 3;
  }
  return 0;
}

}  // namespace gpumem_test
