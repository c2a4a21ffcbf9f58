"""The torchrun / torch.multiprocessing recipe (examples/python/torch_ranks.py,
docs/distributed.md): two ranks on one GPU, each through gpumem within its half of the
budget, with a log per rank. Needs PyTorch and a GPU (skipped otherwise, as in CI)."""

import os
import socket
import subprocess
import sys

import pytest

from conftest import BACKEND

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "python", "torch_ranks.py")

pytestmark = pytest.mark.gpu_only


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _check(done, logs):
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "2 ranks (" in done.stdout, out
    rows = [line.split() for line in done.stdout.splitlines() if line[:1].isdigit() and "MiB" in line]
    assert [r[0] for r in rows] == ["0", "1"], out
    assert all(r[-1] == "refused" for r in rows), out  # a request past the budget names it
    pids = {r[1] for r in rows}
    assert len(pids) == 2
    for rank, pid in ((r[0], r[1]) for r in rows):
        path = os.path.join(logs, "gpumem-rank%s-%s.csv" % (rank, pid))
        assert os.path.exists(path), (path, os.listdir(logs))
        with open(path) as f:
            assert sum(1 for line in f if ",app,allocate," in line) > 10


def _env():
    env = dict(os.environ)
    env.setdefault("GPUMEM_BACKEND", BACKEND)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def test_two_ranks_on_one_gpu_with_torch_multiprocessing(tmp_path):
    pytest.importorskip("torch")
    logs = str(tmp_path)
    done = subprocess.run(
        [sys.executable, SCRIPT, "--nprocs", "2", "--log-folder", logs, "--port", str(_free_port())],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
    )
    _check(done, logs)


def test_two_ranks_on_one_gpu_with_torchrun(tmp_path):
    pytest.importorskip("torch")
    logs = str(tmp_path)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(_free_port()),
            SCRIPT,
            "--log-folder",
            logs,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
    )
    _check(done, logs)
