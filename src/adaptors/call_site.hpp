// Stack traces and allocation sites for the tracking and logging adaptors.
// Capture is cheap (glibc's backtrace(): frame addresses only); turning an
// address into a name (dladdr, demangling) is done only when a report asks.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace gpumem::detail {

// Return addresses of the calling thread's stack, innermost first, leaving out
// the frames inside libgpumem itself (the adaptors' own calls).
std::vector<void*> capture_stack(int max_frames);

// The first return address outside libgpumem, or null.
void* caller_outside_gpumem();

// "function(args)+0x1c (libfoo.so)" or "libfoo.so+0x1234" where the symbol is not
// exported (link executables with -rdynamic to see their functions' names).
// Results are cached per address.
std::string describe_frame(void* address);

}  // namespace gpumem::detail
