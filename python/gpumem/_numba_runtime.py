"""Which Numba CUDA runtime gpumem.numba serves: numba-cuda (``numba.cuda``) or Numba CUDA
MLIR (``numba_cuda_mlir.cuda``, PyPI ``numba-cuda-mlir``), found without importing the other.

Note [One plugin module, two runtimes]
Both runtimes implement NBEP 7 with the same classes: Numba CUDA MLIR carries its own copy of
numba-cuda's driver (``numba_cuda_mlir.numba_cuda.cudadrv.driver``), re-exported from
``numba_cuda_mlir.cuda`` (BaseCUDAMemoryManager, HostOnlyCUDAMemoryManager, MemoryPointer,
MemoryInfo, IpcHandle, set_memory_manager), with the same host-memory entry points
(memhostalloc, mempin, memallocmanaged) and the same selection: the environment variable
NUMBA_CUDA_MEMORY_MANAGER names a module, whose ``_numba_memory_manager`` the runtime's driver
reads when it makes its first context, or ``set_memory_manager(cls)`` takes the class. The
classes are copies, not shared: a plugin must derive from the HostOnlyCUDAMemoryManager of the
runtime that uses it and hand back that runtime's MemoryPointer, MemoryInfo and IpcHandle.

So gpumem.numba builds its plugin class once per runtime, on first use, from one set of
methods, and imports neither runtime when it is imported itself. The runtime is chosen by
1. the module that reads ``_numba_memory_manager``: a runtime's driver (the caller's frame)
   gets the class for its own runtime, so with both runtimes loaded in one process and the
   environment variable set, each gets its own plugin;
2. else (``GpumemNumbaManager``, ``use_gpumem_for_numba()`` without an argument) the runtime
   already imported: ``numba.cuda``, or ``numba_cuda_mlir``; numba-cuda when both are;
3. else the runtime installed: numba-cuda, else numba-cuda-mlir, else an older Numba's own
   ``numba.cuda``. Passing the runtime's cuda module to use_gpumem_for_numba or manager_class
   chooses explicitly.
"""

import importlib
import importlib.util
import sys
import threading

NUMBA_CUDA = "numba-cuda"
NUMBA_CUDA_MLIR = "numba-cuda-mlir"

# name -> (its cuda module, its driver module, prefixes of its modules' names)
_SPECS = {
    NUMBA_CUDA_MLIR: ("numba_cuda_mlir.cuda", "numba_cuda_mlir.numba_cuda.cudadrv.driver", ("numba_cuda_mlir.",)),
    NUMBA_CUDA: ("numba.cuda", "numba.cuda.cudadrv.driver", ("numba.", "numba_cuda.")),
}


class Runtime:
    """One Numba CUDA runtime: its name, its ``cuda`` module and its driver module."""

    def __init__(self, name, cuda, driver):
        self.name = name
        self.cuda = cuda
        self.driver = driver
        # numba-cuda >= 0.21 and Numba CUDA MLIR take device pointers as cuda.bindings'
        # CUdeviceptr; Numba 0.56 (the ctypes binding) says USE_NV_BINDING = False and takes
        # ctypes.c_uint64. Newer runtimes have no such flag.
        self.nv_binding = getattr(driver, "USE_NV_BINDING", True)
        if self.nv_binding:
            from cuda.bindings import driver as cu

            self.device_pointer = cu.CUdeviceptr
        else:  # pragma: no cover - Numba 0.56 only
            import ctypes

            self.device_pointer = ctypes.c_uint64

    def __repr__(self):
        return "<gpumem.numba runtime %s (%s)>" % (self.name, self.cuda.__name__)


_loaded = {}
_lock = threading.Lock()


def load(name):
    """The Runtime `name`, importing its modules the first time."""
    runtime = _loaded.get(name)
    if runtime is None:
        cuda_name, driver_name, _ = _SPECS[name]
        cuda = importlib.import_module(cuda_name)
        driver = importlib.import_module(driver_name)
        with _lock:
            runtime = _loaded.setdefault(name, Runtime(name, cuda, driver))
    return runtime


def name_of_module(module_name):
    """The runtime a module of this name belongs to, or None."""
    for name, (_, _, prefixes) in _SPECS.items():  # numba-cuda-mlir first: "numba_cuda_mlir." is not "numba_cuda."
        if module_name in (p[:-1] for p in prefixes) or module_name.startswith(prefixes):
            return name
    return None


def of_cuda_module(cuda):
    """The Runtime whose cuda module is `cuda` (numba.cuda or numba_cuda_mlir.cuda)."""
    name = name_of_module(getattr(cuda, "__name__", ""))
    if name is None:
        raise TypeError(
            "gpumem.numba: %r is not a Numba CUDA runtime's cuda module (numba.cuda or numba_cuda_mlir.cuda)" % (cuda,)
        )
    return load(name)


def _imported(name):
    return ("numba_cuda_mlir" if name == NUMBA_CUDA_MLIR else "numba.cuda") in sys.modules


def _spec(module_name):
    try:
        return importlib.util.find_spec(module_name) is not None
    except (ImportError, ValueError):
        return False


def _installed():
    # numba-cuda installs the top-level package numba_cuda; Numba before numba-cuda had
    # numba.cuda inside numba itself, which is tried last (finding it imports numba).
    names = []
    if _spec("numba_cuda"):
        names.append(NUMBA_CUDA)
    if _spec("numba_cuda_mlir"):
        names.append(NUMBA_CUDA_MLIR)
    if NUMBA_CUDA not in names and _spec("numba"):
        names.append(NUMBA_CUDA)
    return names


def available():
    """Whether any runtime is imported or installed (finds packages, imports nothing)."""
    return any(_imported(n) for n in _SPECS) or bool(_installed())


def detect(caller=None):
    """The runtime to serve (Note [One plugin module, two runtimes]): the one `caller` (a
    module name) belongs to, else the one imported, else the one installed."""
    if caller:
        name = name_of_module(caller)
        if name is not None:
            return load(name)
    for name in (NUMBA_CUDA, NUMBA_CUDA_MLIR):
        if _imported(name):
            return load(name)
    errors = []
    for name in _installed():
        try:
            return load(name)
        except ImportError as e:  # e.g. a Numba without CUDA support
            errors.append("%s: %s" % (name, e))
    raise ImportError(
        "gpumem.numba needs a Numba CUDA runtime: numba-cuda (numba.cuda) or numba-cuda-mlir "
        "(numba_cuda_mlir.cuda)" + ("; " + "; ".join(errors) if errors else "")
    )
