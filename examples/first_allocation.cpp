// gpumem in one page: the device's default resource, a buffer on a stream, a
// copy there and back, what the pool holds, and the error when memory runs
// out. docs/getting-started.md walks through it. Runs on the GPU when one is
// usable, else on the host simulator (GPUMEM_BACKEND=sim forces it).
#include <gpumem/backend.hpp>
#include <gpumem/current_resource.hpp>
#include <gpumem/device.hpp>
#include <gpumem/device_buffer.hpp>
#include <gpumem/error.hpp>
#include <gpumem/stream.hpp>
#include <gpumem/vmm_pool_resource.hpp>

#include <cstdio>
#include <numeric>
#include <vector>

int main() {
  try {
    // 0. The GPU when the driver and a device are there, else the simulator
    //    (GPUMEM_BACKEND=cuda or sim decides instead when set).
    const gpumem::backend_kind backend = gpumem::select_backend(gpumem::backend_choice::cuda_or_sim);
    std::printf("backend: %s\n", backend == gpumem::backend_kind::sim ? "the host simulator" : "the CUDA driver");

    // 1. A stream of device 0 and that device's default resource (GPUMEM_CONF
    //    unset): a pool that holds little more than the bytes in use.
    gpumem::stream s{0};
    std::shared_ptr<gpumem::memory_resource> mr = gpumem::get_current_resource(0);

    // 2. A buffer of a million ints, filled from the host and read back, all
    //    queued on the stream.
    std::vector<int> host(1 << 20);
    std::iota(host.begin(), host.end(), 0);
    const std::size_t bytes = host.size() * sizeof(int);
    gpumem::device_buffer buf{host.data(), bytes, s};  // a copy of host memory, from the default resource
    std::vector<int> back(host.size());
    buf.copy_to(back.data(), bytes, s);
    s.synchronize();
    std::printf("round trip of %zu bytes: %s\n", bytes, back == host ? "equal" : "DIFFERENT");

    // 3. Growing keeps the contents.
    buf.resize(2 * bytes, s);
    std::printf("resized to %zu bytes\n", buf.size());

    // 4. What the default pool holds (where it is the virtual-memory pool).
    if (auto* pool = dynamic_cast<gpumem::vmm_pool_resource*>(mr.get())) {
      const gpumem::vmm_pool_statistics st = pool->statistics();
      std::printf("the pool: %zu bytes in use, %zu bytes of memory held in %zu pages\n", st.used_bytes,
                  st.mapped_bytes, st.pages);
    }

    // 5. Asking for more than the device has: a typed error that says why, and
    //    the pool is still usable afterwards.
    try {
      gpumem::device_buffer too_big{gpumem::device_memory_info(0).total_bytes * 2, s};
    } catch (const gpumem::out_of_memory& e) {
      std::printf("out_of_memory, as expected: %.120s...\n", e.what());
    }
    buf.release();
    s.synchronize();
    return back == host ? 0 : 1;
  } catch (const gpumem::driver_unavailable& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
