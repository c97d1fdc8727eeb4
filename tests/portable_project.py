"""The `portable_train` fixture project: migrated with `--target portable` and trained as one process of a
torchrun world of one. Shared by `test_portable.py` (CPU, simulated NPU host) and `test_portable_cuda.py`
(a CUDA GPU), which must run the same code on each host."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent / "fixtures" / "projects" / "portable_train"


def apply(*args: str) -> subprocess.CompletedProcess:
    """`npu-migrate apply ARGS` in a fresh interpreter, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "npu_migrate", "apply", *args], capture_output=True, text=True)


def migrate(base: Path, *options: str) -> tuple[Path, Path, str]:
    """A copy of the project under `base` ("original") and its portable migration ("migrated"), with the
    tool's report."""
    original, migrated = base / "original", base / "migrated"
    shutil.copytree(PROJECT, original)
    proc = apply(str(original), "--target", "portable", *options, "--output", str(migrated))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return original, migrated, proc.stdout


def train(folder: Path, *args: str, env: dict[str, str] | None = None, host: str = "") -> dict:
    """The RESULT line of `train.py ARGS` run in `folder`, with the environment torchrun gives a world of one
    (so the process group is made, with the backend the code picks). `host`: Python code run first, in the same
    interpreter (a simulated host)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    world = {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    entry = (
        ["train.py"] if not host else ["-c", f"{host}\nimport runpy\nrunpy.run_path('train.py', run_name='__main__')"]
    )
    proc = subprocess.run(
        [sys.executable, *entry, *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **world, **(env or {})},
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])
