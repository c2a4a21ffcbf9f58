// Internal access to ipc_handle and ipc_mapping for the export and import code.
#pragma once

#include <string>

#include "gpumem/error.hpp"
#include "gpumem/ipc.hpp"

namespace gpumem::detail {

struct ipc_access {
  using piece = ipc_handle::piece;
  static ipc_kind& kind(ipc_handle& h) { return h.kind_; }
  static std::size_t& size(ipc_handle& h) { return h.size_; }
  static std::size_t& offset(ipc_handle& h) { return h.offset_; }
  static int& device(ipc_handle& h) { return h.device_; }
  static std::array<unsigned char, 16>& uuid(ipc_handle& h) { return h.uuid_; }
  static pid_t& pid(ipc_handle& h) { return h.pid_; }
  static std::vector<std::byte>& driver_bytes(ipc_handle& h) { return h.driver_bytes_; }
  static std::vector<piece>& pieces(ipc_handle& h) { return h.pieces_; }
  static const std::vector<piece>& pieces(const ipc_handle& h) { return h.pieces_; }

  static ipc_mapping make_mapping(void* ptr, std::size_t size, int device, int user_device, ipc_kind kind,
                                  std::uintptr_t base, std::size_t mapped_bytes, std::uintptr_t cache_key) {
    ipc_mapping m;
    m.ptr_ = ptr;
    m.size_ = size;
    m.device_ = device;
    m.user_device_ = user_device;
    m.kind_ = kind;
    m.base_ = base;
    m.mapped_bytes_ = mapped_bytes;
    m.cache_key_ = cache_key;
    return m;
  }
};

// Closes a mapping's driver resources (ipc_import.cpp).
void ipc_unmap(ipc_kind kind, int device, std::uintptr_t base, std::size_t mapped_bytes, std::uintptr_t cache_key);

// Every device's UUID in this process, by ordinal.
std::array<unsigned char, 16> device_uuid(int device);

[[noreturn]] inline void throw_ipc(ipc_errc code, const std::string& message) { throw ipc_error(code, message); }

}  // namespace gpumem::detail
