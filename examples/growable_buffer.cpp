// A buffer that grows like std::vector without copying: gpumem::growable_buffer
// reserves an address range once and maps physical memory at its end as it grows,
// so the contents stay where they are and nothing is copied; shrink_to_fit gives
// the unused tail back. docs/vmm.md has the design. Runs on the GPU when one is
// usable, else on the host simulator.
#include <gpumem/backend.hpp>
#include <gpumem/copy.hpp>
#include <gpumem/error.hpp>
#include <gpumem/stream.hpp>
#include <gpumem/vmm/growable_buffer.hpp>
#include <gpumem/vmm/virtual_memory.hpp>

#include <cstdio>
#include <vector>

int main() {
  try {
    const auto backend = gpumem::select_backend(gpumem::backend_choice::cuda_or_sim);
    std::printf("backend: %s\n", backend == gpumem::backend_kind::sim ? "the host simulator" : "the CUDA driver");
    if (!gpumem::vmm::supported(0)) {
      std::printf("device 0 has no virtual memory management: nothing to show\n");
      return 0;
    }
    gpumem::stream s{0};
    gpumem::growable_buffer buf(0, s);

    // 1 MiB of known bytes at the start.
    const std::size_t head = std::size_t{1} << 20;
    std::vector<unsigned char> host(head);
    for (std::size_t i = 0; i < head; ++i) host[i] = static_cast<unsigned char>(i * 7);
    buf.resize(head);
    gpumem::copy(buf.data(), host.data(), head, s);
    const void* where = buf.data();

    // Grow to 1 GiB in doubling steps: no copy, and (within the reservation) no move.
    for (std::size_t size = 2 * head; size <= (std::size_t{1} << 30); size *= 2) buf.resize(size);
    std::printf("grew to %zu bytes, %zu of them mapped; %s\n", buf.size(), buf.capacity(),
                buf.data() == where ? "same address" : "moved to a new range (no copy either way)");

    // The first MiB is what it was.
    std::vector<unsigned char> back(head);
    gpumem::copy(back.data(), buf.data(), head, s);
    s.synchronize();
    std::printf("contents %s\n", back == host ? "kept" : "CHANGED");

    // Back to 1 MiB, and the tail's memory goes back to the device.
    buf.resize(head);
    buf.shrink_to_fit();
    std::printf("shrunk to %zu bytes, %zu mapped\n", buf.size(), buf.capacity());
    return back == host ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpumem-example-growable: %s\n", e.what());
    return 1;
  }
}
