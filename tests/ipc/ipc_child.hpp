// The importing side of the multi-process IPC tests: the test binary re-executes itself
// with --gpumem-ipc-child (ipc_test_main.cpp), receives a handle over the inherited
// socket, checks what the parent wrote, writes its own pattern and reports back.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gpumem_test {

// What the exporter writes, and what the importer writes back.
inline std::uint8_t parent_byte(std::size_t i) { return static_cast<std::uint8_t>(i * 7 + 1); }
inline std::uint8_t child_byte(std::size_t i) { return static_cast<std::uint8_t>(i * 13 + 5); }

// Runs the child's side: argv after --gpumem-ipc-child is <mode> <socket fd>. Returns
// the exit status.
int run_ipc_child(int argc, char** argv);

}  // namespace gpumem_test
