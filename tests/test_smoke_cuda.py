"""On a machine with an NVIDIA GPU and a CUDA build of torch: the simulated NPU host hides CUDA.

On a CPU build (CI, the developers' machines) CUDA fails by construction and `test_smoke_host.py`
checks the messages; these checks need a visible GPU, so they run only where there is one (the
project's GPU test machine: `python -m pytest -q tests/test_smoke_cuda.py`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a visible NVIDIA GPU and CUDA torch"),
]

PROBE = textwrap.dedent(
    """
    import json, sys
    import torch
    out = {"built": torch.backends.cuda.is_built()}  # asks nothing of the driver, which must not start yet
    from npu_migrate.verify import npu_host
    if sys.argv[1] == "late":
        torch.cuda.init()
        try:
            npu_host.install()
        except npu_host.HostError as exc:
            out["refused"] = str(exc)
        print("PROBE" + json.dumps(out))
        raise SystemExit
    npu_host.install()
    def outcome(fn):
        try:
            return repr(fn())
        except BaseException as exc:
            return type(exc).__name__ + ": " + str(exc)
    out["is_available"] = torch.cuda.is_available()
    out["capability"] = outcome(lambda: torch.cuda.get_device_capability())
    out["tensor"] = outcome(lambda: torch.zeros(1, device="cuda"))
    out["method"] = outcome(lambda: torch.ones(1).cuda())
    # Below the patched Python functions, the driver sees no GPU either.
    out["driver_count"] = torch._C._cuda_getDeviceCount()
    out["npu"] = str((torch.ones(2, device="npu") * 2).device)
    print("PROBE" + json.dumps(out))
    """
)


def _probe(mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    proc = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env=env, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("PROBE")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("PROBE") :])


def test_gpus_are_hidden_as_on_a_cpu_build():
    out = _probe("early")
    assert out["built"] is True
    assert out["is_available"] is False
    for key in ("capability", "tensor", "method"):
        assert out[key] == "AssertionError: Torch not compiled with CUDA enabled", key
    assert out["driver_count"] == 0
    assert out["npu"] == "npu:0"


def test_refuses_once_cuda_is_initialised():
    out = _probe("late")
    assert "CUDA was initialised" in out["refused"]
