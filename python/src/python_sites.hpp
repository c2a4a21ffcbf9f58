// Python call sites for the tracking adaptor (python_sites.cpp; Note [Python call sites]).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "gpumem/adaptors/tracking.hpp"

namespace gpumem::python {

struct python_frame {
  std::string filename;
  int line = 0;
  std::string name;  // the function's (code object's) name
};

// The hooks that record the calling Python stack, up to `stack_depth` frames of the
// program's code (gpumem's own modules left out). Needs the GIL (the first call
// registers the end of capture at interpreter exit).
tracking_site_hooks python_site_hooks(int stack_depth);

// A site's frames, innermost first; one "(no Python frame)" frame for a call from a
// thread with none; empty for 0 or an unknown id. Any thread, no GIL needed.
std::vector<python_frame> python_site_frames(std::uint64_t site);

// gpumem._core._python_site_frames (for gpumem.snapshot).
void bind_python_sites(nb::module_& m);

}  // namespace gpumem::python
