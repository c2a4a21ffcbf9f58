"""The wheel's console scripts start the bundled command-line tools (pip puts them on the
PATH of the environment: docs/python.md, "Installing")."""

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("tool", ["gpumem-report", "gpumem-replay"])
def test_console_script_runs_the_bundled_tool(tool):
    script = os.path.join(os.path.dirname(sys.executable), tool)
    if not os.path.exists(script):
        pytest.skip("gpumem is not pip-installed in this environment (no %s beside python)" % tool)
    done = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert tool in done.stdout + done.stderr
