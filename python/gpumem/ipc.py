"""Sharing device memory between processes (docs/ipc.md).

Exporter::

    handle = gpumem.ipc.export(buf)          # a DeviceBuffer, or (pointer, size)
    queue.put(handle)                        # picklable: multiprocessing, spawn included

Importer::

    with handle.open() as mem:               # mem.ptr, mem.size, __cuda_array_interface__
        ...

Every kind of gpumem memory goes through one interface: cuMemAlloc memory (CudaResource,
PoolResource) by legacy CUDA IPC with the offset in its base allocation, the driver's
shareable pools by pool export, shareable virtual memory by file descriptors. A pickled
handle carries bytes only; for the descriptor kinds the importer takes the descriptors
from the exporting process with ``pidfd_getfd`` (Linux 5.6+, same user, ptrace access), so
**the exporter must keep its handle object alive until the importers have opened it**.
"""

from . import _core

__all__ = ["IpcHandle", "IpcMemory", "export", "open"]


class IpcMemory:
    """Another process's memory mapped in this one: a 1-D ``uint8`` CUDA array.
    ``close()`` (or leaving a ``with`` block) waits for the device, then unmaps."""

    def __init__(self, mapping):
        self._mapping = mapping

    @property
    def ptr(self):
        """The address of the memory in this process."""
        return self._mapping.ptr

    @property
    def size(self):
        """Bytes mapped (the exported allocation's size)."""
        return self._mapping.size

    @property
    def device(self):
        """The device whose memory it is."""
        return self._mapping.device

    @property
    def user_device(self):
        """The device the memory was opened for (``open(device=...)``)."""
        return self._mapping.user_device

    @property
    def closed(self):
        """True once ``close()`` unmapped it."""
        return self._mapping.closed

    @property
    def __cuda_array_interface__(self):
        if self._mapping.closed:
            raise ValueError("gpumem.ipc: the memory is closed")
        return {
            "shape": (self._mapping.size,),
            "typestr": "|u1",
            "data": (self._mapping.ptr, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }

    def copy_to_host(self):
        """The bytes, copied synchronously."""
        return self._mapping.copy_to_host()

    def copy_from_host(self, data):
        """Overwrites the memory with ``data`` (exactly ``size`` bytes), synchronously."""
        self._mapping.copy_from_host(bytes(data))

    def close(self):
        """Waits for the device, then unmaps the memory; a second call does nothing."""
        self._mapping.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _rebuild(data):
    return IpcHandle(_core._IpcHandle.deserialize(data), data)


class IpcHandle:
    """An exported allocation. Pickles to its bytes; ``open()`` maps it in another process."""

    def __init__(self, handle, data=None, keepalive=None):
        self._handle = handle
        self._bytes = data if data is not None else handle.serialize()
        self._keepalive = keepalive  # the exported buffer, so it outlives the handle here

    @property
    def kind(self):
        """``"legacy"``, ``"pool"`` or ``"vmm"``."""
        return self._handle.kind

    @property
    def size(self):
        """Bytes of the exported allocation."""
        return self._handle.size

    @property
    def offset(self):
        """Offset of the exported pointer in what the driver exports (legacy: its base allocation)."""
        return self._handle.offset

    @property
    def exporter_pid(self):
        """The process id of the exporter (the memory lives as long as it keeps it)."""
        return self._handle.exporter_pid

    def to_bytes(self):
        """The handle as bytes, to send to another process by any means."""
        return bytes(self._bytes)

    @classmethod
    def from_bytes(cls, data):
        """The handle that ``to_bytes()`` gave; ``gpumem.LogicError`` for bytes that are not one."""
        return _rebuild(bytes(data))

    def __reduce__(self):
        return (_rebuild, (bytes(self._bytes),))

    def open(self, device=None):
        """Maps the memory here (in another process than the exporter's), for ``device``
        (default: the memory's own device; another one gets peer access, or
        ``gpumem.UnsupportedError`` says why not: the devices cannot access each other)."""
        return IpcMemory(_core._ipc_import(self._handle, -1 if device is None else int(device)))


def export(obj, size=None):
    """Exports a ``DeviceBuffer`` (or an object with ``ptr`` and ``size``), or ``(pointer, size)``
    given as ``export(pointer, size)``. The buffer stays alive while the handle does."""
    if isinstance(obj, int):
        if size is None:
            raise TypeError("gpumem.ipc.export(pointer, size): the size is needed with a raw pointer")
        return IpcHandle(_core._ipc_export(obj, size))
    ptr, nbytes = int(obj.ptr), int(obj.size if size is None else size)
    return IpcHandle(_core._ipc_export(ptr, nbytes), keepalive=obj)


def open(handle, device=None):  # noqa: A001 - the module's verb, as in gpumem.ipc.open(handle)
    """``handle.open(device)``: maps an ``IpcHandle`` (or its bytes) here."""
    if isinstance(handle, (bytes, bytearray)):
        handle = IpcHandle.from_bytes(handle)
    return handle.open(device)
