// Peers that live in plugin libraries (plugin_api.hpp): RMM's resources and
// PyTorch's caching allocator. Their rows are in subjects.cpp like any other;
// each row is available only where its plugin was built, loads, serves it, and
// a GPU is in use (the plugins call the CUDA runtime, which the simulator does
// not serve). Otherwise the row is left out and the run's header says why.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "bench.hpp"
#include "peers/plugin_api.hpp"

namespace gpumem::bench::peers {

// A fresh allocator of `row` from the plugin library `file`, as a memory_resource.
std::shared_ptr<memory_resource> make_plugin_peer(const char* file, const char* row, int device);

// Whether `row` of `file` can run here; when not, `why` says why.
bool plugin_peer_available(const char* file, const char* row, std::string& why);

// The versions of the plugin libraries that loaded ("RMM 26.10.0"), for the
// header; empty on the simulator, where no plugin is loaded.
std::vector<std::string> loaded_peer_libraries();

template <const char* File, const char* Row>
struct plugin_row {
  static std::shared_ptr<memory_resource> make(int device) { return make_plugin_peer(File, Row, device); }
  static bool available(std::string& why) { return plugin_peer_available(File, Row, why); }
};

// subjects.cpp's line for a plugin row.
template <const char* File, const char* Row>
constexpr subject plugin_subject() {
  return {Row, subject_kind::peer, &plugin_row<File, Row>::make, &plugin_row<File, Row>::available};
}

}  // namespace gpumem::bench::peers
