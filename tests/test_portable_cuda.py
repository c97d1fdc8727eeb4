"""Issue #17 on a CUDA host: the portable migration of `portable_train` picks CUDA and trains as the original did.

Runs only where torch sees an NVIDIA GPU (the project's GPU machine: `python -m pytest -q
tests/test_portable_cuda.py`); elsewhere `test_portable.py` checks the CPU and simulated NPU hosts.

The project is migrated with `--torch-version 2.11.0`, the oldest torch the GPU machine is known to have, so the
migrated code uses nothing newer. Both trees train in fresh interpreters, as one process of a torchrun world of
one, with the same seed and cuBLAS's deterministic workspace setting: float32 training must be bit-identical
(the same kernels in the same order on the same device); bf16 autocast with loss scaling is compared to a
relative 1e-6 (it is deterministic on one GPU too, but the claim this test makes is "the same training", not a
statement about cuBLAS's bf16 reduction order).
"""

from __future__ import annotations

import math

import pytest
import torch
from portable_project import migrate, train

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a visible NVIDIA GPU and a CUDA build of torch"),
]

DETERMINISTIC = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return migrate(tmp_path_factory.mktemp("portable_train_cuda"), "--torch-version", "2.11.0")


def _floats(values: list[str]) -> list[float]:
    return [float.fromhex(v) for v in values]


def test_the_migrated_project_picks_cuda_and_trains_bit_identically(project):
    original, migrated, _ = project
    before, after = train(original, env=DETERMINISTIC), train(migrated, env=DETERMINISTIC)
    assert after["device"] == "cuda" and after["eval_device"] == "cuda"
    assert after["backend"] == "nccl"
    assert after["devices"] == torch.cuda.device_count()
    assert after == before


def test_the_migrated_project_trains_with_amp_as_the_original(project):
    original, migrated, _ = project
    before, after = train(original, "--amp", env=DETERMINISTIC), train(migrated, "--amp", env=DETERMINISTIC)
    assert after["device"] == "cuda" and after["backend"] == "nccl"
    for key in ("losses", "params"):
        pairs = zip(_floats(before[key]), _floats(after[key]), strict=True)
        assert all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9) for a, b in pairs), (key, before, after)
