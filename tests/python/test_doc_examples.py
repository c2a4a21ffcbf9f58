"""The Python user guide's examples run as written: every ```python block of docs/python.md,
docs/python-frameworks.md and docs/python-observability.md, each in its own interpreter,
in a scratch folder (they write log files), on this test run's backend.

A block that needs something optional says so on its first line:

    # needs: numba, gpu

Each need is a module the block imports (numba, numba_cuda_mlir, cupy, torch, dask) or
`gpu`: gpumem's backend is "cuda" (asked in a child process, as the block would see it).
The block is skipped, saying which need is missing, unless all are met. Blocks that are
not meant to run (shell commands, output) are ```bash or ```text blocks, never ```python;
a fence of any other kind fails here, so that no example escapes the test by its label.
"""

import os
import re

import pytest
from conftest import run_python

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GUIDES = ("python.md", "python-frameworks.md", "python-observability.md")
FENCES = ("python", "bash", "text", "cpp")  # the kinds of block the guides may hold

# A need -> the modules a child process must import for it.
MODULES = {
    "numba": ("numba.cuda",),
    "numba_cuda_mlir": ("numba_cuda_mlir.cuda",),
    "cupy": ("cupy",),
    "torch": ("torch",),
    "dask": ("dask", "distributed"),
}
NEEDS_LINE = re.compile(r"#\s*needs:\s*(.*)")


def guide_blocks(name):
    """(guide, section, fence, text) of every fenced block of the guide, in order; `section`
    is the nearest heading above the block."""
    blocks, section, fence, body = [], "(top)", None, []
    with open(os.path.join(ROOT, "docs", name), encoding="utf-8") as f:
        for line in f:
            if fence is None:
                if line.startswith("```"):
                    fence, body = line[3:].strip(), []
                elif line.startswith("#"):
                    section = line.lstrip("#").strip()
            elif line.rstrip() == "```":
                blocks.append((name, section, fence, "".join(body)))
                fence = None
            else:
                body.append(line)
    assert fence is None, "%s: a ``` block is not closed" % name
    return blocks


ALL_BLOCKS = [b for name in GUIDES for b in guide_blocks(name)]
EXAMPLES = [b for b in ALL_BLOCKS if b[2] == "python"]


def needs_of(text):
    first = text.lstrip("\n").split("\n", 1)[0]
    m = NEEDS_LINE.fullmatch(first.strip())
    return [n.strip() for n in m.group(1).split(",") if n.strip()] if m else []


def example_id(index):
    name, section, _fence, _text = EXAMPLES[index]
    return "%s:%s:%d" % (name, re.sub(r"\W+", "-", section).strip("-"), index + 1)


_probes = {}


def _child_says(code):
    """What a fresh interpreter with this run's environment prints for `code` (cached)."""
    if code not in _probes:
        done = run_python(code, timeout=300)
        _probes[code] = done.stdout.strip() if done.returncode == 0 else None
    return _probes[code]


def missing_need(need):
    """Why `need` is not met here, or None when it is."""
    if need == "gpu":
        backend = _child_says("import gpumem; print(gpumem.current_backend())")
        return None if backend == "cuda" else "needs a GPU (gpumem's backend here is %r)" % backend
    for module in MODULES[need]:
        if _child_says("import %s; print('ok')" % module) != "ok":
            return "needs %s (%s is not importable)" % (need, module)
    return None


def test_the_guides_have_examples():
    per_guide = {name: sum(1 for b in EXAMPLES if b[0] == name) for name in GUIDES}
    assert per_guide["python.md"] >= 13, per_guide
    assert per_guide["python-observability.md"] >= 5, per_guide
    assert per_guide["python-frameworks.md"] >= 11, per_guide
    # Some examples of each guide run everywhere, the simulator included.
    for name in GUIDES:
        assert any(b[0] == name and "gpu" not in needs_of(b[3]) for b in EXAMPLES), name


def test_every_block_is_a_known_kind():
    odd = ["%s, %r: ```%s" % (name, section, fence) for name, section, fence, _ in ALL_BLOCKS
           if fence not in FENCES]
    assert not odd, "blocks of another kind (examples must be ```python):\n" + "\n".join(odd)


def test_every_need_is_a_known_one():
    unknown = ["%s: %s" % (example_id(i), n) for i, b in enumerate(EXAMPLES) for n in needs_of(b[3])
               if n != "gpu" and n not in MODULES]
    assert not unknown, "unknown needs (known: gpu, %s): %s" % (", ".join(MODULES), unknown)


@pytest.mark.parametrize("index", range(len(EXAMPLES)), ids=example_id)
def test_example_runs(index, tmp_path):
    name, section, _fence, text = EXAMPLES[index]
    needs = needs_of(text)
    unknown = [n for n in needs if n != "gpu" and n not in MODULES]
    assert not unknown, "%s: unknown needs %s" % (example_id(index), unknown)
    reasons = [r for r in map(missing_need, needs) if r]
    if reasons:
        pytest.skip("; ".join(reasons))
    code = "import os\nos.chdir(%r)\n" % str(tmp_path) + text
    done = run_python(code, timeout=300)
    assert done.returncode == 0, "example %d of docs/%s, %r (exit status %d):\n%s\n%s%s" % (
        index + 1, name, section, done.returncode, text, done.stdout, done.stderr)
