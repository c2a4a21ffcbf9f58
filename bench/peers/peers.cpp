// Helpers shared by the raw driver peers (peers.hpp).
#include "peers/peers.hpp"

#include <string>

#include "gpumem/device.hpp"
#include "gpumem/error.hpp"

namespace gpumem::bench::peers {

void ensure_current_device(int device) {
  thread_local int current = -1;
  if (current != device) [[unlikely]] {
    set_current_device(device);
    current = device;
  }
}

void require_driver_alignment(std::size_t alignment, const char* peer) {
  if (alignment > default_alignment) [[unlikely]] {
    throw logic_error(std::string(peer) + ": alignment " + std::to_string(alignment) +
                      " is more than the driver's 256 bytes");
  }
}

}  // namespace gpumem::bench::peers
