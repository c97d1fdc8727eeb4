"""CPU stand-ins for the torch_npu kernels the fused branches call, written from
../shared/reference/torch_npu_facts.md (sections 1.1-1.5), never from the code under test.

Each kernel asserts the constraints the facts give for it, so a guard in the generated code that lets a
violation through fails the test instead of passing silently, and counts its calls in `CALLS`.
Behaviour the facts call undefined on the device is made loud here: a fully masked attention row
without `inner_precise=2` comes out NaN.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

CALLS: dict[str, int] = {"npu_rms_norm": 0, "npu_swiglu": 0, "npu_rotary_mul": 0, "npu_fusion_attention": 0}
#: npu_fusion_attention calls by what they were asked: "mask" (sparse_mode 0 with a mask), "causal"
#: (sparse_mode 2 or 3), "full" (no mask), "gqa" (fewer kv heads than query heads).
ATTENTION_KINDS: dict[str, int] = {"mask": 0, "causal": 0, "full": 0, "gqa": 0}
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def npu_rms_norm(x, gamma, epsilon=1e-6):
    assert gamma.dtype == x.dtype and gamma.shape == x.shape[-1:] and x.dim() >= 2
    CALLS["npu_rms_norm"] += 1
    rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + epsilon)
    return (x.float() * rstd * gamma.float()).to(x.dtype), rstd


def npu_swiglu(x, dim=-1):
    CALLS["npu_swiglu"] += 1
    a, b = x.chunk(2, dim)
    return (F.silu(a.float()) * b.float()).to(x.dtype)


#: facts 1.4, jit_compile=False: the r1/r2 shapes allowed per layout, as (B, N, S) index of x and the
#: shape pattern over x's first three dims ("B", "N", "S" = that dim of x, "1" = one).
_ROTARY_SHAPES = {
    "half": {"BNSD": ("11S", "B1S", "BNS"), "BSND": ("1S1", "BS1", "BSN"), "SBND": ("S11", "SB1", "SBN")},
    "interleave": {"BNSD": ("11S",), "BSND": ("1S1",), "SBND": ("S11",)},
}


def _rotary_layout_ok(x, r, mode):
    for layout, patterns in _ROTARY_SHAPES[mode].items():
        sizes = dict(zip(layout[:3], x.shape[:3]))
        b, n = sizes["B"], sizes["N"]
        if mode == "half" and not (b < 1000 and n < 1000):
            continue
        if mode == "interleave" and not b * n < 1000:
            continue
        for pattern in patterns:
            if tuple(r.shape[:3]) == tuple(1 if p == "1" else sizes[p] for p in pattern):
                return True
    return False


def npu_rotary_mul(x, r1, r2, rotary_mode="half", rotate=None):
    """out = r1 * x + r2 * x_new; 'half': x_new = cat(-x2, x1); 'interleave': stack(-x[1::2], x[::2]).flatten."""
    assert rotate is None
    assert x.dim() == r1.dim() == r2.dim() == 4, "npu_rotary_mul takes 4-D tensors"
    assert x.dtype == r1.dtype == r2.dtype and x.dtype in KERNEL_DTYPES
    assert r1.shape == r2.shape and r1.shape[-1] == x.shape[-1]
    d = x.shape[-1]
    assert d % 2 == 0 and d < 896
    assert _rotary_layout_ok(x, r1, rotary_mode), f"cos/sin {tuple(r1.shape)} not allowed for x {tuple(x.shape)}"
    CALLS["npu_rotary_mul"] += 1
    xf = x.float()
    if rotary_mode == "half":
        x1, x2 = xf.chunk(2, -1)
        x_new = torch.cat((-x2, x1), -1)
    else:
        assert rotary_mode == "interleave"
        x_new = torch.stack((-xf[..., 1::2], xf[..., ::2]), -1).flatten(-2)
    out = r1.float() * xf + r2.float() * x_new
    assert out.shape == x.shape  # the kernel's output has x's shape (meta): nothing may broadcast x
    return out.to(x.dtype)


def _masked_positions(sq, skv, sparse_mode, atten_mask):
    """True = masked (facts 1.5): mode 0 the user mask, 2 top-left causal, 3 bottom-right causal."""
    if atten_mask is None:
        return None  # "With atten_mask=None all modes fall back to full attention."
    i = torch.arange(sq)[:, None]
    j = torch.arange(skv)[None, :]
    if sparse_mode == 0:
        return atten_mask.bool()
    assert atten_mask.shape == (2048, 2048) and torch.equal(
        atten_mask, torch.ones(2048, 2048, dtype=torch.bool).triu(1)
    )
    if sparse_mode == 2:
        return j > i
    if sparse_mode == 3:
        assert sq <= skv
        return j > i + (skv - sq)
    raise AssertionError(f"sparse_mode {sparse_mode} not modelled")


def npu_fusion_attention(
    query,
    key,
    value,
    head_num,
    input_layout,
    pse=None,
    padding_mask=None,
    atten_mask=None,
    scale=1.0,
    keep_prob=1.0,
    pre_tockens=2147483647,
    next_tockens=2147483647,
    inner_precise=0,
    prefix=None,
    actual_seq_qlen=None,
    actual_seq_kvlen=None,
    sparse_mode=0,
    gen_mask_parallel=True,
    sync=False,
):
    assert input_layout in ("BNSD", "BSND") and pse is None and padding_mask is None and prefix is None
    assert keep_prob == 1.0, "dropout is not modelled"
    assert query.dtype == key.dtype == value.dtype and query.dtype in KERNEL_DTYPES
    assert query.dim() == key.dim() == value.dim() == 4 and key.shape == value.shape
    q, k, v = (t.transpose(1, 2) if input_layout == "BSND" else t for t in (query, key, value))
    b, n, sq, d = q.shape
    nkv, skv = k.shape[1], k.shape[2]
    assert head_num == n, "head_num is the query's head count"
    assert 1 <= d <= 768 and n <= 256 and n % nkv == 0 and k.shape[0] == b and k.shape[-1] == d
    if atten_mask is not None:
        assert atten_mask.dtype in (torch.bool, torch.uint8)
        if sparse_mode == 0:
            allowed = {(b, n, sq, skv), (b, 1, sq, skv), (1, 1, sq, skv), (sq, skv)}
            assert tuple(atten_mask.shape) in allowed, f"atten_mask {tuple(atten_mask.shape)} is not BNSS/B1SS/11SS/SS"
    CALLS["npu_fusion_attention"] += 1
    ATTENTION_KINDS["full" if atten_mask is None else "mask" if sparse_mode == 0 else "causal"] += 1
    ATTENTION_KINDS["gqa"] += nkv != n
    # Query head h reads kv head h // (n // nkv): repeat_interleave, as the facts state.
    k = k.repeat_interleave(n // nkv, dim=1)
    v = v.repeat_interleave(n // nkv, dim=1)
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    masked = _masked_positions(sq, skv, sparse_mode, atten_mask)
    if masked is not None:
        s = s.masked_fill(masked, float("-inf"))
    p = torch.softmax(s, dim=-1)
    if masked is not None and inner_precise == 2:
        p = torch.nan_to_num(p, nan=0.0)  # fully masked rows -> 0 only with invalid-row handling
    out = (p @ v.float()).to(query.dtype)
    if input_layout == "BSND":
        out = out.transpose(1, 2)
    empty = torch.empty(0)
    return out, empty, empty, empty, 0, 0, 0


def fake_torch_npu() -> types.SimpleNamespace:
    """A stand-in for the module-level name `torch_npu` in migrated code."""
    return types.SimpleNamespace(
        npu_rms_norm=npu_rms_norm,
        npu_swiglu=npu_swiglu,
        npu_rotary_mul=npu_rotary_mul,
        npu_fusion_attention=npu_fusion_attention,
    )
