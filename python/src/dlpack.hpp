// The DLPack ABI (https://github.com/dmlc/dlpack, include/dlpack/dlpack.h), the
// part gpumem produces: a one-dimensional uint8 tensor in CUDA device memory,
// as a legacy DLManagedTensor ("dltensor" capsule) or, for consumers that ask
// for DLPack >= 1.0, a DLManagedTensorVersioned ("dltensor_versioned").
// These layouts are fixed by the DLPack ABI; do not reorder.
#pragma once

#include <cstdint>

namespace gpumem::python::dlpack {

inline constexpr std::uint32_t major_version = 1;
inline constexpr std::uint32_t minor_version = 1;

enum device_type : std::int32_t { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3 };
enum dtype_code : std::uint8_t { kDLInt = 0, kDLUInt = 1, kDLFloat = 2 };

struct DLDevice {
  std::int32_t device_type;
  std::int32_t device_id;
};

struct DLDataType {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};

struct DLTensor {
  void* data;
  DLDevice device;
  std::int32_t ndim;
  DLDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;
  std::uint64_t byte_offset;
};

struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

struct DLPackVersion {
  std::uint32_t major;
  std::uint32_t minor;
};

struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  std::uint64_t flags;
  DLTensor dl_tensor;
};

}  // namespace gpumem::python::dlpack
