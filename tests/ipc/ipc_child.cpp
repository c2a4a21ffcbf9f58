// The importing process of the multi-process IPC tests (see ipc_child.hpp).
#include "ipc/ipc_child.hpp"

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "driver/driver.hpp"
#include "gpumem/backend.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/ipc.hpp"
#include "gpumem/ipc_fd_channel.hpp"
#include "gpumem/sim.hpp"

namespace gpumem_test {
namespace {

void reply(gpumem::ipc_fd_channel& channel, const std::string& text) {
  channel.send(std::span(reinterpret_cast<const std::byte*>(text.data()), text.size()));
}

// Modes: "channel" (descriptors come with the bytes), "pidfd" (bytes only: descriptors
// are taken from the parent), "crash" (imports, writes, exits without closing),
// "expect-error" (the import must fail with a typed error), "other-device" (imports for
// the device after the memory's own and uses it from there), "no-peer" (the simulator
// without peer access: importing for the other device must fail with
// ipc_error(peer_access_unavailable)).
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
  gpumem::import_options options;
  if (mode == "other-device" || mode == "no-peer") {
    const int count = gpumem::device_count();
    if (count < 2) return "skip: needs two devices";
    options.device = (handle.device() + 1) % count;
  }
  if (mode == "no-peer") {
    if (gpumem::current_backend() != gpumem::backend_kind::sim) return "skip: needs the simulator";
    gpumem::sim::set_peer_access(false);
    try {
      gpumem::ipc_mapping mapping = gpumem::import_allocation(handle, options);
      return "imported for a device without peer access";
    } catch (const gpumem::ipc_error& e) {
      if (e.code() != gpumem::ipc_errc::peer_access_unavailable) return std::string("wrong code: ") + e.what();
      return std::string("ok typed: ") + e.what();
    }
  }
  gpumem::ipc_mapping mapping;
  try {
    mapping = gpumem::import_allocation(handle, options);
  } catch (const gpumem::ipc_error& e) {
    if (e.code() == gpumem::ipc_errc::descriptor_unavailable) return std::string("skip: ") + e.what();
    throw;
  }
  if (mapping.size() != handle.size()) return "mapping of the wrong size";
  const int user = options.device == -1 ? mapping.device() : options.device;
  if (mapping.user_device() != user) return "mapping for device " + std::to_string(mapping.user_device());
  if (options.device != -1 && mapping.device() == user) return "the mapping's device is the user device";
  const std::size_t n = mapping.size();
  std::vector<std::uint8_t> host(n);
  {
    const gpumem::detail::device_context_guard guard(user);
    GPUMEM_CU(cuMemcpy, reinterpret_cast<CUdeviceptr>(host.data()), reinterpret_cast<CUdeviceptr>(mapping.data()), n);
    if (const std::size_t at = first_difference(host.data(), n, parent_byte); at != n) {
      return "byte " + std::to_string(at) + " is not what the parent wrote";
    }
    host = pattern(n, child_byte);
    GPUMEM_CU(cuMemcpy, reinterpret_cast<CUdeviceptr>(mapping.data()), reinterpret_cast<CUdeviceptr>(host.data()), n);
  }
  if (handle.kind() != gpumem::ipc_kind::vmm && mode != "crash") {
    // A second import of the same allocation in this process shares the first's
    // mapping (Note [One open per process]), and they close in any order: the
    // first closes first, and the second still reads what this process wrote.
    gpumem::ipc_mapping again = gpumem::import_allocation(handle, options);
    if (again.data() != mapping.data()) return "a second import of one handle mapped elsewhere";
    mapping.close();
    const gpumem::detail::device_context_guard guard(user);
    GPUMEM_CU(cuMemcpy, reinterpret_cast<CUdeviceptr>(host.data()), reinterpret_cast<CUdeviceptr>(again.data()), n);
    if (first_difference(host.data(), n, child_byte) != n) {
      return "after the first mapping closed, the second reads other bytes";
    }
    again.close();
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
