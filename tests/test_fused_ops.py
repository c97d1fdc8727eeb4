"""NPU703 (rotary) and NPU704 (attention) branches, executed.

The fixtures' `.out.py` files are run with `_is_npu` forced true and the CPU reference kernels of
`npu_migrate.verify.reference` as `torch_npu`: on inputs the kernels take they must be called and agree with the
original code; on inputs they do not take (dtype mixes, float masks, shapes outside the table) the
original code must run, untouched. Mutants of the generated code (mask polarity, scale, causal
alignment, rotation mode) must be caught by the same comparisons.
"""

from __future__ import annotations

import math
import types

import pytest
import torch
import torch.nn.functional as F
from conftest import FIXTURES

from npu_migrate.engine.pipeline import migrate_text
from npu_migrate.verify import reference

pytestmark = pytest.mark.integration  # torch: the `integration` extra

RULES = FIXTURES / "rules"
#: The `torch_npu` of every forced fixture: its `calls` count the kernel calls of all of them.
TORCH_NPU = reference.torch_npu_module()


def _load(path, *, forced: bool, mutate=None):
    text = path.read_text(encoding="utf-8")
    if mutate is not None:
        old, new = mutate
        assert old in text, f"mutant {old!r} does not apply to {path.name}"
        text = text.replace(old, new)
    namespace = {"__name__": "fixture"}
    exec(compile(text, str(path), "exec"), namespace)
    if forced:
        namespace["_is_npu"] = lambda x: True
        namespace["torch_npu"] = TORCH_NPU
    return namespace


def _pair(case: str, rule: str, mutate=None):
    folder = RULES / rule
    return _load(folder / f"{case}.in.py", forced=False), _load(folder / f"{case}.out.py", forced=True, mutate=mutate)


def _calls(kernel: str, fn, *args, **kwargs):
    before = TORCH_NPU.calls[kernel]
    out = fn(*args, **kwargs)
    return out, TORCH_NPU.calls[kernel] - before


def _close(a, b, **tol):
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b):
            _close(x, y, **tol)
        return
    assert a.shape == b.shape and a.dtype == b.dtype
    torch.testing.assert_close(a, b, equal_nan=False, **tol)


def _tables(batch, seq, dim, *, dtype=torch.float32, interleave=False):
    """HF-style cos/sin (batch, seq, dim): cat(freqs, freqs), or GPT-J's repeat_interleave(2)."""
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    pos = torch.arange(seq).float()[None, :, None] + torch.arange(batch).float()[:, None, None]
    freqs = pos * inv
    emb = freqs.repeat_interleave(2, -1) if interleave else torch.cat((freqs, freqs), -1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


# -- the reference kernels agree with the formulas the facts give for them ----------------------------


def test_reference_rotary_matches_the_hf_and_gptj_formulas():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 8, generator=g)
    cos, sin = (t[:, None] for t in _tables(2, 5, 8))
    x1, x2 = x[..., :4], x[..., 4:]
    torch.testing.assert_close(reference.npu_rotary_mul(x, cos, sin), x * cos + torch.cat((-x2, x1), -1) * sin)
    cos, sin = (t[:1, None] for t in _tables(1, 5, 8, interleave=True))
    every_two = torch.stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)
    torch.testing.assert_close(reference.npu_rotary_mul(x, cos, sin, "interleave"), x * cos + every_two * sin)


def test_reference_fusion_attention_matches_sdpa_given_the_documented_mapping():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 8, generator=g) for _ in range(3))
    scale = 1 / math.sqrt(8)
    full = reference.npu_fusion_attention(q, k, v, 4, "BNSD", scale=scale)[0]
    torch.testing.assert_close(full, F.scaled_dot_product_attention(q, k, v))
    triu = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
    causal = reference.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=triu, sparse_mode=2, scale=scale)[0]
    torch.testing.assert_close(causal, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    keep = torch.rand(2, 1, 6, 6, generator=g) > 0.3
    keep[..., 0] = True
    masked = reference.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=~keep, scale=scale)[0]
    torch.testing.assert_close(masked, F.scaled_dot_product_attention(q, k, v, attn_mask=keep))
    # The device's default scale is 1.0 and its mask polarity is inverted: both must show.
    assert not torch.allclose(reference.npu_fusion_attention(q, k, v, 4, "BNSD")[0], full)
    assert not torch.allclose(
        reference.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=keep, scale=scale)[0], masked
    )


# -- NPU703 ----------------------------------------------------------------------------------------


def test_hf_rotary_branch_bnsd_and_bsnd():
    original, migrated = _pair("hf_apply_rotary_pos_emb", "NPU703")
    g = torch.Generator().manual_seed(1)
    cos, sin = _tables(2, 5, 16)
    q, k = torch.randn(2, 4, 5, 16, generator=g), torch.randn(2, 2, 5, 16, generator=g)
    out, calls = _calls("npu_rotary_mul", migrated["apply_rotary_pos_emb"], q, k, cos, sin)
    assert calls == 2
    _close(out, original["apply_rotary_pos_emb"](q, k, cos, sin))
    # BSND tensors with unsqueeze_dim=2: cos/sin become BS1D, which the table allows.
    qs, ks = q.transpose(1, 2), k.transpose(1, 2)
    out, calls = _calls("npu_rotary_mul", migrated["apply_rotary_pos_emb"], qs, ks, cos, sin, unsqueeze_dim=2)
    assert calls == 2
    _close(out, original["apply_rotary_pos_emb"](qs, ks, cos, sin, unsqueeze_dim=2))


def _rotary_inputs(seed=2):
    g = torch.Generator().manual_seed(seed)
    cos, sin = _tables(2, 5, 16)
    return torch.randn(2, 4, 5, 16, generator=g), torch.randn(2, 4, 5, 16, generator=g), cos, sin


@pytest.mark.parametrize(
    "why, make",
    [
        (
            "fp32 tables with bf16 activations promote the original",
            lambda q, k, c, s: ((q.bfloat16(), k.bfloat16(), c, s), {}),
        ),
        ("3-D tensors", lambda q, k, c, s: ((q[0], k[0], c[0], s[0]), {"unsqueeze_dim": 0})),
        ("the tables would broadcast q up (batch 1 q, batch 2 tables)", lambda q, k, c, s: ((q[:1], k[:1], c, s), {})),
        ("odd head dim", lambda q, k, c, s: ((q[..., :15], k[..., :15], c[..., :15], s[..., :15]), {})),
        # unsqueeze_dim=0 on (N, S, D) tables gives 1NSD, which is not in the kernel's table.
        (
            "1NSD tables",
            lambda q, k, c, s: ((q, k, c[0].expand(4, 5, 16), s[0].expand(4, 5, 16)), {"unsqueeze_dim": 0}),
        ),
    ],
)
def test_hf_rotary_branch_falls_back_where_the_kernel_differs(why, make):
    original, migrated = _pair("hf_apply_rotary_pos_emb", "NPU703")
    args, kwargs = make(*_rotary_inputs())
    out, calls = _calls("npu_rotary_mul", migrated["apply_rotary_pos_emb"], *args, **kwargs)
    assert calls == 0, why
    expected = original["apply_rotary_pos_emb"](*args, **kwargs)
    assert all(torch.equal(a, b) for a, b in zip(out, expected))


def test_partial_rotary_rotates_the_leading_slice_only():
    original, migrated = _pair("partial_rotary", "NPU703")
    g = torch.Generator().manual_seed(3)
    cos, sin = _tables(2, 5, 8)
    q, k = torch.randn(2, 4, 5, 16, generator=g), torch.randn(2, 2, 5, 16, generator=g)
    out, calls = _calls("npu_rotary_mul", migrated["apply_rotary_pos_emb"], q, k, cos, sin)
    assert calls == 2
    _close(out, original["apply_rotary_pos_emb"](q, k, cos, sin))


@pytest.mark.parametrize(
    "case, call",
    [
        ("renamed_chunk_helper", lambda ns, x, c, s: ns["rope"](x, c, s)),
        ("rotary_module", lambda ns, x, c, s: ns["Rotary"]()(x, c, s)),
        ("double_negation", lambda ns, x, c, s: ns["apply_rotary_pos_emb"](x, c, s)),
    ],
)
def test_single_tensor_rotary_branches(case, call):
    original, migrated = _pair(case, "NPU703")
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 4, 5, 16, generator=g, dtype=torch.float16)
    cos, sin = (t[:1, None] for t in _tables(1, 5, 16, dtype=torch.float16))
    out, calls = _calls("npu_rotary_mul", call, migrated, x, cos, sin)
    assert calls == 1
    _close(out, call(original, x, cos, sin), atol=2e-3, rtol=2e-3)


def test_gptj_interleaved_branch():
    original, migrated = _pair("gptj_interleaved", "NPU703")
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 5, 4, 16, generator=g)  # BSND, tables 1S1D: the one interleave shape for BSND
    cos, sin = (t[:, :, None] for t in _tables(1, 5, 16, interleave=True))
    out, calls = _calls("npu_rotary_mul", migrated["apply_rotary_pos_emb"], x, sin, cos)
    assert calls == 1
    _close(out, original["apply_rotary_pos_emb"](x, sin, cos))
    # BS1D tables are allowed for 'half' only: the original must run.
    cos2, sin2 = (t[:, :, None] for t in _tables(2, 5, 16, interleave=True))
    x2 = torch.randn(2, 5, 4, 16, generator=g)
    out, calls = _calls("npu_rotary_mul", migrated["apply_rotary_pos_emb"], x2, sin2, cos2)
    assert calls == 0 and torch.equal(out, original["apply_rotary_pos_emb"](x2, sin2, cos2))


def test_interleaved_rotary_needs_a_torch_npu_with_rotary_mode():
    source = (RULES / "NPU703" / "gptj_interleaved.in.py").read_text()
    text, findings = migrate_text(source, select=["NPU703"], torch_npu_version="2.1.0.post8")
    assert text == source
    assert any("rotary_mode='interleave'" in f.message and not f.fixed for f in findings)
    half = (RULES / "NPU703" / "hf_apply_rotary_pos_emb.in.py").read_text()
    text, _ = migrate_text(half, select=["NPU703"], torch_npu_version="2.1.0.post8")
    # The half rotation runs on a torch_npu whose npu_rotary_mul takes no rotary_mode at all.
    namespace = {"__name__": "fixture"}
    exec(compile(text, "migrated.py", "exec"), namespace)
    old = types.SimpleNamespace(npu_rotary_mul=lambda x, r1, r2: reference.npu_rotary_mul(x, r1, r2))
    namespace.update(_is_npu=lambda x: True, torch_npu=old)
    q, k = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    cos, sin = _tables(1, 5, 8)
    torch.testing.assert_close(
        namespace["apply_rotary_pos_emb"](q, k, cos, sin),
        _load(RULES / "NPU703" / "hf_apply_rotary_pos_emb.in.py", forced=False)["apply_rotary_pos_emb"](q, k, cos, sin),
    )


# -- NPU704 ----------------------------------------------------------------------------------------


def _qkv(b=2, n=4, nkv=4, sq=6, skv=6, d=16, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, n, sq, d, generator=g).to(dtype)
    k = torch.randn(b, nkv, skv, d, generator=g).to(dtype)
    v = torch.randn(b, nkv, skv, d, generator=g).to(dtype)
    return q, k, v


def _padding_mask(b, sq, skv, seed=0):
    """A bool mask (True = attend) with a fully masked row, as left padding makes."""
    g = torch.Generator().manual_seed(seed)
    keep = torch.rand(b, 1, sq, skv, generator=g) > 0.4
    keep[0, 0, 0] = False
    return keep


TOL = {"atol": 2e-3, "rtol": 2e-3}


@pytest.mark.parametrize("mask_shape", [(2, 1, 6, 6), (1, 1, 6, 6), (6, 6), (2, 4, 6, 6), (2, 1, 1, 6), (1, 4, 6, 6)])
def test_sdpa_bool_masks_are_inverted_and_broadcast(mask_shape):
    original, migrated = _pair("sdpa_functional", "NPU707")
    q, k, v = _qkv()
    g = torch.Generator().manual_seed(1)
    mask = torch.rand(*mask_shape, generator=g) > 0.4
    out, calls = _calls("npu_fusion_attention", migrated["attend"], q, k, v, mask)
    assert calls == 1
    _close(out, original["attend"](q, k, v, mask), **TOL)


def test_sdpa_fully_masked_rows_stay_zero():
    original, migrated = _pair("sdpa_functional", "NPU707")
    q, k, v = _qkv()
    mask = _padding_mask(2, 6, 6)
    out, calls = _calls("npu_fusion_attention", migrated["attend"], q, k, v, mask)
    assert calls == 1
    _close(out, original["attend"](q, k, v, mask), **TOL)


@pytest.mark.parametrize("sq, skv", [(6, 6), (3, 7), (7, 3)])
def test_sdpa_causal_is_top_left_aligned(sq, skv):
    original, migrated = _pair("sdpa_functional", "NPU707")
    q, k, v = _qkv(sq=sq, skv=skv)
    out, calls = _calls("npu_fusion_attention", migrated["causal"], q, k, v)
    assert calls == 1
    _close(out, original["causal"](q, k, v), **TOL)


def test_sdpa_without_mask_and_with_bf16():
    original, migrated = _pair("sdpa_functional", "NPU707")
    q, k, v = _qkv(dtype=torch.bfloat16)
    out, calls = _calls("npu_fusion_attention", migrated["attend"], q, k, v)
    assert calls == 1
    _close(out, original["attend"](q, k, v), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(
    "why, args",
    [
        ("float additive mask", lambda q, k, v: (q, k, v, torch.zeros(2, 1, 6, 6, dtype=q.dtype))),
        ("fp32", lambda q, k, v: (q.float(), k.float(), v.float(), None)),
        ("3-D", lambda q, k, v: (q[0], k[0], v[0], None)),
        (
            "fewer kv heads without enable_gqa (SDPA errors or broadcasts)",
            lambda q, k, v: (q, k[:, :1], v[:, :1], None),
        ),
        (
            "head dim above 768",
            lambda q, k, v: (q.repeat(1, 1, 1, 49), k.repeat(1, 1, 1, 49), v.repeat(1, 1, 1, 49), None),
        ),
    ],
)
def test_sdpa_falls_back_to_the_original_call(why, args):
    original, migrated = _pair("sdpa_functional", "NPU707")
    a = args(*_qkv())
    out, calls = _calls("npu_fusion_attention", migrated["attend"], *a)
    assert calls == 0, why
    assert torch.equal(out, original["attend"](*a))


def test_sdpa_module_gqa_scale_and_causal():
    original, migrated = _pair("sdpa_module", "NPU707")
    torch.manual_seed(0)
    a = original["SelfAttention"]().eval().to(torch.bfloat16)
    b = migrated["SelfAttention"]().eval().to(torch.bfloat16)
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 5, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        out, calls = _calls("npu_fusion_attention", b, x)
        assert calls == 1
        _close(out, a(x), atol=3e-2, rtol=3e-2)
        keep = _padding_mask(2, 5, 5)
        out, calls = _calls("npu_fusion_attention", b, x, keep)
        assert calls == 1
        _close(out, a(x, keep), atol=3e-2, rtol=3e-2)


def test_sdpa_keyword_path_with_gqa_and_explicit_scale():
    original, migrated = _pair("sdpa_torch_path", "NPU707")
    q, k, v = _qkv(nkv=2)
    mask = _padding_mask(2, 6, 6)
    for kwargs in ({"scaling": 0.3, "enable_gqa": True}, {"enable_gqa": True}):
        out, calls = _calls("npu_fusion_attention", migrated["attention"], q, k, v, mask, **kwargs)
        assert calls == 1
        _close(out, original["attention"](q, k, v, mask, **kwargs), **TOL)


# -- the comparisons above catch wrong generated code -------------------------------------------------

MUTANTS = {
    "mask polarity not inverted": ("torch.logical_not(expanded)", "(expanded)"),
    "scale left at the kernel's default": ("atten_mask=mask,\n        scale=scale,\n", "atten_mask=mask,\n"),
    "causal aligned bottom-right": ("sparse_mode = 2", "sparse_mode = 3"),
    "no invalid-row handling": ("inner_precise = 2", "inner_precise = 0"),
    "no causal mask (atten_mask=None is full attention)": (
        "mask = _npu_causal_mask(query.device)",
        "return torch_npu.npu_fusion_attention(query, key, value, heads, 'BNSD', scale=1.0 / dim ** 0.5)[0]",
    ),
}


def _sdpa_checks(migrated, original):
    q, k, v = _qkv(sq=3, skv=7)
    _close(migrated["causal"](q, k, v), original["causal"](q, k, v), **TOL)
    q, k, v = _qkv()
    mask = _padding_mask(2, 6, 6)
    _close(migrated["attend"](q, k, v, mask), original["attend"](q, k, v, mask), **TOL)
    _close(migrated["attend"](q, k, v), original["attend"](q, k, v), **TOL)


def test_sdpa_checks_pass_on_the_generated_code():
    _sdpa_checks(*reversed(_pair("sdpa_functional", "NPU707")))


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_sdpa_checks_catch_mutants(mutant):
    original, migrated = _pair("sdpa_functional", "NPU707", mutate=MUTANTS[mutant])
    with pytest.raises(AssertionError):
        _sdpa_checks(migrated, original)


def test_rotary_checks_catch_a_wrong_mode():
    original, migrated = _pair(
        "hf_apply_rotary_pos_emb",
        "NPU703",
        mutate=(
            '_npu_rotary_mul(q, _npu_cos, _npu_sin, rotary_mode="half")',
            '_npu_rotary_mul(q, _npu_cos, -_npu_sin, rotary_mode="half")',
        ),
    )
    cos, sin = _tables(2, 5, 16)
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
    with pytest.raises(AssertionError):
        _close(migrated["apply_rotary_pos_emb"](q, k, cos, sin), original["apply_rotary_pos_emb"](q, k, cos, sin))


def test_upcast_interleaved_rotary_binds_the_upcast_once():
    original, migrated = _pair("upcast_interleaved", "NPU703")
    g = torch.Generator().manual_seed(6)
    q, k = torch.randn(1, 4, 5, 16, generator=g).half(), torch.randn(1, 2, 5, 16, generator=g).half()
    cos, sin = _tables(1, 5, 16, interleave=True)  # fp32 tables, (1, S, D) -> 11SD
    out, calls = _calls("npu_rotary_mul", migrated["apply_rotary_pos_emb"], q, k, cos, sin)
    assert calls == 2
    _close(out, original["apply_rotary_pos_emb"](q, k, cos, sin))
