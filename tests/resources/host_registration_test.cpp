// host_registration: existing host memory registered for the object's life,
// reachable from device work through its device pointer when mapped; clear
// errors for a second registration of the same range, a range pinned by
// cuMemHostAlloc, a zero size, a null pointer, and a range the driver does not know.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "driver/driver.hpp"
#include "gpumem/device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/host_registration.hpp"
#include "gpumem/pinned_host_resource.hpp"
#include "support/touch.hpp"

namespace gpumem::test {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

// Page-aligned host memory of our own, so no registration shares a page with anything else.
struct host_pages {
  explicit host_pages(std::size_t n) : bytes(n), data(static_cast<unsigned char*>(std::aligned_alloc(4096, n))) {}
  ~host_pages() { std::free(data); }
  std::size_t bytes;
  unsigned char* data;
};

template <class F>
std::string logic_error_text(F&& f) {
  try {
    f();
  } catch (const logic_error& e) {
    return e.what();
  }
  return "no logic_error";
}

TEST(HostRegistration, MappedMemoryIsReachableFromDeviceWork) {
  host_pages mem(MiB);
  std::memset(mem.data, 0x10, MiB);
  stream s(0);
  {
    host_registration r(mem.data, MiB, {.mapped = true}, 0);
    EXPECT_TRUE(r.registered());
    EXPECT_EQ(r.data(), mem.data);
    EXPECT_EQ(r.size(), MiB);
    EXPECT_EQ(r.device(), 0);
    auto* device = static_cast<unsigned char*>(r.device_pointer());
    EXPECT_EQ(device_count_mismatches(device, MiB, 0x10, s), 0U) << "the device reads what the host wrote";
    device_fill(device + 100, 200, 0x7E, s);
    s.synchronize();
    EXPECT_EQ(mem.data[99], 0x10);
    EXPECT_EQ(mem.data[100], 0x7E);
    EXPECT_EQ(mem.data[299], 0x7E);
    EXPECT_EQ(mem.data[300], 0x10);
  }
  // Unregistered with the object: the range can be registered again.
  host_registration again(mem.data, MiB, {}, 0);
  EXPECT_TRUE(again.registered());
  EXPECT_THROW(again.device_pointer(), logic_error) << "registered without `mapped`";
}

TEST(HostRegistration, RegisteringTheSameRangeTwiceIsAClearError) {
  host_pages mem(4 * 4096);
  host_registration first(mem.data + 4096, 2 * 4096, {.mapped = true}, 0);
  for (const auto& range : {std::pair{4096, 2 * 4096}, std::pair{0, 2 * 4096}, std::pair{2 * 4096, 2 * 4096}}) {
    const std::string what = logic_error_text([&] { host_registration(mem.data + range.first, range.second, {}, 0); });
    EXPECT_NE(what.find("CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"), std::string::npos) << what;
  }
  EXPECT_TRUE(first.registered());
  EXPECT_NE(first.device_pointer(), nullptr) << "the first registration is untouched";
}

TEST(HostRegistration, PinnedAllocationsAreRegisteredAlready) {
  pinned_host_resource pinned({}, 0);
  stream s(0);
  void* p = pinned.allocate(2 * 4096, s);
  {
    // The driver's answer (not HOST_MEMORY_ALREADY_REGISTERED, as for a registered range)...
    detail::device_context_guard guard(0);
    EXPECT_EQ(detail::driver().cuMemHostRegister(p, 4096, 0), CUDA_ERROR_INVALID_VALUE);
  }
  // ...which host_registration turns into a clear error.
  std::string what = logic_error_text([&] { host_registration(p, 4096, {}, 0); });
  EXPECT_NE(what.find("already page-locked"), std::string::npos) << what;
  EXPECT_NE(what.find("CUDA_ERROR_INVALID_VALUE"), std::string::npos) << what;
  // A range inside the allocation, not at its start, is refused clearly too.
  what = logic_error_text([&] { host_registration(static_cast<unsigned char*>(p) + 4096, 4096, {}, 0); });
  EXPECT_NE(what.find("overlaps memory that is already"), std::string::npos) << what;
  pinned.deallocate(p, 2 * 4096, s);
}

TEST(HostRegistration, ZeroSizeAndNullAreLogicErrors) {
  host_pages mem(4096);
  EXPECT_THROW(host_registration(mem.data, 0, {}, 0), logic_error);
  EXPECT_THROW(host_registration(nullptr, 4096, {}, 0), logic_error);
  EXPECT_THROW(host_registration(mem.data, 4096, {}, device_count()), logic_error);
}

TEST(HostRegistration, UnregisteringAnUnknownRangeIsAClearError) {
  host_pages mem(2 * 4096);
  // The driver's answer, which host_registration turns into its error.
  {
    detail::device_context_guard guard(0);
    const CUresult r = detail::driver().cuMemHostUnregister(mem.data);
    EXPECT_EQ(r, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    EXPECT_EQ(detail::error_name(r), "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED");
  }
  host_registration r(mem.data, 2 * 4096, {}, 0);
  {
    // Unregistered behind the object's back.
    detail::device_context_guard guard(0);
    GPUMEM_CU(cuMemHostUnregister, mem.data);
  }
  const std::string what = logic_error_text([&] { r.release(); });
  EXPECT_NE(what.find("CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"), std::string::npos) << what;
  EXPECT_FALSE(r.registered()) << "the object is consistent: nothing registered";
  EXPECT_THROW(r.release(), logic_error) << "nothing left to release";
}

TEST(HostRegistration, MovesTransferTheRegistration) {
  host_pages mem(3 * 4096);
  host_registration a(mem.data, 4096, {.mapped = true, .portable = true}, 0);
  host_registration b(std::move(a));
  EXPECT_FALSE(a.registered());  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  EXPECT_TRUE(b.registered());
  EXPECT_TRUE(b.options().portable);
  host_registration c(mem.data + 4096, 4096, {}, 0);
  c = std::move(b);  // c's own range is unregistered first
  EXPECT_EQ(c.data(), mem.data);
  host_registration d(mem.data + 4096, 4096, {}, 0);  // free again
  EXPECT_TRUE(d.registered());
  c.release();
  EXPECT_FALSE(c.registered());
  host_registration e(mem.data, 4096, {}, 0);  // and so is c's former range
  EXPECT_TRUE(e.registered());
}

}  // namespace
}  // namespace gpumem::test
