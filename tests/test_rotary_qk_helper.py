"""Issue #23: q and k rotated by one helper that rotates a window of its input (`_rot(q, ...)`, `_rot(k, ...)`),
fixture `NPU703/qk_window_helper` (our own spellings). Both tensors get the kernel, in the caller's branch,
also where the helper builds each tensor's tables from that tensor (ChatGLM's `cache[:x.size(0)]`: q's
and k's tables are two tensors, which NPU703 used to decline as "different cos/sin tables") or scales them
differently (xpos: q's by the scale, k's by its inverse): each rotated tensor is checked and rotated with
its own tables. The committed fixture is run with `_is_npu` forced true and verify's CPU reference kernels
as `torch_npu`: fp32 cosine >= 0.999 and within 1e-4, bf16 cosine >= 0.99, one kernel call per tensor;
with `_is_npu` false the original's bits. Each check is shown failing on a broken branch.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import FIXTURES

from npu_migrate.verify import reference

pytestmark = pytest.mark.integration  # needs torch: the `integration` extra

TORCH_NPU = reference.torch_npu_module()
CASE = FIXTURES / "rules" / "NPU703" / "qk_window_helper"


def _angles(*shape, seed):
    return (torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1) * math.pi


def _randn(*shape, seed):
    return 3 * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _same_tables(dtype):
    """BNSD q (4 heads) and k (2 heads), head dim 16, the leading 8 rotated; (B, S, 8) tables, B1SD once
    unsqueezed."""
    theta = _angles(2, 5, 4, seed=1).repeat(1, 1, 2)
    q, k = _randn(2, 4, 5, 16, seed=2), _randn(2, 2, 5, 16, seed=3)
    return tuple(t.to(dtype) for t in (q, k, theta.cos(), theta.sin()))


def _own_lengths(dtype):
    """SBND q of 3 positions and k of 5 (a cache being filled): each cuts the (positions, 1, pairs, 2)
    cache to its own length, 4 pairs of the 16 dims rotated."""
    theta = _angles(6, 1, 4, seed=4)
    cache = torch.stack((theta.cos(), theta.sin()), dim=-1)
    q, k = _randn(3, 2, 4, 16, seed=5), _randn(5, 2, 2, 16, seed=6)
    return tuple(t.to(dtype) for t in (q, k, cache))


def _xpos(dtype):
    """BNSD q and k, (1, 1, S, D) angles, an xpos scale per position (0.6 to 1.4): k's tables are divided by
    it, so k rotated with q's tables is off by the square of the scale."""
    freqs = _angles(1, 1, 5, 8, seed=7).repeat(1, 1, 1, 2)
    scale = torch.linspace(0.6, 1.4, 5).reshape(1, 1, 5, 1).expand(1, 1, 5, 16)
    q, k = _randn(2, 4, 5, 16, seed=8), _randn(2, 4, 5, 16, seed=9)
    return tuple(t.to(dtype) for t in (q, k, freqs, scale))


#: function -> (inputs, mutants of the committed branch that the numbers must catch)
CASES = {
    "apply_rotary_pos_emb": (
        _same_tables,
        {
            "k's window": ("_npu_x1 = k[..., :_npu_w]", "_npu_x1 = k[..., _npu_w:]"),
            "k's tail": ("k[..., _npu_w:]),", "k[..., :_npu_w]),"),
        },
    ),
    "apply_rotary_cached": (
        _own_lengths,
        {"k's sign": ("_npu_sin1 = _npu_t1[..., 1]", "_npu_sin1 = -_npu_t1[..., 1]")},
    ),
    "apply_xpos": (
        _xpos,
        {"k with q's tables": ("_npu_rotary_mul(k, _npu_cos1, _npu_sin1,", "_npu_rotary_mul(k, _npu_cos, _npu_sin,")},
    ),
}


def _namespace(text: str, *, forced: bool, mutate=None, function: str = "") -> dict:
    if mutate is not None:  # in `function`'s branch only
        old, new = mutate
        start = text.index(f"\ndef {function}(")
        end = text.find("\ndef ", start + 1) % (len(text) + 1)
        body = text[start:end]
        assert body.count(old) == 1, f"mutant {old!r} does not apply to {function}"
        text = text[:start] + body.replace(old, new) + text[end:]
    namespace = {"__name__": "qk_window_helper"}
    exec(compile(text, "qk_window_helper.py", "exec"), namespace)
    if forced:
        namespace["_is_npu"] = lambda x: True
        namespace["torch_npu"] = TORCH_NPU
    return namespace


def _cosine(a, b) -> float:
    return F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def _run(name, dtype, mutate=None):
    """(q's and k's (got, expected) from the forced branch, kernel calls, the fallback bit-identical)."""
    inputs, _ = CASES[name]
    args = inputs(dtype)
    expected = _namespace((CASE.with_suffix(".in.py")).read_text(), forced=False)[name](*args)
    text = CASE.with_suffix(".out.py").read_text()
    before = TORCH_NPU.calls["npu_rotary_mul"]
    got = _namespace(text, forced=True, mutate=mutate, function=name)[name](*args)
    calls = TORCH_NPU.calls["npu_rotary_mul"] - before
    kept = _namespace(text, forced=False)[name](*args)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
    return list(zip(got, expected)), calls, all(torch.equal(a, b) for a, b in zip(kept, expected))


@pytest.mark.parametrize("dtype, floor", [(torch.float32, 0.999), (torch.bfloat16, 0.99)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", CASES)
def test_q_and_k_both_get_the_kernel_and_agree_with_the_original(name, dtype, floor):
    pairs, calls, fallback_identical = _run(name, dtype)
    assert calls == 2, "q and k: one kernel call each"
    assert all(_cosine(got, expected) >= floor for got, expected in pairs)
    if dtype == torch.float32:
        for got, expected in pairs:
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert fallback_identical


@pytest.mark.parametrize("name, mutant", [(n, m) for n, (_, ms) in CASES.items() for m in ms])
def test_a_broken_branch_is_caught(name, mutant):
    pairs, calls, _ = _run(name, torch.float32, mutate=CASES[name][1][mutant])
    assert calls == 2
    (_, _), (got_k, expected_k) = pairs
    assert _cosine(got_k, expected_k) < 0.999


def test_tables_of_the_wrong_length_fall_back_to_the_original():
    """k's tables cut to q's length (a branch that mixed up whose size cuts them): `_npu_rotary_fits`
    declines them for k, which the original rotates instead, and the numbers stay the original's."""
    mutate = ("_npu_t3 = k.size(0)", "_npu_t3 = q.size(0)")
    pairs, calls, _ = _run("apply_rotary_cached", torch.float32, mutate=mutate)
    assert calls == 0  # the check runs before either kernel: neither runs
    for got, expected in pairs:
        assert torch.equal(got, expected)
