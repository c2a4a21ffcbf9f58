"""gpumem as Numba's memory manager: an NBEP 7 External Memory Management plugin for
numba-cuda (``numba.cuda``) and for Numba CUDA MLIR (``numba_cuda_mlir.cuda``).

Use it with either

    NUMBA_CUDA_MEMORY_MANAGER=gpumem.numba python app.py

or, before the runtime first touches the GPU,

    import gpumem.numba
    gpumem.numba.use_gpumem_for_numba()          # or use_gpumem_for_numba(numba_cuda_mlir.cuda)

The runtime then takes every device allocation from the current gpumem resource of the
context's device (by default gpumem's pool), so it shares one pool with CuPy and PyTorch
when they use gpumem too. Pinned, mapped and managed host memory come from gpumem as well
(PinnedHostResource, HostRegistration, ManagedResource).

The plugin class is built per runtime, from the runtime that asks for it, and importing
this module imports neither (Note [One plugin module, two runtimes] in _numba_runtime.py).

Behaviour (docs/python-frameworks.md, "Numba"):

- ``memalloc(size)`` allocates on the runtime's default stream (the legacy default stream,
  or the per-thread one under ``NUMBA_CUDA_PER_THREAD_DEFAULT_STREAM=1``) and returns
  a ``MemoryPointer`` whose finalizer frees through gpumem on that stream. Size 0
  gives a null pointer and allocates nothing, as Numba itself does for empty arrays.
- ``memhostalloc``, ``mempin`` and ``memallocmanaged`` use gpumem's driver resources and
  return the runtime's PinnedMemory, MappedMemory and ManagedMemory.
- ``defer_cleanup()`` holds back the frees of device, pinned and managed memory while it
  is active, and frees what it held when the outermost one exits.
- ``reset()`` frees every device, mapped and managed allocation this context made.
- ``get_ipc_handle()`` uses legacy CUDA IPC of the base allocation plus the offset of
  the sub-allocation on the real driver; other memory, and the simulator, get gpumem's own
  handle wrapped in an ``IpcHandle`` subclass (docs/ipc.md).
"""

import contextlib
import ctypes
import sys
import threading
import weakref

import gpumem
from gpumem import _core

from . import _numba_runtime

__all__ = ["GpumemNumbaManager", "manager_class", "use_gpumem_for_numba"]

if not _numba_runtime.available():
    # ModuleNotFoundError, as `from numba import cuda` would raise: what is missing is a module.
    raise ModuleNotFoundError(
        "gpumem.numba needs a Numba CUDA runtime: numba-cuda (numba.cuda) or numba-cuda-mlir (numba_cuda_mlir.cuda)",
        name="numba.cuda",
    )

_SUPPORTED_INTERFACE_VERSION = 1


def _default_stream(runtime):
    config = getattr(runtime.driver, "config", None)
    if getattr(config, "CUDA_PER_THREAD_DEFAULT_STREAM", 0):
        return gpumem.PER_THREAD_DEFAULT_STREAM
    return 0  # the legacy default stream


class _Plugin:
    """The plugin's methods; manager_class() puts them in front of a runtime's
    HostOnlyCUDAMemoryManager (one instance per context)."""

    _runtime = None  # set on each built class, with the two below
    _ipc_handle_class = None
    _mapped_memory_class = None

    def __init__(self, *args, **kwargs):
        # The runtime also builds one with context=None just to read interface_version,
        # so nothing here may touch CUDA.
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self._live = {}  # id(buffer) -> gpumem.DeviceBuffer (mapped, managed) whose memory reset() frees
        self._deferred = []  # buffers whose free defer_cleanup() holds back
        self._defer_depth = 0
        self._stream = _default_stream(self._runtime)
        self._allocations = _core.NumbaAllocations(int(self._stream))  # device memory
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
        if isinstance(self.context, self._runtime.driver.Context) and gpumem.current_backend() != "cuda":
            raise gpumem.LogicError(
                "gpumem.numba: gpumem runs on the '%s' backend but %s uses a real GPU; "
                "unset GPUMEM_BACKEND (or set it to 'cuda')" % (gpumem.current_backend(), self._runtime.name)
            )
        gpumem.get_current_resource(self._device_id())  # the device's pool, made now
        self._initialized = True

    def memalloc(self, size):
        context = self._context_proxy
        if context is None:
            context = self._bind()
        pointer = self._runtime.device_pointer
        if size == 0:
            return self._runtime.cuda.MemoryPointer(context, pointer(0), 0)
        # Note [Numba allocations in C++] (python/src/numba_allocations.cpp): the runtime's
        # own pointer, with a finalizer that frees when the pointer goes.
        allocation = self._allocations.allocate(size)
        mem = self._runtime.cuda.MemoryPointer(context, pointer(allocation.ptr), size)
        mem.is_managed = True
        mem._finalizer = allocation
        return mem

    def memhostalloc(self, size, mapped=False, portable=False, wc=False):
        """Pinned host memory from a gpumem.PinnedHostResource of the context's device with
        the same flags; mapped memory is also reachable from the device."""
        runtime = self._runtime
        if not runtime.nv_binding:  # pragma: no cover - Numba 0.56 keeps its own
            return super().memhostalloc(size, mapped, portable, wc)
        context = self._context_proxy if self._context_proxy is not None else self._bind()
        resource = _host_resource(self._device, "pinned", bool(mapped), bool(portable), bool(wc))
        buffer = _core.DeviceBuffer(size, self._stream, resource=resource)
        if not mapped:
            # Held only by what the runtime builds over it (a numpy array); reset() leaves
            # it, as the runtime's own manager does.
            return runtime.driver.PinnedMemory(context, buffer.ptr, size, finalizer=self._finalizer(None, buffer))
        key = id(buffer)
        self._live[key] = buffer
        device_address = resource.device_pointer(buffer.ptr) if size else 0
        mem = self._mapped_memory_class(
            context, buffer.ptr, runtime.device_pointer(device_address), size, finalizer=self._finalizer(key, buffer)
        )
        self.allocations[key] = mem  # the runtime's pointers hold it weakly, as its own manager does
        return mem.own()

    def mempin(self, owner, pointer, size, mapped=False):
        """Page-locks the host range [pointer, pointer + size) of `owner` with a
        gpumem.HostRegistration for as long as the returned object lives."""
        runtime = self._runtime
        if not runtime.nv_binding:  # pragma: no cover - Numba 0.56 keeps its own
            return super().mempin(owner, pointer, size, mapped)
        context = self._context_proxy if self._context_proxy is not None else self._bind()
        registration = None
        if size:
            # The exact range the runtime asks for, not the whole of owner's buffer.
            memory = (ctypes.c_char * size).from_address(pointer)
            registration = gpumem.HostRegistration(memory, mapped=bool(mapped), device=self._device)
        if not mapped:
            unpin = self._unpin(None, registration)
            return runtime.driver.PinnedMemory(context, pointer, size, owner=owner, finalizer=unpin)
        key = object()  # unique while the memory lives: the finalizer holds it
        device_address = registration.device_pointer if registration is not None else 0
        mem = self._mapped_memory_class(
            context,
            pointer,
            runtime.device_pointer(device_address),
            size,
            owner=owner,
            finalizer=self._unpin(key, registration),
        )
        self.allocations[key] = mem
        return mem.own()

    def memallocmanaged(self, size, attach_global=True):
        """Managed memory from a gpumem.ManagedResource of the context's device."""
        runtime = self._runtime
        if not runtime.nv_binding:  # pragma: no cover - Numba 0.56 keeps its own
            return super().memallocmanaged(size, attach_global)
        context = self._context_proxy if self._context_proxy is not None else self._bind()
        resource = _host_resource(self._device, "managed", bool(attach_global))
        buffer = _core.DeviceBuffer(size, self._stream, resource=resource)
        key = id(buffer)
        self._live[key] = buffer
        mem = runtime.driver.ManagedMemory(
            context, runtime.device_pointer(buffer.ptr), size, finalizer=self._finalizer(key, buffer)
        )
        self.allocations[key] = mem
        return mem.own()

    def get_memory_info(self):
        """Free and total bytes of the context's device: what the device has free plus what
        gpumem's resource holds free. NotImplementedError (gpumem.UnsupportedError) where
        the current resource cannot say."""
        free, total = gpumem.memory_info(self._device_id())
        return self._runtime.cuda.MemoryInfo(free=free, total=total)

    def get_ipc_handle(self, memory):
        """An IPC handle of `memory` that the runtime's ``IpcHandle.open``/``open_array`` and
        pickling accept. On the real driver, memory from cuMemAlloc (gpumem's pool and
        CudaResource) gets the runtime's own legacy handle of the base allocation with the
        offset of `memory` in it; anything else (the simulator, the driver's pools, virtual
        memory) gets a ``GpumemIpcHandle`` carrying gpumem's handle (docs/ipc.md)."""
        pointer = int(memory.handle)
        if gpumem.current_backend() == "cuda" and self._runtime.nv_binding:
            from cuda.bindings import driver as cu

            err, base, _ = cu.cuMemGetAddressRange(cu.CUdeviceptr(pointer))
            _check(cu, err, "cuMemGetAddressRange", pointer)
            err, handle = cu.cuIpcGetMemHandle(base)
            if err == cu.CUresult.CUDA_SUCCESS:
                source_info = self.context.device.get_device_identity()
                return self._runtime.cuda.IpcHandle(
                    memory, handle, memory.size, source_info, offset=pointer - int(base)
                )
        from . import ipc as gpumem_ipc

        return self._ipc_handle_class(memory, gpumem_ipc.export(pointer, memory.size))

    def reset(self):
        """Frees every device, mapped and managed allocation of this context made through the
        plugin. Pointers the runtime still holds become dangling, as with its own reset;
        their finalizers then do nothing.

        Numba resets a context on its own and before it resets the device
        (``numba.cuda.close()``), which destroys every allocation, stream and event of the
        primary context that gpumem shares. So the device's default resource is dropped too:
        the next allocation builds a fresh one, and the old pool, once nobody holds memory
        from it, gives its chunks back now. A resource the program chose with
        set_current_resource is kept. The plugin's pinned and managed resources of the
        device are made anew as well."""
        super().reset()  # drops the mapped and managed memory the base class holds
        self._allocations.free_all()
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
            _drop_host_resources(device)
        self._initialized = False

    @contextlib.contextmanager
    def defer_cleanup(self):
        """While active, frees of device, pinned and managed memory are held back (the memory
        stays allocated) and done when the outermost defer_cleanup exits; the base class's
        own deallocations are deferred as well."""
        with super().defer_cleanup():
            with self._lock:
                self._defer_depth += 1
            self._allocations.defer_begin()
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
                self._allocations.defer_end()

    # ---- helpers ---------------------------------------------------------------

    def _device_id(self):
        if self._device is None:
            device = self.context.device
            # The runtime's own contexts carry its Device; a context it attached to
            # (a third party's, Test3rdPartyContext) may carry the driver's CUdevice.
            ident = getattr(device, "id", None)
            self._device = int(ident if ident is not None else device)
        return self._device

    def _bind(self):
        # The first allocation: resolve what every later one reuses.
        self._allocations.device = self._device_id()
        self._context_proxy = weakref.proxy(self.context)
        return self._context_proxy

    def _finalizer(self, key, buffer):
        live, allocations = self._live, self.allocations

        def free():
            if key is not None:
                live.pop(key, None)
                if allocations:
                    allocations.pop(key, None)
            if self._defer_depth:
                with self._lock:
                    if self._defer_depth:
                        self._deferred.append(buffer)
                        return
            # close() is a no-op for a buffer reset() already freed; at interpreter exit
            # the buffer still owns its resource, so the free is harmless.
            buffer.close()

        return free

    def _unpin(self, key, registration):
        allocations = self.allocations

        def unpin():
            # At once, never deferred: the runtime's own manager lifts page-locking as soon
            # as the memory is dropped, so that the same memory can be pinned again.
            if key is not None and allocations:
                allocations.pop(key, None)
            if registration is not None:
                try:
                    registration.close()
                except gpumem.LogicError:
                    pass  # the driver no longer knows the range: a device reset unpinned it

        return unpin


_classes = {}
_lock = threading.Lock()


def manager_class(cuda=None):
    """The plugin class for a runtime: `cuda` is its cuda module (``numba.cuda`` or
    ``numba_cuda_mlir.cuda``); None chooses as Note [One plugin module, two runtimes] says."""
    runtime = _numba_runtime.detect() if cuda is None else _numba_runtime.of_cuda_module(cuda)
    return _class_for(runtime)


def _class_for(runtime):
    cls = _classes.get(runtime.name)
    if cls is None:
        with _lock:
            cls = _classes.get(runtime.name)
            if cls is None:
                cls = _classes[runtime.name] = _build(runtime)
    return cls


def _build(runtime):
    class GpumemNumbaManager(_Plugin, runtime.cuda.HostOnlyCUDAMemoryManager):
        __doc__ = "%s EMM plugin allocating from gpumem (one instance per context)." % runtime.name
        _runtime = runtime
        _ipc_handle_class = _build_ipc_handle_class(runtime)
        _mapped_memory_class = _build_mapped_memory_class(runtime)

    GpumemNumbaManager.__module__ = __name__
    GpumemNumbaManager.__qualname__ = "GpumemNumbaManager"
    return GpumemNumbaManager


def _build_mapped_memory_class(runtime):
    driver = runtime.driver

    class GpumemMappedMemory(driver.MappedMemory):
        """The runtime's MappedMemory over host memory gpumem pinned and mapped: the device
        address comes from gpumem, so no call of the runtime's driver is needed."""

        def __init__(self, context, host_pointer, device_pointer, size, owner=None, finalizer=None):
            # What MappedMemory.__init__ sets, with gpumem's device address.
            self.owned = owner
            self.host_pointer = host_pointer
            self._bufptr_ = host_pointer
            self.device_pointer = device_pointer
            driver.AutoFreePointer.__init__(self, context, device_pointer, size, finalizer=finalizer)
            self.handle = host_pointer
            self._buflen_ = self.size

    GpumemMappedMemory.__module__ = __name__
    return GpumemMappedMemory


def _build_ipc_handle_class(runtime):
    """The runtime's IpcHandle, opened through gpumem."""

    class GpumemIpcHandle(runtime.cuda.IpcHandle):
        def __init__(self, base, gpumem_handle):
            # `handle.reserved` is the handle's bytes, where the runtime's legacy handle has the
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
            return runtime.cuda.MemoryPointer(context, runtime.device_pointer(self._memory.ptr), self.size)

        open_staged = open
        open_direct = open

        def close(self):
            if self._memory is None:
                raise ValueError("IpcHandle not opened")
            self._memory.close()
            self._memory = None

        def __reduce__(self):
            return (_rebuild_gpumem_ipc_handle, (self._gpumem.to_bytes(), runtime.name))

    GpumemIpcHandle.__module__ = __name__
    return GpumemIpcHandle


class _HandleBytes:
    """A gpumem IPC handle's bytes, where the runtime keeps a CUipcMemHandle (``.reserved``)."""

    def __init__(self, data):
        self.reserved = data


def _rebuild_gpumem_ipc_handle(data, runtime_name=None):
    from . import ipc as gpumem_ipc

    runtime = _numba_runtime.detect() if runtime_name is None else _numba_runtime.load(runtime_name)
    return _class_for(runtime)._ipc_handle_class(None, gpumem_ipc.IpcHandle.from_bytes(data))


def _check(cu, err, api, pointer):
    if err != cu.CUresult.CUDA_SUCCESS:
        error = gpumem.CudaError(
            "gpumem.numba.get_ipc_handle: %s failed with %s for pointer 0x%x (legacy IPC works "
            "only for memory from cuMemAlloc, which gpumem's pool and CudaResource use)"
            % (api, err.name, pointer)
        )
        error.result, error.error_name, error.api = int(err), err.name, api
        raise error


# The plugin's pinned and managed resources: (device, kind, options) -> resource.
_host_resources = {}


def _host_resource(device, kind, *options):
    key = (device, kind) + options
    resource = _host_resources.get(key)
    if resource is None:
        with _lock:
            resource = _host_resources.get(key)
            if resource is None:
                if kind == "pinned":
                    mapped, portable, wc = options
                    resource = gpumem.PinnedHostResource(
                        device, portable=portable, device_mapped=mapped, write_combined=wc
                    )
                else:
                    resource = gpumem.ManagedResource(device, attach="global" if options[0] else "host")
                _host_resources[key] = resource
    return resource


def _drop_host_resources(device):
    # After a device reset the old resources' context is gone; memory still out keeps its
    # own resource alive (a DeviceBuffer holds it).
    with _lock:
        for key in [k for k in _host_resources if k[0] == device]:
            del _host_resources[key]


def use_gpumem_for_numba(cuda=None):
    """Makes a Numba CUDA runtime allocate through gpumem: `cuda` is its cuda module
    (``numba.cuda`` or ``numba_cuda_mlir.cuda``); None: the runtime already imported, else
    the one installed (numba-cuda first). Call it before the runtime creates its CUDA
    context (its first GPU operation); a context that already exists keeps its manager."""
    cls = manager_class(cuda)
    cls._runtime.cuda.set_memory_manager(cls)


def __getattr__(name):
    if name == "_numba_memory_manager":
        # What NUMBA_CUDA_MEMORY_MANAGER=gpumem.numba looks for: the runtime's driver reads
        # it, and gets the class built against that runtime.
        caller = sys._getframe(1).f_globals.get("__name__", "")
        return _class_for(_numba_runtime.detect(caller))
    if name == "GpumemNumbaManager":
        return manager_class()
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def __dir__():
    return sorted(set(globals()) | {"GpumemNumbaManager", "_numba_memory_manager"})
