"""Importing gpumem touches no CUDA and pulls in none of numba, cupy and torch."""

import os
import re

import pytest

from conftest import run_python


def test_import_pulls_in_no_framework():
    p = run_python(
        "import sys, gpumem\n"
        "b = gpumem.DeviceBuffer(4096)\n"
        "b.copy_from_host(bytes(4096))\n"
        "b.close()\n"
        "bad = [m for m in ('numba', 'cupy', 'torch') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "ok"


def test_import_selects_no_backend():
    # A bogus GPUMEM_BACKEND is only read when gpumem is first used: importing works,
    # the first use reports the bad setting.
    p = run_python(
        "import gpumem\n"
        "try:\n"
        "    gpumem.current_backend()\n"
        "except gpumem.LogicError as e:\n"
        "    print('LogicError:', e)\n",
        env={"GPUMEM_BACKEND": "bogus"},
    )
    assert p.returncode == 0, p.stderr
    assert "LogicError: GPUMEM_BACKEND='bogus' is not a backend" in p.stdout


def test_import_loads_no_cuda_library():
    p = run_python(
        "import gpumem\n"
        "maps = open('/proc/self/maps').read()\n"
        "print('libcuda' in maps)\n",
        env={"GPUMEM_BACKEND": "cuda"},
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False"


def test_wheel_layout():
    import gpumem

    here = os.path.dirname(gpumem.__file__)
    names = os.listdir(here)
    assert "libgpumem.so" in names
    assert "libgpumem_torch.so" in names
    assert any(n.startswith("_core.") and n.endswith(".so") for n in names)


def test_version_matches_package_metadata():
    from importlib.metadata import version

    import gpumem

    assert gpumem.__version__ == version("gpumem")


def test_the_package_is_typed():
    import importlib.resources

    root = importlib.resources.files("gpumem")
    if not (root / "_core.pyi").is_file():
        pytest.skip("gpumem is not installed from its wheel here (no stubs beside the extension)")
    assert (root / "py.typed").is_file()
    stubs = (root / "_core.pyi").read_text()
    # Stubs made on Python 3.9 spell Optional[int] and List[str].
    stubs = re.sub(r"Optional\[(\w+)\]", r"\1 | None", stubs).replace("List[", "list[")
    for name in ("class VmmPoolResource", "class DeviceBuffer", "def make_resource", "def peers_of"):
        assert name in stubs, name
    # Every resource and adaptor, and the capabilities every stack answers.
    for cls in ("AsyncResource", "AsyncReusePolicy", "ManagedResource", "PinnedHostResource",
                "HostRegistration", "ResourceAdaptor", "StatisticsAdaptor", "StatisticsScope",
                "TrackingAdaptor", "LoggingAdaptor", "LimitingAdaptor", "OomRetryAdaptor", "OomEvent",
                "DeferredFreeAdaptor", "DeferCleanup", "ThreadSafeAdaptor"):
        assert "class %s" % cls in stubs, cls
    for method in ("def available_bytes(self) -> int | None", "def release_free_memory(self) -> int",
                   "def layers(self) -> list[str]", "def find_layer(self, name: str)",
                   "def layer_name(self) -> str", "def add_callback(self, callback"):
        assert method in stubs, method


def test_every_public_name_has_a_docstring():
    import inspect
    import re

    import gpumem

    signature = re.compile(r"^\s*[\w.]*\(.*\)( -> .*)?$")  # what nanobind puts before a docstring

    def described(obj):
        doc = obj.__doc__ if not isinstance(obj, property) else (obj.__doc__ or (obj.fget and obj.fget.__doc__))
        return any(line.strip() and not signature.match(line) for line in (doc or "").splitlines())

    protocols = ("__init__", "__enter__", "__exit__", "__dlpack__", "__dlpack_device__",
                 "__cuda_array_interface__", "__cuda_stream__")
    missing = []
    for name in gpumem.__all__:
        obj = getattr(gpumem, name)
        if isinstance(obj, (int, str, gpumem.ProfileRecords)):
            continue
        if not described(obj):
            missing.append(name)
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            for member, value in vars(obj).items():
                if member.startswith("_") and member not in protocols:
                    continue
                if not described(value):
                    missing.append(name + "." + member)
    for name in dir(gpumem.sim):
        if not name.startswith("_") and not described(getattr(gpumem.sim, name)):
            missing.append("sim." + name)
    assert missing == []


def test_the_installed_package_says_its_license():
    from importlib import metadata

    try:
        md = metadata.metadata("gpumem")
    except metadata.PackageNotFoundError:
        pytest.skip("gpumem is not pip-installed here")
    classifiers = md.get_all("Classifier") or []
    assert "License :: OSI Approved :: Apache Software License" in classifiers
    assert "Apache License" in (md.get("License") or "")
    assert md.get("Requires-Python") == ">=3.9"
