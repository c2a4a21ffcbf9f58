"""gpumem as Numba's device memory manager: an NBEP 7 External Memory Management plugin.

Use it with either

    NUMBA_CUDA_MEMORY_MANAGER=gpumem.numba python app.py

or, before Numba first touches the GPU,

    import gpumem.numba
    gpumem.numba.use_gpumem_for_numba()

Numba then takes every device allocation from the current gpumem resource of the
context's device (by default gpumem's pool), so Numba shares one pool with CuPy and
PyTorch when they use gpumem too. Numba keeps managing pinned and mapped host memory
(the plugin derives from ``numba.cuda.HostOnlyCUDAMemoryManager``).

Behaviour (docs/python.md, "Numba"):

- ``memalloc(size)`` allocates on Numba's default stream (the legacy default stream,
  or the per-thread one under ``NUMBA_CUDA_PER_THREAD_DEFAULT_STREAM=1``) and returns
  a ``MemoryPointer`` whose finalizer frees through gpumem on that stream. Size 0
  gives a null pointer and allocates nothing, as Numba itself does for empty arrays.
- ``defer_cleanup()`` holds back the frees of device memory too while it is active,
  and frees what it held when the outermost one exits.
- ``reset()`` frees every device allocation this context made through the plugin.
- ``get_ipc_handle()`` uses legacy CUDA IPC of the base allocation plus the offset of
  the sub-allocation on the real driver; other memory, and the simulator, get gpumem's own
  handle wrapped in a numba ``IpcHandle`` subclass (docs/ipc.md).
"""

import contextlib
import threading
import weakref

from numba import cuda as _cuda
from numba.cuda.cudadrv import driver as _numba_driver

import gpumem
from gpumem import _core

__all__ = ["GpumemNumbaManager", "use_gpumem_for_numba"]

# numba-cuda >= 0.21 takes device pointers as cuda.bindings.driver.CUdeviceptr;
# Numba 0.56 (ctypes binding) as ctypes.c_uint64. The ctypes binding advertises
# itself with USE_NV_BINDING = False; newer numba-cuda has no such flag.
_USE_NV_BINDING = getattr(_numba_driver, "USE_NV_BINDING", True)
if _USE_NV_BINDING:
    from cuda.bindings import driver as _cu

    _device_pointer = _cu.CUdeviceptr
else:  # pragma: no cover - Numba 0.56 only
    import ctypes

    _cu = None
    _device_pointer = ctypes.c_uint64

_SUPPORTED_INTERFACE_VERSION = 1


def _default_stream():
    config = getattr(_numba_driver, "config", None)
    if getattr(config, "CUDA_PER_THREAD_DEFAULT_STREAM", 0):
        return gpumem.PER_THREAD_DEFAULT_STREAM
    return 0  # the legacy default stream


class GpumemNumbaManager(_cuda.HostOnlyCUDAMemoryManager):
    """Numba EMM plugin allocating device memory from gpumem (one instance per context)."""

    def __init__(self, *args, **kwargs):
        # Numba also builds one with context=None just to read interface_version,
        # so nothing here may touch CUDA.
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self._live = {}  # id(buffer) -> gpumem.DeviceBuffer, for reset()
        self._deferred = []  # buffers whose free defer_cleanup() holds back
        self._defer_depth = 0
        self._stream = _default_stream()
        self._device = None
        self._context_proxy = None
        self._initialized = False

    # ---- the EMM plugin interface ---------------------------------------------

    @property
    def interface_version(self):
        return _SUPPORTED_INTERFACE_VERSION

    def initialize(self):
        # Called on every push of the context: cheap once done.
        if self._initialized:
            return
        if isinstance(self.context, _numba_driver.Context) and gpumem.current_backend() != "cuda":
            raise gpumem.LogicError(
                "gpumem.numba: gpumem runs on the '%s' backend but Numba uses a real GPU; "
                "unset GPUMEM_BACKEND (or set it to 'cuda')" % gpumem.current_backend()
            )
        gpumem.get_current_resource(self._device_id())  # the device's pool, made now
        self._initialized = True

    def memalloc(self, size):
        context = self._context_proxy
        if context is None:
            context = self._bind()
        if size == 0:
            return _cuda.MemoryPointer(context, _device_pointer(0), 0)
        buffer = _core.DeviceBuffer(size, self._stream, device=self._device)
        key = id(buffer)
        self._live[key] = buffer
        return _cuda.MemoryPointer(
            context, _device_pointer(buffer.ptr), size, finalizer=self._finalizer(key, buffer)
        )

    def get_memory_info(self):
        """Free and total bytes of the context's device: what the device has free plus what
        gpumem's resource holds free. NotImplementedError (gpumem.UnsupportedError) where
        the current resource cannot say."""
        free, total = gpumem.memory_info(self._device_id())
        return _cuda.MemoryInfo(free=free, total=total)

    def get_ipc_handle(self, memory):
        """An IPC handle of `memory` that Numba's ``IpcHandle.open``/``open_array`` and pickling
        accept. On the real driver, memory from cuMemAlloc (gpumem's pool and CudaResource) gets
        Numba's own legacy handle of the base allocation with the offset of `memory` in it;
        anything else (the simulator, the driver's pools, virtual memory) gets a
        ``GpumemIpcHandle`` carrying gpumem's handle (docs/ipc.md)."""
        pointer = int(memory.handle)
        if gpumem.current_backend() == "cuda" and _USE_NV_BINDING:
            err, base, _ = _cu.cuMemGetAddressRange(_cu.CUdeviceptr(pointer))
            _check(err, "cuMemGetAddressRange", pointer)
            err, handle = _cu.cuIpcGetMemHandle(base)
            if err == _cu.CUresult.CUDA_SUCCESS:
                source_info = self.context.device.get_device_identity()
                return _cuda.IpcHandle(memory, handle, memory.size, source_info, offset=pointer - int(base))
        from . import ipc as gpumem_ipc

        return _gpumem_ipc_handle_class()(memory, gpumem_ipc.export(pointer, memory.size))

    def reset(self):
        """Frees every device allocation of this context made through the plugin (and, through
        the base class, Numba's host allocations). Pointers Numba still holds become dangling,
        as with Numba's own reset; their finalizers then do nothing.

        Numba resets a context on its own and before it resets the device
        (``numba.cuda.close()``), which destroys every allocation, stream and event of the
        primary context that gpumem shares. So the device's default resource is dropped too:
        the next allocation builds a fresh one, and the old pool, once nobody holds memory
        from it, gives its chunks back now. A resource the program chose with
        set_current_resource is kept."""
        super().reset()
        with self._lock:
            buffers = list(self._live.values()) + self._deferred
            self._live.clear()
            self._deferred = []
        for b in buffers:
            b.close()
        if self.context is not None:
            device = self._device_id()
            if device not in gpumem._chosen_by_caller:
                _core.set_current_resource(None, device)
        self._initialized = False

    @contextlib.contextmanager
    def defer_cleanup(self):
        """While active, device frees are held back (the memory stays allocated) and done when
        the outermost defer_cleanup exits; Numba's host deallocations are deferred as well."""
        with super().defer_cleanup():
            with self._lock:
                self._defer_depth += 1
            try:
                yield
            finally:
                with self._lock:
                    self._defer_depth -= 1
                    held = []
                    if self._defer_depth == 0:
                        held, self._deferred = self._deferred, []
                for b in held:
                    b.close()

    # ---- helpers ---------------------------------------------------------------

    def _device_id(self):
        if self._device is None:
            device = self.context.device
            # Numba's own contexts carry a numba Device; a context Numba attached to
            # (a third party's, Test3rdPartyContext) may carry the driver's CUdevice.
            ident = getattr(device, "id", None)
            self._device = int(ident if ident is not None else device)
        return self._device

    def _bind(self):
        # The first allocation: resolve what every later one reuses.
        self._device_id()
        self._context_proxy = weakref.proxy(self.context)
        return self._context_proxy

    def _finalizer(self, key, buffer):
        live = self._live

        def free():
            live.pop(key, None)
            if self._defer_depth:
                with self._lock:
                    if self._defer_depth:
                        self._deferred.append(buffer)
                        return
            # close() is a no-op for a buffer reset() already freed; at interpreter exit
            # the buffer still owns its resource, so the free is harmless.
            buffer.close()

        return free


_GPUMEM_IPC_HANDLE = None


def _gpumem_ipc_handle_class():
    """numba's IpcHandle, opened through gpumem (built on first use: numba is imported lazily)."""
    global _GPUMEM_IPC_HANDLE
    if _GPUMEM_IPC_HANDLE is not None:
        return _GPUMEM_IPC_HANDLE

    class GpumemIpcHandle(_cuda.IpcHandle):
        def __init__(self, base, gpumem_handle):
            # `handle.reserved` is the handle's bytes, where Numba's legacy handle has the
            # driver's 64: what pickling keeps and what Numba's own tests compare.
            super().__init__(base, _HandleBytes(gpumem_handle.to_bytes()), gpumem_handle.size, None, offset=0)
            self._gpumem = gpumem_handle
            self._memory = None

        def open(self, context):
            """Maps the memory for the context's device: another device than the
            memory's own gets peer access (gpumem.UnsupportedError where the devices
            cannot reach each other), so no staging through the host is needed."""
            if self.base is not None:
                raise ValueError("opening IpcHandle from original process")
            if self._memory is not None:
                raise ValueError("IpcHandle is already opened")
            device = getattr(context.device, "id", context.device)
            self._memory = self._gpumem.open(device=int(device))
            return _cuda.MemoryPointer(context, _device_pointer(self._memory.ptr), self.size)

        open_staged = open
        open_direct = open

        def close(self):
            if self._memory is None:
                raise ValueError("IpcHandle not opened")
            self._memory.close()
            self._memory = None

        def __reduce__(self):
            return (_rebuild_gpumem_ipc_handle, (self._gpumem.to_bytes(),))

    _GPUMEM_IPC_HANDLE = GpumemIpcHandle
    return GpumemIpcHandle


class _HandleBytes:
    """A gpumem IPC handle's bytes, where Numba keeps a CUipcMemHandle (``.reserved``)."""

    def __init__(self, data):
        self.reserved = data


def _rebuild_gpumem_ipc_handle(data):
    from . import ipc as gpumem_ipc

    return _gpumem_ipc_handle_class()(None, gpumem_ipc.IpcHandle.from_bytes(data))


def _check(err, api, pointer):
    if err != _cu.CUresult.CUDA_SUCCESS:
        error = gpumem.CudaError(
            "gpumem.numba.get_ipc_handle: %s failed with %s for pointer 0x%x (legacy IPC works "
            "only for memory from cuMemAlloc, which gpumem's pool and CudaResource use)"
            % (api, err.name, pointer)
        )
        error.result, error.error_name, error.api = int(err), err.name, api
        raise error


def use_gpumem_for_numba():
    """Makes Numba allocate device memory through gpumem. Call it before Numba creates its
    CUDA context (its first GPU operation); a context that already exists keeps its manager."""
    _cuda.set_memory_manager(GpumemNumbaManager)


# What NUMBA_CUDA_MEMORY_MANAGER=gpumem.numba looks for.
_numba_memory_manager = GpumemNumbaManager
