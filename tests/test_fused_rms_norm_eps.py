"""Issue #23: `F.rms_norm` without eps (or eps=None) is fused, with rms_norm's own default passed explicitly.

That default is the machine epsilon of the type torch computes in: float32 for fp16, bf16 and fp32 inputs
alike, not `torch.finfo(x.dtype).eps` (8192x larger for fp16, 65536x for bf16). The fixture's branch runs
on the CPU reference kernel and must agree with the original; the fallback must be bit-identical; and
the branch with the dtype's own eps, the plausible mistake, must be caught.
"""

from __future__ import annotations

import pytest
import torch
from conftest import FIXTURES

from npu_migrate.verify import reference

pytestmark = pytest.mark.integration  # torch: the `integration` extra

CASE = FIXTURES / "rules" / "NPU701" / "functional_default_eps"
TORCH_NPU = reference.torch_npu_module()
FLOOR = {torch.float32: 0.999, torch.bfloat16: 0.99, torch.float16: 0.99}


def _load(suffix: str, *, forced: bool, mutate=None):
    text = CASE.with_name(f"{CASE.name}.{suffix}.py").read_text(encoding="utf-8")
    if mutate is not None:
        assert mutate[0] in text
        text = text.replace(*mutate)
    namespace = {"__name__": "fixture"}
    exec(compile(text, str(CASE), "exec"), namespace)
    if forced:
        namespace["_is_npu"] = lambda x: True
        namespace["torch_npu"] = TORCH_NPU
    return namespace


def _inputs(dtype):
    # Rows of very different scale: where eps matters (1e-4) and where it does not (1), so that a wrong
    # eps changes the direction of the output, not only its size.
    scale = torch.tensor([1e-4, 1.0, 3e-4, 2.0]).view(4, 1, 1)
    return (scale * torch.randn(4, 5, 16, generator=torch.Generator().manual_seed(2))).to(dtype)


def _run(namespace, dtype):
    torch.manual_seed(0)
    module = namespace["NoEps"](16).to(dtype)
    with torch.no_grad():
        module.weight.copy_(1 + 0.5 * torch.randn(16, generator=torch.Generator().manual_seed(1)))
        return module(_inputs(dtype))


def _cosine(a, b):
    return float(torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0))


@pytest.mark.parametrize("dtype", list(FLOOR), ids=str)
def test_the_default_eps_branch_agrees_and_the_fallback_is_untouched(dtype):
    expected = _run(_load("in", forced=False), dtype)
    before = TORCH_NPU.calls["npu_rms_norm"]
    got = _run(_load("out", forced=True), dtype)
    assert TORCH_NPU.calls["npu_rms_norm"] == before + 1
    assert got.dtype == expected.dtype and _cosine(got, expected) >= FLOOR[dtype]
    torch.testing.assert_close(got.float(), expected.float(), rtol=2e-2, atol=2e-2)
    assert torch.equal(_run(_load("out", forced=False), dtype), expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_the_dtypes_own_eps_is_caught(dtype):
    wrong = repr(torch.finfo(dtype).eps)
    mutant = ("epsilon=1.1920928955078125e-07", f"epsilon={wrong}")
    expected = _run(_load("in", forced=False), dtype)
    got = _run(_load("out", forced=True, mutate=mutant), dtype)
    assert _cosine(got, expected) < FLOOR[dtype]
