"""The CPU reference of the torch_npu fused ops against independent formulas, and its constraints.

The expected values never come from the reference's own code path: SDPA (with `is_causal`, bool masks
and `enable_gqa`), HF `rotate_half`, GPT-J `rotate_every_two`, `F.silu` on chunks and a plain RMSNorm.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from npu_migrate.verify import reference as ref
from npu_migrate.verify.reference import NotModelledError, NpuOpError

pytestmark = pytest.mark.integration  # needs torch (and transformers): the `integration` extra

DTYPES = [torch.float32, torch.bfloat16]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def _rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _close(got, want, dtype):
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])


# -- RMSNorm ----------------------------------------------------------------------------------------------


def _plain_rms_norm(x, w, eps):
    x64 = x.double()
    return x64 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + eps) * w.double()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 8), (2, 5, 16), (2, 3, 4, 32)])
def test_rms_norm_matches_the_plain_formula(dtype, shape):
    x, w = _rand(*shape, dtype=dtype), (1 + 0.5 * _rand(shape[-1], seed=1)).to(dtype)
    y, rstd = ref.npu_rms_norm(x, w, epsilon=1e-5)
    _close(y, _plain_rms_norm(x, w, 1e-5), dtype)
    assert rstd.dtype == torch.float32 and rstd.shape == shape[:-1] + (1,)


def test_rms_norm_normalises_over_all_gamma_dims():
    x, w = _rand(2, 3, 4, 8), _rand(4, 8, seed=1)
    y, rstd = ref.npu_rms_norm(x, w)
    want = x / torch.sqrt(x.pow(2).mean((-2, -1), keepdim=True) + 1e-6) * w
    torch.testing.assert_close(y, want)
    assert rstd.shape == (2, 3, 1, 1)


def test_add_rms_norm_returns_the_sum_and_its_norm():
    x1, x2, w = _rand(2, 5, 16), _rand(2, 5, 16, seed=1), _rand(16, seed=2)
    y, rstd, s = ref.npu_add_rms_norm(x1, x2, w, epsilon=1e-6)
    torch.testing.assert_close(s, x1 + x2)
    torch.testing.assert_close(y, _plain_rms_norm(x1 + x2, w, 1e-6).float())
    assert rstd.dtype == torch.float32


@pytest.mark.parametrize(
    "x, gamma, message",
    [
        (_rand(2, 8, dtype=torch.bfloat16), _rand(8), "same dtype"),
        (_rand(8), _rand(8), "2 to 8 dims"),
        (_rand(2, 8), _rand(4), "trailing dims"),
        (_rand(2, 8).double(), _rand(8).double(), "not supported"),
        (_rand(*([1] * 9), 8), _rand(8), "2 to 8 dims"),
    ],
)
def test_rms_norm_constraints(x, gamma, message):
    with pytest.raises(NpuOpError, match=message):
        ref.npu_rms_norm(x, gamma)


def test_add_rms_norm_constraints():
    with pytest.raises(NpuOpError, match="same dtype"):
        ref.npu_add_rms_norm(_rand(2, 8), _rand(2, 8, dtype=torch.bfloat16), _rand(8))
    with pytest.raises(NpuOpError, match="same shape"):
        ref.npu_add_rms_norm(_rand(2, 8), _rand(1, 8), _rand(8))


# -- SwiGLU -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_swiglu_activates_the_first_half(dtype, dim):
    x = _rand(4, 6, 8, dtype=dtype)
    a, b = x.float().chunk(2, dim)
    _close(ref.npu_swiglu(x, dim=dim), F.silu(a) * b, dtype)
    assert not torch.allclose(ref.npu_swiglu(x, dim=dim).float(), F.silu(b) * a, atol=1e-2)


def test_swiglu_constraints():
    with pytest.raises(NpuOpError, match="must be even"):
        ref.npu_swiglu(_rand(2, 7))
    with pytest.raises(NpuOpError, match="not supported"):
        ref.npu_swiglu(_rand(2, 8).double())
    with pytest.raises(NpuOpError, match="out of range"):
        ref.npu_swiglu(_rand(2, 8), dim=2)
    with pytest.raises(NpuOpError, match="1 to 8 dims"):
        ref.npu_swiglu(torch.tensor(1.0))


# -- rotary -----------------------------------------------------------------------------------------------


def _freqs(s, d):
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    return torch.outer(torch.arange(s).float(), inv)  # (S, D/2)


def _rotate_half(x):  # HF transformers
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def _rotate_every_two(x):  # GPT-J
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


# (layout, x shape builder, how cos (S, D) is viewed for that layout)
ROTARY_CASES = {
    "BNSD-11SD": (lambda b, n, s, d: (b, n, s, d), lambda c, b: c[None, None]),
    "BNSD-B1SD": (lambda b, n, s, d: (b, n, s, d), lambda c, b: c[None, None].expand(b, 1, *c.shape)),
    "BSND-1S1D": (lambda b, n, s, d: (b, s, n, d), lambda c, b: c[None, :, None]),
    "BSND-BS1D": (
        lambda b, n, s, d: (b, s, n, d),
        lambda c, b: c[None, :, None].expand(b, *c.shape[:1], 1, c.shape[1]),
    ),
    "SBND-S11D": (lambda b, n, s, d: (s, b, n, d), lambda c, b: c[:, None, None]),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", sorted(ROTARY_CASES))
def test_rotary_half_matches_hf_rotate_half(dtype, case):
    shape_of, view = ROTARY_CASES[case]
    b, n, s, d = 2, 3, 5, 16
    x = _rand(*shape_of(b, n, s, d), dtype=dtype)
    emb = torch.cat((_freqs(s, d),) * 2, -1)
    cos, sin = view(emb.cos(), b).to(dtype), view(emb.sin(), b).to(dtype)
    want = x.float() * cos.float() + _rotate_half(x.float()) * sin.float()
    _close(ref.npu_rotary_mul(x, cos, sin), want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_interleave_matches_gptj_rotate_every_two(dtype):
    b, n, s, d = 2, 3, 5, 16
    x = _rand(b, n, s, d, dtype=dtype)
    f = _freqs(s, d)
    cos, sin = f.cos().repeat_interleave(2, -1)[None, None], f.sin().repeat_interleave(2, -1)[None, None]
    want = x.float() * cos + _rotate_every_two(x.float()) * sin
    _close(ref.npu_rotary_mul(x, cos.to(dtype), sin.to(dtype), rotary_mode="interleave"), want, dtype)
    # The two modes are different rotations: a rewrite picking the wrong one is visible.
    half = ref.npu_rotary_mul(x, cos.to(dtype), sin.to(dtype))
    assert not torch.allclose(half.float(), want, atol=1e-1)


def test_rotary_rotate_matrix_is_a_plain_matmul():
    d = 8
    x, cos, sin = _rand(1, 2, 3, d), _rand(1, 1, 3, d, seed=1), _rand(1, 1, 3, d, seed=2)
    half = torch.zeros(d, d)
    half[d // 2 :, : d // 2] = -torch.eye(d // 2)
    half[: d // 2, d // 2 :] = torch.eye(d // 2)
    torch.testing.assert_close(ref.npu_rotary_mul(x, cos, sin, rotate=half), ref.npu_rotary_mul(x, cos, sin))


@pytest.mark.parametrize(
    "x, r, kwargs, message",
    [
        (_rand(2, 5, 16), _rand(1, 5, 16), {}, "4-D"),
        (_rand(1, 2, 5, 15), _rand(1, 1, 5, 15), {}, "even"),
        (_rand(1, 1, 2, 896), _rand(1, 1, 2, 896), {}, "< 896"),
        (_rand(1, 2, 5, 16), _rand(1, 1, 5, 16, dtype=torch.bfloat16), {}, "same dtype"),
        (_rand(2, 3, 5, 16).double(), _rand(1, 1, 5, 16).double(), {}, "not supported"),
        (_rand(2, 3, 5, 16), _rand(2, 3, 1, 1), {}, "not an allowed broadcast"),
        (_rand(2, 3, 5, 16), _rand(2, 1, 5, 16), {"rotary_mode": "interleave"}, "not an allowed broadcast"),
        (_rand(2, 3, 5, 16), _rand(1, 1, 5, 16), {"rotary_mode": "quarter"}, "Ascend 950"),
        (_rand(2, 3, 5, 16), _rand(1, 1, 5, 16), {"rotary_mode": "full"}, "'half' or 'interleave'"),
        (_rand(1000, 1, 2, 4), _rand(1, 1, 2, 4), {}, "< 1000"),
        (_rand(40, 25, 2, 4), _rand(1, 1, 2, 4), {"rotary_mode": "interleave"}, "B \\* N"),
    ],
)
def test_rotary_constraints(x, r, kwargs, message):
    with pytest.raises(NpuOpError, match=message):
        ref.npu_rotary_mul(x, r, r, **kwargs)


def test_rotary_tables_that_need_grads_limit_b_times_n():
    x, r = _rand(40, 30, 2, 4), _rand(1, 1, 2, 4)
    ref.npu_rotary_mul(x, r, r)  # B, N < 1000 each: fine without grads
    with pytest.raises(NpuOpError, match="<= 1024 when r1/r2 need grads"):
        ref.npu_rotary_mul(x, r.requires_grad_(), r)
    ref.npu_rotary_mul(x[:32, :32], r, r)  # B * N = 1024


# -- flash attention --------------------------------------------------------------------------------------

CAUSAL = torch.ones(2048, 2048, dtype=torch.bool).triu(1)


def _bnsd(b=2, nq=4, nkv=4, sq=6, skv=6, d=16, dtype=torch.float32):
    return (
        _rand(b, nq, sq, d, dtype=dtype),
        _rand(b, nkv, skv, d, dtype=dtype, seed=1),
        _rand(b, nkv, skv, d, dtype=dtype, seed=2),
    )


def _sdpa(q, k, v, **kw):
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **kw)


def _to_layout(t, layout):
    b, n, s, d = t.shape
    return {
        "BNSD": t,
        "BSND": t.transpose(1, 2),
        "BSH": t.transpose(1, 2).reshape(b, s, n * d),
        "SBH": t.transpose(1, 2).reshape(b, s, n * d).transpose(0, 1),
    }[layout]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["BNSD", "BSND", "BSH", "SBH"])
def test_attention_layouts_match_sdpa(dtype, layout):
    q, k, v = _bnsd(dtype=dtype)
    out = ref.npu_fusion_attention(
        _to_layout(q, layout), _to_layout(k, layout), _to_layout(v, layout), 4, layout, scale=1 / math.sqrt(16)
    )
    _close(out[0], _to_layout(_sdpa(q, k, v), layout), dtype)


def test_attention_default_scale_is_one():
    q, k, v = _bnsd()
    out = ref.npu_fusion_attention(q, k, v, 4, "BNSD")[0]
    torch.testing.assert_close(out, _sdpa(q, k, v, scale=1.0))
    assert not torch.allclose(out, _sdpa(q, k, v), atol=1e-3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_bool_mask_is_inverted_relative_to_sdpa(dtype):
    q, k, v = _bnsd(dtype=dtype)
    attend = _rand(2, 1, 6, 6, seed=5) > -0.5  # SDPA: True = attend
    attend[..., 0] = True  # no fully masked rows
    out = ref.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=~attend, scale=0.25)[0]
    _close(out, _sdpa(q, k, v, attn_mask=attend, scale=0.25), dtype)
    # uint8 with 1 = masked is the same mask.
    out8 = ref.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=(~attend).to(torch.uint8), scale=0.25)[0]
    torch.testing.assert_close(out8, out)


@pytest.mark.parametrize("mask_shape", ["SS", "11SS", "B1SS", "BNSS"])
def test_attention_mask_shapes(mask_shape):
    q, k, v = _bnsd()
    full = _rand(2, 4, 6, 6, seed=7) > 0.3
    full[..., 0] = False
    mask = {"SS": full[0, 0], "11SS": full[:1, :1], "B1SS": full[:, :1], "BNSS": full}[mask_shape]
    out = ref.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=mask, scale=0.25)[0]
    torch.testing.assert_close(out, _sdpa(q, k, v, attn_mask=~mask, scale=0.25))


@pytest.mark.parametrize("dtype", DTYPES)
def test_sparse_mode_2_is_sdpa_is_causal(dtype):
    q, k, v = _bnsd(sq=5, skv=9, dtype=dtype)
    out = ref.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=CAUSAL, sparse_mode=2, scale=0.25)[0]
    _close(out, _sdpa(q, k, v, is_causal=True, scale=0.25), dtype)


def test_sparse_mode_3_is_bottom_right_causal():
    q, k, v = _bnsd(sq=5, skv=9)
    attend = torch.ones(5, 9, dtype=torch.bool).tril(9 - 5)
    out = ref.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=CAUSAL, sparse_mode=3, scale=0.25)[0]
    torch.testing.assert_close(out, _sdpa(q, k, v, attn_mask=attend, scale=0.25))
    assert not torch.allclose(out, _sdpa(q, k, v, is_causal=True, scale=0.25))


def test_sparse_mode_4_is_a_bottom_right_sliding_window():
    q, k, v = _bnsd(sq=6, skv=8)
    pre, nxt, off = 2, 1, 2
    i, j = torch.arange(6)[:, None], torch.arange(8)[None]
    attend = (j >= i + off - pre) & (j <= i + off + nxt)
    out = ref.npu_fusion_attention(
        q, k, v, 4, "BNSD", atten_mask=CAUSAL, sparse_mode=4, pre_tockens=pre, next_tockens=nxt, scale=0.25
    )[0]
    torch.testing.assert_close(out, _sdpa(q, k, v, attn_mask=attend, scale=0.25))


def test_sparse_mode_0_window_comes_from_pre_and_next_tockens():
    q, k, v = _bnsd()
    nothing = torch.zeros(6, 6, dtype=torch.bool)
    i, j = torch.arange(6)[:, None], torch.arange(6)[None]
    out = ref.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=nothing, pre_tockens=1, next_tockens=0, scale=0.25)[0]
    torch.testing.assert_close(out, _sdpa(q, k, v, attn_mask=(j <= i) & (j >= i - 1), scale=0.25))
    # Mode 1 takes the mask as given and ignores the window.
    out1 = ref.npu_fusion_attention(
        q, k, v, 4, "BNSD", atten_mask=nothing, pre_tockens=1, next_tockens=0, sparse_mode=1, scale=0.25
    )[0]
    torch.testing.assert_close(out1, _sdpa(q, k, v, scale=0.25))


@pytest.mark.parametrize("mode", [0, 2, 3, 4])
def test_no_mask_means_full_attention_in_every_mode(mode):
    q, k, v = _bnsd()
    out = ref.npu_fusion_attention(q, k, v, 4, "BNSD", sparse_mode=mode, pre_tockens=0, next_tockens=0, scale=0.25)[0]
    torch.testing.assert_close(out, _sdpa(q, k, v, scale=0.25))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["BNSD", "BSH"])
def test_gqa_repeats_each_kv_head(dtype, layout):
    q, k, v = _bnsd(nq=6, nkv=2, dtype=dtype)
    out = ref.npu_fusion_attention(
        _to_layout(q, layout),
        _to_layout(k, layout),
        _to_layout(v, layout),
        6,
        layout,
        atten_mask=CAUSAL,
        sparse_mode=2,
        scale=0.25,
    )[0]
    want = _sdpa(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), is_causal=True, scale=0.25)
    _close(out, _to_layout(want, layout), dtype)
    torch.testing.assert_close(want, _sdpa(q, k, v, is_causal=True, scale=0.25, enable_gqa=True))


@pytest.mark.parametrize("dtype", DTYPES)
def test_tnd_packs_variable_lengths(dtype):
    lengths, kvlengths = [3, 5, 2], [4, 5, 2]
    qs = [_rand(1, 4, s, 16, dtype=dtype, seed=i) for i, s in enumerate(lengths)]
    ks = [_rand(1, 2, s, 16, dtype=dtype, seed=10 + i) for i, s in enumerate(kvlengths)]
    vs = [_rand(1, 2, s, 16, dtype=dtype, seed=20 + i) for i, s in enumerate(kvlengths)]
    pack = lambda ts: torch.cat([t[0].transpose(0, 1) for t in ts])  # noqa: E731 - (T, N, D)
    out, smax, ssum, sout, seed, offset, numels = ref.npu_fusion_attention(
        pack(qs),
        pack(ks),
        pack(vs),
        4,
        "TND",
        atten_mask=CAUSAL,
        sparse_mode=3,
        scale=0.25,
        actual_seq_qlen=[3, 8, 10],
        actual_seq_kvlen=[4, 9, 11],
    )
    want = []
    for q, k, v, sq, skv in zip(qs, ks, vs, lengths, kvlengths):
        attend = torch.ones(sq, skv, dtype=torch.bool).tril(skv - sq)
        want.append(_sdpa(q, k, v, attn_mask=attend, scale=0.25, enable_gqa=True))
    _close(out, pack(want), dtype)
    assert smax.shape == ssum.shape == (10, 4, 8) and sout.numel() == 0


def test_seven_tuple_and_softmax_statistics():
    q, k, v = _bnsd()
    out = ref.npu_fusion_attention(q, k, v, 4, "BNSD", scale=0.25, seed=3, offset=5)
    assert len(out) == 7
    attn, smax, ssum, sout, seed, offset, numels = out
    s = (q @ k.transpose(-1, -2)) * 0.25
    assert smax.shape == (2, 4, 6, 8) and smax.dtype == torch.float32
    torch.testing.assert_close(smax[..., 0], s.amax(-1))
    torch.testing.assert_close(ssum[..., 3], torch.exp(s - s.amax(-1, keepdim=True)).sum(-1))
    assert sout.numel() == 0 and (seed, offset, numels) == (3, 5, 0)


def test_pse_is_added_before_scaling_and_sink_joins_the_softmax():
    q, k, v = _bnsd()
    pse = _rand(1, 4, 6, 6, seed=9)
    out = ref.npu_fusion_attention(q, k, v, 4, "BNSD", pse=pse, scale=0.25)[0]
    torch.testing.assert_close(out, _sdpa(q, k, v, attn_mask=pse * 0.25, scale=0.25))
    sink = _rand(4, seed=4)
    out = ref.npu_fusion_attention(q, k, v, 4, "BNSD", sink=sink, scale=0.25)[0]
    s = torch.cat(((q @ k.transpose(-1, -2)) * 0.25, sink.view(1, 4, 1, 1).expand(2, 4, 6, 1)), -1)
    torch.testing.assert_close(out, s.softmax(-1)[..., :-1] @ v)


def test_dropout_is_deterministic_given_the_generator():
    q, k, v = _bnsd()
    runs = []
    for _ in range(2):
        npu = ref.torch_npu_module(generator=torch.Generator().manual_seed(7))
        runs.append(npu.npu_fusion_attention(q, k, v, 4, "BNSD", keep_prob=0.8, scale=0.25))
    torch.testing.assert_close(runs[0][0], runs[1][0])
    assert runs[0][6] == 2 * 4 * 6 * 6
    assert not torch.allclose(runs[0][0], _sdpa(q, k, v, scale=0.25))
    # In expectation dropout keeps the output: the mean over many draws approaches the plain result.
    npu = ref.torch_npu_module(generator=torch.Generator().manual_seed(8))
    mean = sum(npu.npu_fusion_attention(q, k, v, 4, "BNSD", keep_prob=0.8, scale=0.25)[0] for _ in range(100)) / 100
    torch.testing.assert_close(mean, _sdpa(q, k, v, scale=0.25), atol=0.1, rtol=0.1)


def test_fully_masked_rows_are_only_defined_with_inner_precise_2():
    q, k, v = _bnsd()
    mask = torch.zeros(6, 6, dtype=torch.bool)
    mask[2] = True
    out = ref.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=mask, scale=0.25)[0]
    assert out[:, :, 2].isnan().all() and not out[:, :, 3].isnan().any()
    out = ref.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=mask, scale=0.25, inner_precise=2)[0]
    assert (out[:, :, 2] == 0).all()


def _attn_error(**overrides):
    q, k, v = _bnsd()
    args = dict(query=q, key=k, value=v, head_num=4, input_layout="BNSD")
    args.update(overrides)
    return ref.npu_fusion_attention(**args)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            dict(query=_rand(1, 1, 2, 769), key=_rand(1, 1, 2, 769), value=_rand(1, 1, 2, 769), head_num=1),
            r"\[1, 768\]",
        ),
        (
            dict(query=_rand(1, 257, 2, 8), key=_rand(1, 257, 2, 8), value=_rand(1, 257, 2, 8), head_num=257),
            r"\[1, 256\]",
        ),
        (dict(head_num=2), "does not match"),
        (dict(key=_rand(2, 4, 6, 16, dtype=torch.bfloat16)), "same dtype"),
        (
            dict(query=_rand(2, 4, 6, 16).double(), key=_rand(2, 4, 6, 16).double(), value=_rand(2, 4, 6, 16).double()),
            "not supported",
        ),
        (
            dict(query=_rand(2, 6, 6, 16), head_num=6, key=_rand(2, 4, 6, 16), value=_rand(2, 4, 6, 16)),
            "multiple of key/value heads",
        ),
        (dict(key=_rand(2, 4, 6, 8), value=_rand(2, 4, 6, 8)), "head dims differ"),
        (dict(value=_rand(2, 4, 7, 16)), "same shape"),
        (dict(input_layout="BHSD"), "input_layout must be"),
        (dict(query=_rand(2, 6, 64)), "must be 4-D"),
        (dict(atten_mask=torch.zeros(6, 6)), "bool or uint8"),
        (dict(atten_mask=torch.zeros(2, 6, 6, dtype=torch.bool)), "BNSS, B1SS, 11SS or SS"),
        (dict(atten_mask=torch.zeros(6, 6, dtype=torch.bool), sparse_mode=2), "compressed 2048x2048"),
        (dict(atten_mask=~CAUSAL, sparse_mode=2), "inverted"),
        (dict(atten_mask=CAUSAL.tril(), sparse_mode=3), "inverted"),
        (dict(query=_rand(2, 4, 7, 16), atten_mask=CAUSAL, sparse_mode=3), "Sq <= Skv"),
        (dict(atten_mask=CAUSAL, sparse_mode=4, pre_tockens=-3, next_tockens=1), "overlapping band"),
        (dict(padding_mask=torch.zeros(6, 6, dtype=torch.bool)), "padding_mask"),
        (dict(keep_prob=0.0), "keep_prob"),
        (dict(sparse_mode=7), "not valid"),
        (dict(pse=_rand(2, 4, 6, 6).bfloat16()), "same dtype"),
        (dict(pse=_rand(2, 1, 6, 6)), "pse shape"),
        (dict(sink=_rand(3)), "sink must be"),
        (dict(softmax_layout="TND"), "needs input_layout 'TND'"),
    ],
)
def test_attention_constraints(overrides, message):
    with pytest.raises(NpuOpError, match=message):
        _attn_error(**overrides)


def test_tnd_constraints():
    t = _rand(6, 2, 8)
    with pytest.raises(NpuOpError, match="required"):
        ref.npu_fusion_attention(t, t, t, 2, "TND", actual_seq_kvlen=[6])
    with pytest.raises(NpuOpError, match="leading 0"):
        ref.npu_fusion_attention(t, t, t, 2, "TND", actual_seq_qlen=[0, 3, 6], actual_seq_kvlen=[0, 3, 6])
    with pytest.raises(NpuOpError, match="exceed"):
        ref.npu_fusion_attention(t, t, t, 2, "TND", actual_seq_qlen=[3, 7], actual_seq_kvlen=[3, 6])


def test_the_v1_spelling_is_the_only_one_accepted():
    with pytest.raises(TypeError):
        _attn_error(pre_tokens=1)


def test_what_the_reference_does_not_model_is_not_blamed_on_the_rewrite():
    with pytest.raises(NotModelledError):
        _attn_error(sparse_mode=5)
    with pytest.raises(NotModelledError):
        _attn_error(keep_prob=0.5, dropout_mask=torch.ones(1, dtype=torch.uint8))


# -- the module -------------------------------------------------------------------------------------------


def test_module_counts_calls_and_lacks_other_ops():
    npu = ref.torch_npu_module()
    x = _rand(2, 8)
    npu.npu_rms_norm(x, torch.ones(8))
    npu.npu_rms_norm(x, torch.ones(8))
    npu.npu_swiglu(x)
    with pytest.raises(NpuOpError):
        npu.npu_swiglu(_rand(2, 7))
    assert npu.calls == {"npu_rms_norm": 2, "npu_swiglu": 2}
    assert set(ref.OPS) <= set(dir(npu))
    with pytest.raises(AttributeError):
        npu.npu_fast_gelu  # noqa: B018 - not modelled: a rewrite reaching for it must fail loudly


def test_module_counts_the_kinds_of_attention_calls():
    npu = ref.torch_npu_module()
    q, k, v = _bnsd(nq=4, nkv=2)
    npu.npu_fusion_attention(q, k, v, 4, "BNSD", scale=0.25)
    npu.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=torch.zeros(6, 6, dtype=torch.bool), scale=0.25)
    npu.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=CAUSAL, sparse_mode=2, scale=0.25)
    npu.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=CAUSAL, sparse_mode=4, pre_tockens=1, next_tockens=0)
    npu.npu_fusion_attention(q, k, v, 4, "BNSD", sparse_mode=2, scale=0.25)  # no mask: full attention
    with pytest.raises(NpuOpError):
        npu.npu_fusion_attention(q, k, v, 3, "BNSD")
    assert npu.kinds["npu_fusion_attention"] == {"full": 2, "mask": 1, "causal": 1, "band": 1, "gqa": 5}
    assert npu.calls == {"npu_fusion_attention": 6}  # the rejected call counts as a call, not as a kind
    t = _rand(6, 2, 8)
    npu.npu_fusion_attention(
        t, t, t, 2, "TND", atten_mask=CAUSAL, sparse_mode=3, actual_seq_qlen=[6], actual_seq_kvlen=[6]
    )
    assert npu.kinds["npu_fusion_attention"]["causal"] == 2


def test_templates_emit_only_modelled_ops():
    import re
    from pathlib import Path

    import npu_migrate.templates as templates

    emitted = set()
    for path in Path(templates.__file__).parent.rglob("*.j2"):
        emitted |= set(re.findall(r"torch_npu\.(\w+)", path.read_text(encoding="utf-8")))
    assert emitted and emitted <= set(ref.OPS)
