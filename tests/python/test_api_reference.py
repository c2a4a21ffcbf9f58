"""docs/api-python.md, written by scripts/api-reference, names every public name of the
package, and every public name has a docstring: a public name added without either
fails here (run `scripts/api-reference > docs/api-python.md` again)."""

import importlib.util
import inspect
import pathlib

import gpumem

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_loader(
        "api_reference", importlib.machinery.SourceFileLoader("api_reference", str(ROOT / "scripts" / "api-reference"))
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REFERENCE = (ROOT / "docs" / "api-python.md").read_text()


def test_every_public_name_of_gpumem_is_documented_and_listed():
    gen = _generator()
    undocumented, missing = [], []
    for name, obj in gen.public_members_of_core(gpumem):
        if callable(obj):
            _signature, text = gen._nanobind_entry(name, obj)
            if not text.strip():
                undocumented.append(name)
        if f"`{name}" not in REFERENCE:
            missing.append(name)
    assert not undocumented, f"no docstring: {undocumented}"
    assert not missing, f"not in docs/api-python.md: {missing}"


def test_every_method_of_the_extensions_classes_is_documented():
    gen = _generator()
    undocumented = []
    for name, cls in gen.public_members_of_core(gpumem):
        if not inspect.isclass(cls):
            continue
        for member, value in vars(cls).items():
            if member.startswith("_") or not callable(value):
                continue
            _signature, text = gen._nanobind_entry(member, value)
            if not text.strip():
                undocumented.append(f"{name}.{member}")
    assert not undocumented, f"no docstring: {undocumented}"


def test_every_public_name_of_the_python_modules_is_documented_and_listed():
    gen = _generator()
    undocumented, missing = [], []
    for module in gen.MODULES:
        doc, entries = gen.module_entries(gen.PACKAGE / f"{module}.py")
        assert doc, f"gpumem.{module} has no module docstring"
        assert f"## gpumem.{module}" in REFERENCE
        for _kind, name, _signature, text in entries:
            if not (text or "").strip():
                undocumented.append(f"gpumem.{module}.{name}")
            if f"`{name.split('.')[0]}" not in REFERENCE:
                missing.append(f"gpumem.{module}.{name}")
    assert not undocumented, f"no docstring: {undocumented}"
    assert not missing, f"not in docs/api-python.md: {missing}"


def test_the_generator_reads_the_framework_modules_without_importing_them():
    import sys

    before = set(sys.modules)
    gen = _generator()
    for module in gen.MODULES:
        gen.module_entries(gen.PACKAGE / f"{module}.py")
    new = {m for m in set(sys.modules) - before if m.split(".")[0] in ("numba", "cupy", "torch", "distributed", "dask")}
    assert not new, f"imported: {sorted(new)}"
