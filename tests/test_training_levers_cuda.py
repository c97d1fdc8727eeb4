"""On an NVIDIA GPU: NPU411's `_npu_fused_optimizer` builds torch.optim's own class for CUDA parameters, and the
migrated training trains bit for bit as the original did (the fused class is for NPU parameters only).

Needs a visible GPU and a CUDA build of torch; on a CPU build it skips with that reason (run it on the
project's lent GPU machine: `python -m pytest -q tests/test_training_levers_cuda.py`).
"""

from __future__ import annotations

import ast

import pytest
import torch
from conftest import FIXTURES

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a visible NVIDIA GPU and CUDA torch"),
]


def _helper():
    """The helper exactly as NPU411 writes it into a migrated file."""
    tree = ast.parse((FIXTURES / "rules" / "NPU411" / "rewrite.out.py").read_text(encoding="utf-8"))
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_npu_fused_optimizer")
    namespace: dict = {}
    exec(compile(ast.Module([function], []), "_npu_fused_optimizer", "exec"), namespace)
    return namespace["_npu_fused_optimizer"]


def _train(build) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).cuda()
    optimizer = build(model)
    torch.manual_seed(1)
    for _ in range(5):
        x, y = torch.randn(8, 16, device="cuda"), torch.randn(8, 4, device="cuda")
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return [type(optimizer), *(p.detach().clone() for p in model.parameters())]


@pytest.mark.parametrize(
    "optimizer, options",
    [(torch.optim.AdamW, {"lr": 1e-2}), (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}), (torch.optim.Adam, {})],
)
def test_the_fused_optimizer_helper_builds_the_original_class_on_cuda(optimizer, options):
    helper = _helper()
    original = _train(lambda m: optimizer(m.parameters(), **options))
    migrated = _train(lambda m: helper(optimizer, m.parameters(), **options))
    assert migrated[0] is optimizer
    assert all(torch.equal(a, b) for a, b in zip(original[1:], migrated[1:]))
