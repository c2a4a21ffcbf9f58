// Sharing memory between processes: for every kind of gpumem memory, a child process
// imports what the parent exported, reads the parent's bytes, writes its own, and the
// parent sees them; bad handles give typed errors; descriptors travel over a socket or
// by pidfd_getfd. Runs on the GPU when there is one, else on the simulator.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "driver/driver.hpp"
#include "gpumem/async_resource.hpp"
#include "gpumem/backend.hpp"
#include "gpumem/device.hpp"
#include "gpumem/cuda_resource.hpp"
#include "gpumem/error.hpp"
#include "gpumem/ipc.hpp"
#include "gpumem/ipc_fd_channel.hpp"
#include "gpumem/managed_resource.hpp"
#include "gpumem/pinned_host_resource.hpp"
#include "gpumem/pool_resource.hpp"
#include "gpumem/stream.hpp"
#include "gpumem/vmm_pool_resource.hpp"
#include "ipc/ipc_child.hpp"

namespace {

using gpumem_test::child_byte;
using gpumem_test::count_differences;
using gpumem_test::first_difference;
using gpumem_test::parent_byte;

void write_pattern(void* p, std::size_t n) {
  const std::vector<std::uint8_t> host = gpumem_test::pattern(n, parent_byte);
  const gpumem::detail::device_context_guard guard(0);
  GPUMEM_CU(cuMemcpy, reinterpret_cast<CUdeviceptr>(p), reinterpret_cast<CUdeviceptr>(host.data()), n);
}

// Bytes of p that are not what the child writes.
std::size_t child_mismatches(const void* p, std::size_t n) {
  std::vector<std::uint8_t> host(n);
  const gpumem::detail::device_context_guard guard(0);
  GPUMEM_CU(cuMemcpy, reinterpret_cast<CUdeviceptr>(host.data()), reinterpret_cast<CUdeviceptr>(p), n);
  return count_differences(host.data(), n, child_byte);
}

// Starts this binary as the importing child (fork + exec: the child starts a fresh
// driver), sends it the handle (with its descriptors unless `send_descriptors` is
// false), and returns its report and exit status.
struct child_report {
  std::string text;
  int status = -1;
};

child_report run_child(const char* mode, const gpumem::ipc_handle& handle, bool send_descriptors = true) {
  auto [mine, theirs] = gpumem::ipc_fd_channel::make_pair();
  constexpr int child_fd = 100;
  const std::string fd_text = std::to_string(child_fd);
  const pid_t pid = fork();
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    dup2(theirs.native_handle(), child_fd);  // dup2 clears close-on-exec
    const char* args[] = {"gpumem_ipc_tests", "--gpumem-ipc-child", mode, fd_text.c_str(), nullptr};
    execv("/proc/self/exe", const_cast<char* const*>(args));
    _exit(127);
  }
  EXPECT_GT(pid, 0);
  theirs = gpumem::ipc_fd_channel(-1);
  const std::vector<std::byte> bytes = handle.serialize();
  if (send_descriptors) {
    mine.send(bytes, handle.descriptors());
  } else {
    mine.send(bytes);
  }
  child_report report;
  try {
    auto reply = mine.receive();
    report.text.assign(reinterpret_cast<const char*>(reply.bytes.data()), reply.bytes.size());
  } catch (const gpumem::ipc_error& e) {
    report.text = std::string("no reply: ") + e.what();
  }
  int status = 0;
  waitpid(pid, &status, 0);
  report.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return report;
}

// Export `bytes` at `p` of `mr`, let a child read and write them, check the parent sees it.
void round_trip(const gpumem::memory_resource& mr, void* p, std::size_t bytes, gpumem::ipc_kind kind,
                const char* mode = "channel", bool send_descriptors = true) {
  write_pattern(p, bytes);
  gpumem::ipc_handle handle = gpumem::export_allocation(mr, p, bytes);
  EXPECT_EQ(handle.kind(), kind);
  EXPECT_EQ(handle.size(), bytes);
  EXPECT_EQ(handle.exporter_pid(), getpid());
  const child_report report = run_child(mode, handle, send_descriptors);
  if (report.text.rfind("skip: ", 0) == 0) GTEST_SKIP() << report.text;
  ASSERT_EQ(report.text, "ok");
  EXPECT_EQ(report.status, 0);
  EXPECT_EQ(child_mismatches(p, bytes), 0u);
}

TEST(IpcPattern, IsEachByteAndItsChecksFindEveryDifference) {
  // Over several of first_difference's 1 MiB blocks, with a ragged end.
  const std::size_t n = (std::size_t{3} << 20) + 100;
  std::vector<std::uint8_t> host = gpumem_test::pattern(n, parent_byte);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(host[i], parent_byte(i)) << i;
  EXPECT_EQ(first_difference(host.data(), n, parent_byte), n);
  EXPECT_EQ(count_differences(host.data(), n, parent_byte), 0u);
  EXPECT_EQ(first_difference(host.data(), n, child_byte), 0u);
  host[(std::size_t{1} << 20) + 7] ^= 1;
  host[n - 1] ^= 1;
  EXPECT_EQ(first_difference(host.data(), n, parent_byte), (std::size_t{1} << 20) + 7);
  EXPECT_EQ(count_differences(host.data(), n, parent_byte), 2u);
}

TEST(Ipc, CudaResourceLegacyHandle) {
  gpumem::cuda_resource mr{0};
  gpumem::stream s{0};
  const std::size_t n = 300000;
  void* p = mr.allocate(n, s);
  s.synchronize();
  round_trip(mr, p, n, gpumem::ipc_kind::legacy);
  mr.deallocate(p, n, s);
}

TEST(Ipc, PoolSubAllocationCarriesItsOffset) {
  gpumem::cuda_resource upstream{0};
  gpumem::pool_resource pool{upstream, {.initial_bytes = 8 << 20}};
  gpumem::stream s{0};
  void* first = pool.allocate(1 << 20, s);
  void* second = pool.allocate(123456, s);
  s.synchronize();
  CUdeviceptr base = 0;
  {
    const gpumem::detail::device_context_guard guard(0);
    GPUMEM_CU(cuMemGetAddressRange, &base, nullptr, reinterpret_cast<CUdeviceptr>(second));
  }
  gpumem::ipc_handle handle = gpumem::export_allocation(pool, second, 123456);
  EXPECT_EQ(handle.offset(), reinterpret_cast<CUdeviceptr>(second) - base);
  round_trip(pool, second, 123456, gpumem::ipc_kind::legacy);
  round_trip(pool, first, 1 << 20, gpumem::ipc_kind::legacy);
  pool.deallocate(second, 123456, s);
  pool.deallocate(first, 1 << 20, s);
}

TEST(Ipc, ShareableDriverPool) {
  gpumem::async_resource mr{0, {.ipc = gpumem::async_ipc_handle::posix_file_descriptor}};
  gpumem::stream s{0};
  const std::size_t n = 1 << 20;
  void* p = mr.allocate(n, s);
  s.synchronize();
  round_trip(mr, p, n, gpumem::ipc_kind::pool);
  mr.deallocate(p, n, s);
}

TEST(Ipc, ShareableVmmPoolAcrossChunks) {
  gpumem::vmm_pool_options shareable;
  shareable.posix_fd_shareable = true;
  gpumem::vmm_pool_resource mr{0, shareable};
  gpumem::stream s{0};
  void* small = mr.allocate(4096, s);
  const std::size_t n = (5 << 20) + 1000;  // more than one 2 MiB granule, after another allocation
  void* p = mr.allocate(n, s);
  s.synchronize();
  gpumem::ipc_handle handle = gpumem::export_allocation(mr, p, n);
  // One descriptor per physical handle under the allocation, whatever sizes the pool chose.
  EXPECT_EQ(handle.descriptor_count(), mr.physical_pieces(p, n).size());
  round_trip(mr, p, n, gpumem::ipc_kind::vmm);
  mr.deallocate(p, n, s);
  mr.deallocate(small, 4096, s);
}

TEST(Ipc, DefaultPoolAllocationOfMoreThan253PagesGoesOverAChannel) {
  // The default pool's pages are one descriptor each: 600 MiB of 2 MiB pages is
  // 300, more than one sendmsg carries (Note [Descriptors in chunks]).
  gpumem::vmm_pool_resource mr{0};
  gpumem::stream s{0};
  const std::size_t n = 300 * mr.page_bytes();
  void* p = mr.allocate(n, s);
  s.synchronize();
  ASSERT_GT(mr.physical_pieces(p, n).size(), 253u);
  round_trip(mr, p, n, gpumem::ipc_kind::vmm);
  mr.deallocate(p, n, s);
  s.synchronize();
}

TEST(Ipc, DescriptorsTakenWithPidfdGetfd) {
  gpumem::async_resource pool_mr{0, {.ipc = gpumem::async_ipc_handle::posix_file_descriptor}};
  gpumem::vmm_pool_options shareable;
  shareable.posix_fd_shareable = true;
  gpumem::vmm_pool_resource vmm_mr{0, shareable};
  gpumem::stream s{0};
  void* a = pool_mr.allocate(65536, s);
  void* b = vmm_mr.allocate(3 << 20, s);
  s.synchronize();
  round_trip(pool_mr, a, 65536, gpumem::ipc_kind::pool, "pidfd", false);
  round_trip(vmm_mr, b, 3 << 20, gpumem::ipc_kind::vmm, "pidfd", false);
  pool_mr.deallocate(a, 65536, s);
  vmm_mr.deallocate(b, 3 << 20, s);
}

TEST(Ipc, ImporterThatDiesWithoutClosingLeavesThePoolIntact) {
  gpumem::cuda_resource upstream{0};
  gpumem::pool_resource pool{upstream, {.initial_bytes = 4 << 20}};
  gpumem::stream s{0};
  const std::size_t n = 200000;
  void* p = pool.allocate(n, s);
  void* neighbour = pool.allocate(n, s);
  s.synchronize();
  write_pattern(neighbour, n);
  round_trip(pool, p, n, gpumem::ipc_kind::legacy, "crash");
  // The pool goes on: the neighbour is untouched, memory is reused and freed normally.
  std::vector<std::uint8_t> host(n);
  {
    const gpumem::detail::device_context_guard guard(0);
    GPUMEM_CU(cuMemcpy, reinterpret_cast<CUdeviceptr>(host.data()), reinterpret_cast<CUdeviceptr>(neighbour), n);
  }
  ASSERT_EQ(first_difference(host.data(), n, parent_byte), n);
  pool.deallocate(p, n, s);
  void* again = pool.allocate(n, s);
  write_pattern(again, n);
  pool.deallocate(again, n, s);
  pool.deallocate(neighbour, n, s);
  s.synchronize();
}

// One allocation of `bytes` from each kind of shareable memory on device 0 (cuMemAlloc,
// a shareable driver pool, a shareable virtual-memory pool), freed at the end.
struct one_of_each_kind {
  static constexpr gpumem::ipc_kind kinds[] = {gpumem::ipc_kind::legacy, gpumem::ipc_kind::pool,
                                               gpumem::ipc_kind::vmm};

  explicit one_of_each_kind(std::size_t bytes) : n(bytes) {
    for (int i = 0; i < 3; ++i) pointers[i] = resource(i).allocate(n, s);
    s.synchronize();
  }
  ~one_of_each_kind() {
    try {
      for (int i = 0; i < 3; ++i) resource(i).deallocate(pointers[i], n, s);
      s.synchronize();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "freeing: " << e.what();
    }
  }
  one_of_each_kind(const one_of_each_kind&) = delete;
  one_of_each_kind& operator=(const one_of_each_kind&) = delete;

  gpumem::memory_resource& resource(int i) {
    gpumem::memory_resource* all[] = {&legacy_mr, &pool_mr, &vmm_mr};
    return *all[i];
  }
  static gpumem::vmm_pool_options shareable() {
    gpumem::vmm_pool_options o;
    o.posix_fd_shareable = true;
    return o;
  }

  gpumem::cuda_resource legacy_mr{0};
  gpumem::async_resource pool_mr{0, {.ipc = gpumem::async_ipc_handle::posix_file_descriptor}};
  gpumem::vmm_pool_resource vmm_mr{0, shareable()};
  gpumem::stream s{0};
  const std::size_t n;
  void* pointers[3]{};
};

// Issue #8: a child imports for the device other than the memory's (peer access), reads
// the parent's bytes and writes its own from there, for every kind.
TEST(Ipc, ImportForAnotherDeviceThroughPeerAccess) {
  if (gpumem::device_count() < 2) GTEST_SKIP() << "needs two devices";
  one_of_each_kind memory{(2 << 20) + 4096};
  for (int i = 0; i < 3; ++i) {
    round_trip(memory.resource(i), memory.pointers[i], memory.n, one_of_each_kind::kinds[i], "other-device");
  }
}

// Without peer access (the simulator's set_peer_access(false)), importing for the other
// device is ipc_error(peer_access_unavailable) naming both devices, for every kind.
TEST(Ipc, ImportForADeviceWithoutPeerAccessSaysWhy) {
  if (gpumem::device_count() < 2) GTEST_SKIP() << "needs two devices";
  if (gpumem::current_backend() != gpumem::backend_kind::sim) GTEST_SKIP() << "needs the simulator";
  one_of_each_kind memory{65536};
  for (int i = 0; i < 3; ++i) {
    gpumem::ipc_handle handle = gpumem::export_allocation(memory.resource(i), memory.pointers[i], memory.n);
    const child_report report = run_child("no-peer", handle);
    ASSERT_EQ(report.text.rfind("ok typed: ", 0), 0u) << report.text;
    const std::string other = std::to_string((handle.device() + 1) % gpumem::device_count());
    EXPECT_NE(report.text.find("device " + other + " cannot use memory of device " + std::to_string(handle.device())),
              std::string::npos)
        << report.text;
    EXPECT_NE(report.text.find("cuDeviceCanAccessPeer"), std::string::npos) << report.text;
    EXPECT_EQ(report.status, 0);
  }
}

TEST(Ipc, HandleOfAFreedAllocationDoesNotOpen) {
  gpumem::cuda_resource mr{0};
  gpumem::stream s{0};
  const std::size_t n = 65536;
  void* p = mr.allocate(n, s);
  s.synchronize();
  gpumem::ipc_handle handle = gpumem::export_allocation(mr, p, n);
  mr.deallocate(p, n, s);
  s.synchronize();
  const child_report report = run_child("expect-error", handle);
  EXPECT_EQ(report.text.rfind("ok typed: ", 0), 0u) << report.text;
}

TEST(Ipc, ImportInTheExportingProcessIsRefused) {
  gpumem::cuda_resource mr{0};
  gpumem::stream s{0};
  void* p = mr.allocate(4096, s);
  s.synchronize();
  gpumem::ipc_handle handle = gpumem::export_allocation(mr, p, 4096);
  try {
    gpumem::import_allocation(handle);
    ADD_FAILURE() << "imported in the exporting process";
  } catch (const gpumem::ipc_error& e) {
    EXPECT_EQ(e.code(), gpumem::ipc_errc::same_process);
  }
  mr.deallocate(p, 4096, s);
}

gpumem::ipc_errc deserialize_error(std::span<const std::byte> bytes) {
  try {
    gpumem::ipc_handle::deserialize(bytes);
  } catch (const gpumem::ipc_error& e) {
    return e.code();
  }
  ADD_FAILURE() << "deserialized bad bytes";
  return gpumem::ipc_errc::same_process;
}

TEST(Ipc, TruncatedForgedAndForeignBytesAreRejected) {
  gpumem::cuda_resource mr{0};
  gpumem::stream s{0};
  void* p = mr.allocate(4096, s);
  s.synchronize();
  const std::vector<std::byte> good = gpumem::export_allocation(mr, p, 4096).serialize();
  const gpumem::ipc_handle back = gpumem::ipc_handle::deserialize(good);
  EXPECT_EQ(back.kind(), gpumem::ipc_kind::legacy);
  EXPECT_EQ(back.size(), 4096u);
  EXPECT_EQ(back.exporter_pid(), getpid());
  EXPECT_EQ(back.serialize(), good);

  for (std::size_t cut = 0; cut < good.size(); ++cut) {
    EXPECT_EQ(deserialize_error(std::span(good).first(cut)), gpumem::ipc_errc::malformed_handle) << cut;
  }
  for (std::size_t i = 0; i < good.size(); ++i) {  // any single flipped byte
    std::vector<std::byte> forged = good;
    forged[i] ^= std::byte{0x40};
    EXPECT_EQ(deserialize_error(forged), gpumem::ipc_errc::malformed_handle) << i;
  }
  std::vector<std::byte> longer = good;
  longer.push_back(std::byte{0});
  EXPECT_EQ(deserialize_error(longer), gpumem::ipc_errc::malformed_handle);
  const std::vector<std::byte> garbage(200, std::byte{0x5a});
  EXPECT_EQ(deserialize_error(garbage), gpumem::ipc_errc::malformed_handle);
  // Descriptors that do not match the kind's count are refused (and closed).
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  close(pipe_fds[1]);
  const int extra[] = {pipe_fds[0]};
  EXPECT_THROW(gpumem::ipc_handle::deserialize(good, extra), gpumem::ipc_error);
  EXPECT_EQ(fcntl(pipe_fds[0], F_GETFD), -1);  // closed by deserialize
  mr.deallocate(p, 4096, s);
}

// The handle's bytes with its size (at byte 24) or offset (at byte 32) rewritten and
// the checksum made again, as anyone can (docs/ipc.md: the checksum finds damage,
// not intent).
std::vector<std::byte> forge(std::vector<std::byte> bytes, std::size_t at, std::uint64_t value) {
  std::memcpy(bytes.data() + at, &value, sizeof value);
  std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over all but the trailer
  for (std::size_t i = 0; i + 8 < bytes.size(); ++i) {
    h ^= static_cast<std::uint64_t>(bytes[i]);
    h *= 0x100000001b3ull;
  }
  std::memcpy(bytes.data() + bytes.size() - 8, &h, sizeof h);
  return bytes;
}

TEST(Ipc, ASizeOrOffsetPastWhatWasExportedIsRefusedByTheImporter) {
  gpumem::pool_resource pool{std::make_shared<gpumem::cuda_resource>(0)};
  gpumem::stream s{0};
  void* first = pool.allocate(4096, s);
  void* p = pool.allocate(70001, s);  // inside the pool's chunk: offset > 0
  s.synchronize();
  write_pattern(p, 70001);
  const gpumem::ipc_handle good = gpumem::export_allocation(pool, p, 70001);
  const std::vector<std::byte> bytes = good.serialize();
  std::uint64_t size = 0, offset = 0;
  std::memcpy(&size, bytes.data() + 24, sizeof size);
  std::memcpy(&offset, bytes.data() + 32, sizeof offset);
  ASSERT_EQ(size, 70001u) << "the layout this test forges";
  ASSERT_EQ(offset, good.offset());
  for (auto [at, value] : {std::pair{std::size_t{24}, std::uint64_t{1} << 62},
                           std::pair{std::size_t{32}, std::uint64_t{1} << 40},
                           std::pair{std::size_t{32}, offset + (std::uint64_t{1} << 30)}}) {
    const gpumem::ipc_handle forged = gpumem::ipc_handle::deserialize(forge(bytes, at, value));
    const child_report report = run_child("expect-error", forged);
    if (report.text.rfind("skip: ", 0) == 0) GTEST_SKIP() << report.text;
    EXPECT_EQ(report.text.rfind("ok typed: ", 0), 0u) << at << ": " << report.text;
    EXPECT_NE(report.text.find("forged or damaged"), std::string::npos) << at << ": " << report.text;
  }
  // The genuine handle still opens.
  const child_report ok = run_child("channel", good);
  EXPECT_EQ(ok.text, "ok");
  pool.deallocate(p, 70001, s);
  pool.deallocate(first, 4096, s);
  s.synchronize();
}

// An exporter that has exited: the descriptors a handle names cannot be taken from
// it any more (pidfd_getfd), and the import says so (typed). The handle is a real one
// of this process, its pid rewritten to that of a child that has exited.
TEST(Ipc, AHandleWhoseExporterExitedSaysWhy) {
  gpumem::vmm_pool_resource pool(0);
  gpumem::stream s{0};
  const std::size_t n = std::size_t{4} << 20;
  void* p = pool.allocate(n, s);
  s.synchronize();
  const gpumem::ipc_handle good = gpumem::export_allocation(pool, p, n);
  const pid_t gone = fork();
  ASSERT_GE(gone, 0);
  if (gone == 0) _exit(0);
  int status = 0;
  ASSERT_EQ(waitpid(gone, &status, 0), gone);
  const std::uint64_t pid_and_device = (std::uint64_t{static_cast<std::uint32_t>(good.device())} << 32) |
                                       static_cast<std::uint32_t>(gone);
  const gpumem::ipc_handle orphan = gpumem::ipc_handle::deserialize(forge(good.serialize(), 16, pid_and_device));
  ASSERT_EQ(orphan.exporter_pid(), gone) << "the layout this test forges";
  try {
    gpumem::ipc_mapping m = gpumem::import_allocation(orphan);
    ADD_FAILURE() << "imported from an exporter that has exited";
  } catch (const gpumem::ipc_error& e) {
    EXPECT_EQ(e.code(), gpumem::ipc_errc::descriptor_unavailable) << e.what();
    EXPECT_NE(std::string(e.what()).find("exited"), std::string::npos) << e.what();
  }
  pool.deallocate(p, n, s);
  s.synchronize();
}

template <class F>
void expect_not_exportable(F&& f, const char* hint) {
  try {
    f();
    ADD_FAILURE() << "exported";
  } catch (const gpumem::ipc_error& e) {
    EXPECT_EQ(e.code(), gpumem::ipc_errc::not_exportable);
    EXPECT_NE(std::string(e.what()).find(hint), std::string::npos) << e.what();
  }
}

TEST(Ipc, MemoryThatCannotBeSharedSaysWhatToConfigure) {
  gpumem::stream s{0};
  gpumem::managed_resource managed{0};
  void* m = managed.allocate(4096, s);
  expect_not_exportable([&] { gpumem::export_allocation(managed, m, 4096); }, "managed memory");
  expect_not_exportable([&] { gpumem::export_allocation(m, 4096); }, "managed memory");
  managed.deallocate(m, 4096, s);

  gpumem::pinned_host_resource pinned;
  void* h = pinned.allocate(4096, s);
  expect_not_exportable([&] { gpumem::export_allocation(pinned, h, 4096); }, "host memory");
  pinned.deallocate(h, 4096, s);

  gpumem::async_resource private_pool{0};
  void* a = private_pool.allocate(4096, s);
  expect_not_exportable([&] { gpumem::export_allocation(private_pool, a, 4096); }, "posix_file_descriptor");
  expect_not_exportable([&] { gpumem::export_allocation(a, 4096); }, "posix_file_descriptor");
  private_pool.deallocate(a, 4096, s);

  gpumem::vmm_pool_options private_pages;
  private_pages.posix_fd_shareable = false;
  gpumem::vmm_pool_resource private_vmm{0, private_pages};
  void* v = private_vmm.allocate(4096, s);
  expect_not_exportable([&] { gpumem::export_allocation(private_vmm, v, 4096); }, "posix_fd_shareable");
  expect_not_exportable([&] { gpumem::export_allocation(v, 4096); }, "posix_fd_shareable");
  private_vmm.deallocate(v, 4096, s);
  s.synchronize();
}

TEST(IpcFdChannel, PassesBytesAndDescriptors) {
  auto [a, b] = gpumem::ipc_fd_channel::make_pair();
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const std::string text = "descriptors";
  a.send(std::span(reinterpret_cast<const std::byte*>(text.data()), text.size()), std::span(&pipe_fds[1], 1));
  close(pipe_fds[1]);
  auto m = b.receive();
  ASSERT_EQ(m.descriptors.size(), 1u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m.bytes.data()), m.bytes.size()), text);
  ASSERT_EQ(write(m.descriptors[0], "x", 1), 1);  // the received descriptor is the pipe's write end
  close(m.descriptors[0]);
  char c = 0;
  ASSERT_EQ(read(pipe_fds[0], &c, 1), 1);
  EXPECT_EQ(c, 'x');
  close(pipe_fds[0]);
  // A closed peer is a typed error, not a hang or a crash.
  a = gpumem::ipc_fd_channel(-1);
  EXPECT_THROW(b.receive(), gpumem::ipc_error);
}

TEST(IpcFdChannel, MoreDescriptorsThanOneSendmsgCarriesArriveInOrder) {
  auto [a, b] = gpumem::ipc_fd_channel::make_pair();
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  // 600 descriptors: the pipe's write end, then its read end, alternating; each
  // arrives as a descriptor of its own, in order.
  std::vector<int> sent;
  for (int i = 0; i < 600; ++i) sent.push_back(pipe_fds[i % 2]);
  const std::string text = "many";
  a.send(std::span(reinterpret_cast<const std::byte*>(text.data()), text.size()), sent);
  auto m = b.receive();
  ASSERT_EQ(m.descriptors.size(), 600u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m.bytes.data()), m.bytes.size()), text);
  for (int i = 0; i < 600; ++i) {
    // Descriptors of one open file share its status flags: the write end is O_WRONLY.
    const int mode = fcntl(m.descriptors[i], F_GETFL) & O_ACCMODE;
    EXPECT_EQ(mode, i % 2 == 0 ? O_RDONLY : O_WRONLY) << "descriptor " << i;
  }
  for (int fd : m.descriptors) close(fd);
  // A second message on the same channel after the chunks starts clean.
  a.send(std::span(reinterpret_cast<const std::byte*>(text.data()), text.size()), std::span(&pipe_fds[0], 1));
  auto again = b.receive();
  ASSERT_EQ(again.descriptors.size(), 1u);
  close(again.descriptors[0]);
  std::vector<int> too_many(65537, pipe_fds[0]);
  EXPECT_THROW(a.send({}, too_many), gpumem::logic_error);
  close(pipe_fds[0]);
  close(pipe_fds[1]);
}

TEST(IpcPidfd, TakesADescriptorOrSaysWhy) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  int fd = -1;
  try {
    fd = gpumem::pidfd_get_fd(getpid(), pipe_fds[1]);
  } catch (const gpumem::ipc_error& e) {
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    GTEST_SKIP() << "pidfd_getfd is not available here: " << e.what();
  }
  ASSERT_EQ(write(fd, "y", 1), 1);
  char c = 0;
  ASSERT_EQ(read(pipe_fds[0], &c, 1), 1);
  EXPECT_EQ(c, 'y');
  close(fd);
  close(pipe_fds[1]);
  constexpr int unused = 987;  // a number nothing here opens (low numbers get reused at once)
  ASSERT_EQ(fcntl(unused, F_GETFD), -1);
  try {
    gpumem::pidfd_get_fd(getpid(), unused);
    ADD_FAILURE() << "took a closed descriptor";
  } catch (const gpumem::ipc_error& e) {
    EXPECT_EQ(e.code(), gpumem::ipc_errc::descriptor_unavailable);
    EXPECT_NE(std::string(e.what()).find("no longer holds"), std::string::npos) << e.what();
  }
  close(pipe_fds[0]);
}

}  // namespace
