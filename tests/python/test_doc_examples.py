"""The examples of docs/python.md's "Compose a stack" section run as written: each
```python block in its own interpreter, in a scratch folder (they write log files), on this
test run's backend."""

import os
import re

import pytest
from conftest import run_python

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECTION = "Compose a stack"


def section_blocks(path, title):
    text = open(path, encoding="utf-8").read()
    start = text.index("\n## %s\n" % title)
    end = text.find("\n## ", start + 1)
    section = text[start:end if end >= 0 else len(text)]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


BLOCKS = section_blocks(os.path.join(ROOT, "docs", "python.md"), SECTION)


def test_the_section_has_examples():
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_runs(index, tmp_path):
    code = "import os\nos.chdir(%r)\n" % str(tmp_path) + BLOCKS[index]
    done = run_python(code, timeout=120)
    assert done.returncode == 0, "example %d of %r:\n%s\n%s%s" % (
        index + 1, SECTION, BLOCKS[index], done.stdout, done.stderr)
