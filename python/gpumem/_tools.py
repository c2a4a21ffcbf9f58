"""The console scripts ``gpumem-report`` and ``gpumem-replay``: they start the tools
bundled in the wheel (gpumem/bin), with the same arguments (docs/observability.md)."""

import os
import sys


def _run(name):
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", name)
    if not os.access(path, os.X_OK):
        sys.stderr.write(
            "%s: not in this installation of gpumem (%s is missing). The wheel bundles the "
            "tools when CLI11 and nlohmann/json were found at build time (Debian/Ubuntu: "
            "libcli11-dev nlohmann-json3-dev); install them and reinstall gpumem\n" % (name, path)
        )
        return 2
    os.execv(path, [name] + sys.argv[1:])
    return 1  # not reached: execv replaces the process


def report():
    return _run("gpumem-report")


def replay():
    return _run("gpumem-replay")
