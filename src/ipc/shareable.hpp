// What an export refusal names as the memory that can be shared (ipc_export.cpp and
// the resources' ipc_route).
#pragma once

namespace gpumem::detail {

inline constexpr const char* shareable_resources =
    "cuda_resource, pool_resource over cuda_resource, async_resource with async_options::ipc = "
    "async_ipc_handle::posix_file_descriptor, or vmm_pool_resource with posix_fd_shareable = true";

}  // namespace gpumem::detail
