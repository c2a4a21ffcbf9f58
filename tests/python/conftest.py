"""pytest set-up for gpumem's Python tests.

The tests run on whatever backend gpumem selects: GPUMEM_BACKEND when set (CI sets
'sim'), else the real GPU when one is usable and the simulator otherwise. Tests that
need one backend say so with the `sim_only` and `gpu_only` markers.
"""

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

import gpumem

if not os.environ.get("GPUMEM_BACKEND"):
    gpumem.select_backend("cuda_or_sim")
BACKEND = gpumem.current_backend()


def pytest_report_header(config):
    devices = gpumem.device_count()
    name = gpumem.device_name(0) if devices else "no device"
    return "gpumem %s on the %s backend: %d device(s), device 0 %s" % (
        gpumem.__version__,
        BACKEND,
        devices,
        name,
    )


def pytest_configure(config):
    config.addinivalue_line("markers", "sim_only: needs the host simulator (fault injection, ...)")
    config.addinivalue_line("markers", "gpu_only: needs a real GPU")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "sim_only" in item.keywords and BACKEND != "sim":
            item.add_marker(pytest.mark.skip(reason="needs the simulator backend"))
        if "gpu_only" in item.keywords and BACKEND != "cuda":
            item.add_marker(pytest.mark.skip(reason="needs a GPU (cuda backend)"))


@pytest.fixture
def pool():
    """The current resource of device 0 (gpumem's default pool unless a test replaced it)."""
    return gpumem.get_current_resource(0)


@pytest.fixture
def fresh_pool():
    """A new PoolResource made current for device 0 for the test, then the previous one back."""
    new = gpumem.PoolResource(gpumem.CudaResource(0))
    previous = gpumem.set_current_resource(new, 0)
    yield new
    gpumem.set_current_resource(previous, 0)


def run_python(code, env=None, timeout=120):
    """Runs `code` in a fresh interpreter with this test run's backend; returns the process."""
    full_env = dict(os.environ)
    full_env.setdefault("GPUMEM_BACKEND", BACKEND)
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=timeout
    )


class StandInDevice:
    def __init__(self, ordinal):
        self.id = ordinal

    def get_device_identity(self):
        return {"pci_domain_id": 0, "pci_bus_id": self.id, "pci_device_id": 0}


class StandInContext:
    """The attributes of a Numba runtime's Context (numba.cuda's or Numba CUDA MLIR's)
    that the gpumem.numba plugin uses: tests/python/test_numba_plugin.py and
    test_numba_runtimes.py build managers over it without a real context."""

    def __init__(self, ordinal=0):
        self.device = StandInDevice(ordinal)


_cuda_torch = []


def need_cuda_torch():
    """Skips unless this backend is a GPU and PyTorch, with CUDA, can use it."""
    if BACKEND != "cuda":
        pytest.skip("needs a GPU (cuda backend); this run is on %r" % BACKEND)
    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs PyTorch (not installed)")
    if not _cuda_torch:
        probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                               capture_output=True, text=True, timeout=300)
        _cuda_torch.append(probe.stdout.strip() == "True")
    if not _cuda_torch[0]:
        pytest.skip("needs PyTorch built with CUDA and a device it can use")


def run_torch(tmp_path, source):
    """Runs `source` in a fresh interpreter with gpumem as PyTorch's allocator (chosen
    once per process); skips without a GPU and PyTorch. Returns what it printed."""
    need_cuda_torch()
    script = tmp_path / "check.py"
    script.write_text("import torch, gpumem, gpumem.torch as gt\ngt.use_gpumem_for_torch()\n"
                      + textwrap.dedent(source))
    done = run_python("import runpy; runpy.run_path(%r, run_name='__main__')" % str(script), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout
