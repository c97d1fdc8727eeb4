"""Issue #23: RMSNorm written as a float32 factor that scales the input (k-diffusion's and stable-audio-tools'
`rms_norm`) was declined ("scales a different tensor than it squares"); NPU701 now fuses it in float32.

    dtype = promote_types(x.dtype, float32)          # or reduce(promote_types, (x.dtype, w.dtype, float32))
    factor = w.to(dtype) * rsqrt(mean(x.to(dtype) ** 2, -1, keepdim=True) + eps)
    return x * factor.to(x.dtype)

In float32 that is x * rsqrt(ms + eps) * w; in fp16 / bf16 the factor is rounded before the product, the
kernel rounds once. The code below is our own, written for this test, run with `_is_npu` forced true and
the CPU reference kernels as `torch_npu`: fp32 cosine >= 0.999, bf16 / fp16 >= 0.99, the kernel called
once, off the NPU bit-identical, a weight with batch dims or a float64 input left to the original, a
branch with a wrong eps or no gamma caught, and a cast to a dtype other than float32 declined.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from npu_migrate.engine.pipeline import migrate_text
from npu_migrate.verify import reference

pytestmark = pytest.mark.integration  # torch: the `integration` extra

TORCH_NPU = reference.torch_npu_module()
FLOOR = {torch.float32: 0.999, torch.bfloat16: 0.99, torch.float16: 0.99}

SPELLINGS = {
    "promote_types": """
        import torch


        def norm_by_factor(h, gain, tiny):
            wide = torch.promote_types(h.dtype, torch.float32)
            ms = torch.mean(h.to(wide) ** 2, dim=-1, keepdim=True)
            gain = gain.to(wide) * torch.rsqrt(ms + tiny)
            return h * gain.to(h.dtype)
        """,
    "reduce": """
        from functools import reduce

        import torch


        def norm_by_factor(h, gain, tiny):
            wide = reduce(torch.promote_types, (h.dtype, gain.dtype, torch.float32))
            factor = gain.to(wide) * torch.rsqrt(h.to(wide).pow(2).mean(-1, keepdim=True) + tiny)
            return factor.to(h.dtype) * h
        """,
    # `.float()` is `.to(torch.float32)`: it was declined as "scales a different tensor than it squares"
    "float": """
        import torch


        def norm_by_factor(h, gain, tiny):
            return h * (gain.float() * torch.rsqrt(torch.mean(h.float() ** 2, -1, keepdim=True) + tiny)).to(h.dtype)
        """,
}


def _migrate(name: str, text: str | None = None):
    text = text or textwrap.dedent(SPELLINGS[name]).lstrip()
    out, findings = migrate_text(text, path=f"{name}.py", select=["NPU701"])
    return text, out, [f for f in findings if not f.message.startswith("fused-op helpers")]


def _load(text: str, *, forced: bool, mutate=None):
    if mutate is not None:
        assert mutate[0] in text, mutate
        text = text.replace(*mutate)
    namespace = {"__name__": "factor"}
    exec(compile(text, "factor.py", "exec"), namespace)
    if forced:
        namespace["_is_npu"] = lambda x: True
        namespace["torch_npu"] = TORCH_NPU
    return namespace["norm_by_factor"]


def _inputs(dtype, gain_shape=(32,)):
    g = torch.Generator().manual_seed(5)
    # rows of very different scale, so that a wrong eps changes directions, not only sizes
    scale = torch.tensor([1e-3, 1.0, 3e-3, 2.0]).view(4, 1, 1)
    h = (scale * torch.randn(4, 6, 32, generator=g)).to(dtype)
    gain = (1 + 0.5 * torch.randn(*gain_shape, generator=g)).to(dtype)
    return h, gain, 1e-5


def _run(fn, *args):
    before = TORCH_NPU.calls["npu_rms_norm"]
    out = fn(*args)
    return out, TORCH_NPU.calls["npu_rms_norm"] - before


def _cosine(a, b):
    return float(torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0))


@pytest.mark.parametrize("name", list(SPELLINGS))
def test_the_factor_spelling_is_fused_once_and_idempotent(name):
    text, out, findings = _migrate(name)
    assert len(findings) == 1 and findings[0].fixed, [f.message for f in findings]
    assert "_npu_rms_norm(h.float(),gain.float(),epsilon=tiny)[0].to(h.dtype)" in "".join(out.split())
    assert migrate_text(out, path=f"{name}.py", select=["NPU701"])[0] == out


@pytest.mark.parametrize("name", list(SPELLINGS))
@pytest.mark.parametrize("dtype", list(FLOOR), ids=str)
def test_the_branch_agrees_and_the_fallback_is_bit_identical(name, dtype):
    text, out, _ = _migrate(name)
    args = _inputs(dtype)
    expected = _load(text, forced=False)(*args)
    got, calls = _run(_load(out, forced=True), *args)
    assert calls == 1
    assert got.dtype == expected.dtype and _cosine(got, expected) >= FLOOR[dtype]
    assert torch.equal(_load(out, forced=False)(*args), expected)


@pytest.mark.parametrize("name", list(SPELLINGS))
def test_what_the_kernel_does_not_take_runs_the_original(name):
    text, out, _ = _migrate(name)
    for args in (_inputs(torch.bfloat16, gain_shape=(4, 1, 32)), _inputs(torch.float64)):
        expected = _load(text, forced=False)(*args)
        got, calls = _run(_load(out, forced=True), *args)
        assert calls == 0 and torch.equal(got, expected)


@pytest.mark.parametrize(
    "mutant",
    [
        ("epsilon=tiny", "epsilon=tiny * 1e4"),  # the wrong eps
        ("gain.float(), epsilon", "torch.ones_like(gain.float()), epsilon"),  # gamma dropped
    ],
    ids=["eps", "gamma"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["promote_types", "float"])
def test_a_broken_branch_is_caught(mutant, dtype, name):
    text, out, _ = _migrate(name)
    args = _inputs(dtype)
    expected = _load(text, forced=False)(*args)
    got, _ = _run(_load(out, forced=True, mutate=mutant), *args)
    assert _cosine(got, expected) < FLOOR[dtype]


def test_a_factor_in_another_dtype_is_declined():
    # half precision for the mean of squares is not what the kernel computes (it accumulates in float32)
    text = (
        textwrap.dedent(SPELLINGS["promote_types"])
        .lstrip()
        .replace("torch.promote_types(h.dtype, torch.float32)", "torch.float16")
    )
    text, out, findings = _migrate("half", text)
    assert out == text
    assert len(findings) == 1 and not findings[0].fixed
    assert "scales a different tensor than it squares" in findings[0].message
