"""The Python examples that docs/getting-started.md walks through run as written (in a
process of their own: each selects its backend)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_first_allocation_runs_and_round_trips():
    script = os.path.join(ROOT, "examples", "python", "first_allocation.py")
    done = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "round trip of 4194304 bytes: equal" in done.stdout, done.stdout
    assert "OutOfMemoryError, as expected" in done.stdout, done.stdout


def test_numba_example_runs_or_says_what_it_needs():
    script = os.path.join(ROOT, "examples", "python", "numba_through_gpumem.py")
    done = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "y = 2 x + 1: equal" in done.stdout or "needs " in done.stdout, done.stdout
