"""A CPU model of the torch_npu fused kernels that npu-migrate's fused branches call.

`npu-migrate verify` installs `torch_npu_module()` as `torch_npu` in the migrated modules when no NPU is
present, so the fused branches really run; the tests of the fused rewrites do the same. It is the one
model of each kernel: a fused idiom names the kernels it calls (`Idiom.kernels`) and finds its model
here, in `OPS`, by that name. Two things matter as much as the numbers:

* The semantics are the documented ones (torch_npu 2.14; ../shared/reference/torch_npu_facts.md §1),
  including the surprising ones a rewrite can get wrong: `npu_swiglu` activates the *first* half,
  `npu_fusion_attention` masks where the mask is True and scales by 1.0 unless told otherwise, and
  `atten_mask=None` means full attention whatever `sparse_mode` says.
* Each op rejects what the device rejects (dtypes, ranks, shapes, head-dim and head-count limits) with
  `NpuOpError`, a RuntimeError, so a rewrite that would crash on hardware also fails on CPU. Inputs the
  device accepts but this model does not simulate raise `NotModelledError` instead, so a verify failure
  never blames the rewrite for a gap in the reference.

Arithmetic runs in float32 and is cast back to the input dtype, as the kernels do internally.
Nothing here has been compared with a real device: the op docs and meta functions are the only source.
"""

from __future__ import annotations

import collections
import functools
import inspect
import types
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from npu_migrate.verify import op_counts

__all__ = [
    "NotModelledError",
    "NpuOpError",
    "OPS",
    "npu_add_rms_norm",
    "npu_fusion_attention",
    "npu_rms_norm",
    "npu_rotary_mul",
    "npu_swiglu",
    "torch_npu_module",
]

_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_INT_MAX = 2147483647
_COMPRESSED_MASK = 2048


class NpuOpError(RuntimeError):
    """The device kernel would reject this call (a documented constraint is violated)."""


class NotModelledError(NotImplementedError):
    """The device may accept this call, but the CPU reference does not simulate it."""


def _require(ok: bool, op: str, message: str) -> None:
    if not ok:
        raise NpuOpError(f"{op}: {message}")


def _tensor(value, op: str, name: str) -> torch.Tensor:
    _require(isinstance(value, torch.Tensor), op, f"{name} must be a Tensor, got {type(value).__name__}")
    return value


def _kernel_dtype(t: torch.Tensor, op: str, name: str) -> None:
    _require(
        t.dtype in _KERNEL_DTYPES,
        op,
        f"{name} dtype {t.dtype} is not supported (float16, bfloat16, float32 only)",
    )


def _same_dtype(a: torch.Tensor, b: torch.Tensor, op: str, names: str) -> None:
    _require(a.dtype == b.dtype, op, f"{names} must have the same dtype, got {a.dtype} and {b.dtype}")


# -- RMSNorm (facts 1.1, 1.2) -------------------------------------------------------------------------


def _rms_norm(op: str, x: torch.Tensor, gamma: torch.Tensor, epsilon: float):
    _kernel_dtype(x, op, "input")
    _same_dtype(x, gamma, op, "gamma and input")
    # The torch_npu doc says 2-8 dims; CANN >= 8.0 allows 1-D, older CANN does not.
    _require(2 <= x.dim() <= 8, op, f"input must have 2 to 8 dims, got {x.dim()}")
    k = gamma.dim()
    _require(
        1 <= k <= x.dim() and tuple(gamma.shape) == tuple(x.shape[x.dim() - k :]),
        op,
        f"gamma shape {tuple(gamma.shape)} must equal the trailing dims of input shape {tuple(x.shape)}",
    )
    dims = tuple(range(x.dim() - k, x.dim()))
    rstd = torch.rsqrt(x.float().pow(2).mean(dims, keepdim=True) + float(epsilon))
    y = (x.float() * rstd * gamma.float()).to(x.dtype)
    return y, rstd


def npu_rms_norm(self, gamma, epsilon=1e-06):
    """(y, rstd): y = x / sqrt(mean(x², gamma dims) + eps) · gamma, computed in fp32; rstd is fp32."""
    op = "npu_rms_norm"
    return _rms_norm(op, _tensor(self, op, "self"), _tensor(gamma, op, "gamma"), epsilon)


def npu_add_rms_norm(x1, x2, gamma, epsilon=1e-06):
    """(y, rstd, x) with x = x1 + x2 added in the input dtype, then `npu_rms_norm(x, gamma)`."""
    op = "npu_add_rms_norm"
    x1, x2 = _tensor(x1, op, "x1"), _tensor(x2, op, "x2")
    _same_dtype(x1, x2, op, "x1 and x2")
    _require(
        x1.shape == x2.shape, op, f"x1 and x2 must have the same shape, got {tuple(x1.shape)} and {tuple(x2.shape)}"
    )
    x = x1 + x2
    y, rstd = _rms_norm(op, x, _tensor(gamma, op, "gamma"), epsilon)
    return y, rstd, x


# -- SwiGLU (facts 1.3) ---------------------------------------------------------------------------------


def npu_swiglu(self, dim=-1):
    """silu(A) · B, where A is the FIRST half of `self` along `dim` and B the second."""
    op = "npu_swiglu"
    x = _tensor(self, op, "self")
    _kernel_dtype(x, op, "self")
    _require(1 <= x.dim() <= 8, op, f"self must have 1 to 8 dims, got {x.dim()}")
    _require(-x.dim() <= dim < x.dim(), op, f"dim {dim} is out of range for a {x.dim()}-D input")
    _require(x.shape[dim] % 2 == 0, op, f"self.shape[{dim}] = {x.shape[dim]} must be even")
    a, b = x.chunk(2, dim)
    return (F.silu(a.float()) * b.float()).to(x.dtype)


# -- rotary (facts 1.4) ---------------------------------------------------------------------------------

#: The cos/sin shapes the binary kernel accepts for each input layout ('1' = broadcast dim).
_ROTARY_LAYOUTS = {
    "BNSD": ("11SD", "B1SD", "BNSD"),
    "BSND": ("1S1D", "BS1D", "BSND"),
    "SBND": ("S11D", "SB1D", "SBND"),
}
_INTERLEAVE_SHAPES = ("11SD", "1S1D", "S11D")


def _rotary_layouts(x_shape, r_shape, mode: str) -> list[dict[str, int]]:
    """The layouts under which cos/sin of `r_shape` are an allowed broadcast of `x_shape`, as dim sizes."""
    found = []
    for layout, patterns in _ROTARY_LAYOUTS.items():
        sizes = dict(zip(layout, x_shape))
        for pattern in patterns:
            if mode == "interleave" and pattern not in _INTERLEAVE_SHAPES:
                continue
            want = tuple(1 if letter == "1" else sizes[letter] for letter in pattern)
            if tuple(r_shape) == want:
                found.append(sizes)
                break
    return found


def npu_rotary_mul(self, r1, r2, rotary_mode="half", rotate=None):
    """r1·x + r2·x_new: 'half' rotates like HF `rotate_half`, 'interleave' like GPT-J `rotate_every_two`."""
    op = "npu_rotary_mul"
    x, r1, r2 = _tensor(self, op, "self"), _tensor(r1, op, "r1"), _tensor(r2, op, "r2")
    _kernel_dtype(x, op, "self")
    _same_dtype(x, r1, op, "r1 and self")
    _same_dtype(x, r2, op, "r2 and self")
    if rotary_mode in ("quarter", "interleave-half"):
        raise NpuOpError(f"{op}: rotary_mode {rotary_mode!r} is only supported on Ascend 950, not A2/A3")
    _require(
        rotary_mode in ("half", "interleave"), op, f"rotary_mode must be 'half' or 'interleave', got {rotary_mode!r}"
    )
    _require(
        x.dim() == 4 and r1.dim() == 4 and r2.dim() == 4,
        op,
        f"self, r1 and r2 must be 4-D, got {x.dim()}-D, {r1.dim()}-D and {r2.dim()}-D",
    )
    _require(
        r1.shape == r2.shape, op, f"r1 and r2 must have the same shape, got {tuple(r1.shape)} and {tuple(r2.shape)}"
    )
    d = x.shape[-1]
    _require(d % 2 == 0 and d < 896, op, f"the last dim D = {d} must be even and < 896")
    layouts = _rotary_layouts(x.shape, r1.shape, rotary_mode)
    allowed = _INTERLEAVE_SHAPES if rotary_mode == "interleave" else sum(_ROTARY_LAYOUTS.values(), ())
    _require(
        bool(layouts),
        op,
        f"r1/r2 shape {tuple(r1.shape)} is not an allowed broadcast of self {tuple(x.shape)} in "
        f"{rotary_mode} mode (allowed: {', '.join(allowed)})",
    )
    if rotary_mode == "half":
        _require(any(s["B"] < 1000 and s["N"] < 1000 for s in layouts), op, "B and N must each be < 1000")
    else:
        _require(any(s["B"] * s["N"] < 1000 for s in layouts), op, "B * N must be < 1000 in interleave mode")
    if r1.requires_grad or r2.requires_grad:
        _require(any(s["B"] * s["N"] <= 1024 for s in layouts), op, "B * N must be <= 1024 when r1/r2 need grads")
    xf = x.float()
    if rotate is not None:
        rotate = _tensor(rotate, op, "rotate")
        _same_dtype(x, rotate, op, "rotate and self")
        _require(
            rotate.dim() == 2 and tuple(rotate.shape) == (d, d),
            op,
            f"rotate must be a ({d}, {d}) matrix, got {tuple(rotate.shape)}",
        )
        rotated = xf @ rotate.float()
    elif rotary_mode == "half":
        first, second = xf.chunk(2, -1)
        rotated = torch.cat((-second, first), -1)
    else:
        rotated = torch.stack((-xf[..., 1::2], xf[..., ::2]), -1).flatten(-2)
    return (r1.float() * xf + r2.float() * rotated).to(x.dtype)


# -- flash attention (facts 0.1-0.4, 1.5) ---------------------------------------------------------------

_LAYOUTS = ("BSH", "SBH", "BSND", "BNSD", "TND")


def _to_bnsd(t: torch.Tensor, layout: str, heads: int | None, head_dim: int | None, op: str, name: str):
    """(B, N, S, D) from `layout`. BSH/SBH need the head count (query) or the head dim (key/value)."""
    rank = {"BSH": 3, "SBH": 3, "BSND": 4, "BNSD": 4, "TND": 3}[layout]
    _require(t.dim() == rank, op, f"{name} must be {rank}-D for input_layout {layout!r}, got {tuple(t.shape)}")
    if layout in ("BSH", "SBH"):
        if layout == "SBH":
            t = t.transpose(0, 1)
        b, s, h = t.shape
        if heads is None:
            _require(h % head_dim == 0, op, f"{name} hidden size {h} is not a multiple of the head dim {head_dim}")
            heads = h // head_dim
        _require(h % heads == 0, op, f"{name} hidden size {h} is not divisible by head_num {heads}")
        return t.reshape(b, s, heads, h // heads).transpose(1, 2)
    if layout == "BSND":
        return t.transpose(1, 2)
    return t


def _from_bnsd(t: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "BNSD":
        return t
    if layout == "BSND":
        return t.transpose(1, 2)
    b, n, s, d = t.shape
    t = t.transpose(1, 2).reshape(b, s, n * d)
    return t.transpose(0, 1) if layout == "SBH" else t


def _cumulative(value, op: str, name: str) -> list[int]:
    _require(value is not None, op, f"{name} is required for input_layout 'TND'")
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    _require(
        isinstance(value, Sequence) and all(isinstance(v, int) for v in value) and len(value) > 0,
        op,
        f"{name} must be a non-empty list of int",
    )
    _require(
        value[0] != 0,
        op,
        f"{name} holds cumulative sequence ends without a leading 0 (flash-attn cu_seqlens[1:]), got {list(value)}",
    )
    _require(all(b >= a for a, b in zip(value, value[1:])), op, f"{name} must be non-decreasing, got {list(value)}")
    return list(value)


def _check_compressed(mask: torch.Tensor, mode: int, op: str) -> None:
    """Modes 2-4 read a fixed 2048x2048 causal tile: any other mask is not what the kernel assumes."""
    _require(
        tuple(mask.shape) == (_COMPRESSED_MASK, _COMPRESSED_MASK),
        op,
        f"sparse_mode {mode} needs the compressed {_COMPRESSED_MASK}x{_COMPRESSED_MASK} atten_mask, "
        f"got {tuple(mask.shape)}",
    )
    expected = torch.ones(_COMPRESSED_MASK, _COMPRESSED_MASK, dtype=torch.bool, device=mask.device).triu(1)
    _require(
        torch.equal(mask.bool(), expected),
        op,
        f"sparse_mode {mode} needs atten_mask = triu(ones(2048, 2048), 1) with True = masked; "
        "the mask given differs (inverted?)",
    )


def _band(sq: int, skv: int, origin: int, pre: int, nxt: int) -> torch.Tensor:
    """True where key j is outside [i + origin - pre, i + origin + nxt] (inclusive window)."""
    i = torch.arange(sq).unsqueeze(1) + origin
    j = torch.arange(skv).unsqueeze(0)
    return (j < i - pre) | (j > i + nxt)


def _masked_positions(mode, mask, sq, skv, pre, nxt, batch_heads, op):
    """The (.., Sq, Skv) bool of positions the kernel removes; None when nothing is removed."""
    if mask is None:
        # facts 0.3: without a mask every sparse_mode (and pre/next) falls back to full attention.
        return None
    if mode in (0, 1):
        b, n = batch_heads
        allowed = {(b, n, sq, skv), (b, 1, sq, skv), (1, 1, sq, skv), (sq, skv)}
        _require(
            tuple(mask.shape) in allowed,
            op,
            f"atten_mask shape {tuple(mask.shape)} must be BNSS, B1SS, 11SS or SS ({b}, {n}, {sq}, {skv})",
        )
        masked = mask.bool()
        if mode == 0 and (pre < _INT_MAX or nxt < _INT_MAX):
            masked = masked | _band(sq, skv, 0, pre, nxt)
        return masked
    _check_compressed(mask, mode, op)
    if mode == 2:
        return _band(sq, skv, 0, _INT_MAX, 0)
    off = skv - sq
    if mode == 3:
        _require(sq <= skv, op, f"sparse_mode 3 (rightDownCausal) needs Sq <= Skv, got Sq={sq}, Skv={skv}")
        return _band(sq, skv, off, _INT_MAX, 0)
    _require(pre + nxt >= 0, op, f"sparse_mode 4 needs an overlapping band, got pre_tockens={pre}, next_tockens={nxt}")
    return _band(sq, skv, off, pre, nxt)


def _attend(q, k, v, pse, masked, scale, keep_prob, sink, inner_precise, generator):
    """One (B, N, S, D) attention in fp32; returns out, row max and row sum of exp (both fp32)."""
    s = q.float() @ k.float().transpose(-1, -2)
    if pse is not None:
        s = s + pse.float()  # pse_type 1: the bias is added before scaling (facts 1.5)
    s = s * scale
    if masked is not None:
        s = s.masked_fill(masked.to(s.device), float("-inf"))
    if sink is not None:
        s = torch.cat((s, sink.float().view(1, -1, 1, 1).expand(*s.shape[:-1], 1)), -1)
    row_max = s.amax(-1, keepdim=True)
    dead = torch.isneginf(row_max)
    e = torch.exp(s - torch.where(dead, torch.zeros_like(row_max), row_max))
    row_sum = e.sum(-1, keepdim=True)
    p = e / row_sum
    if dead.any():
        # A fully masked row is only defined (zero) with inner_precise=2 (facts 1.5); otherwise the
        # device output is unspecified, which NaN makes visible instead of matching SDPA by luck.
        p = torch.where(dead, torch.zeros_like(p) if inner_precise == 2 else torch.full_like(p, float("nan")), p)
    if sink is not None:
        p = p[..., :-1]
    if keep_prob < 1.0:
        keep = torch.rand(p.shape, generator=generator) < keep_prob
        p = p * keep.to(p.device) / keep_prob
    return p @ v.float(), row_max.squeeze(-1), row_sum.squeeze(-1)


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
    pre_tockens=_INT_MAX,
    next_tockens=_INT_MAX,
    inner_precise=0,
    prefix=None,
    actual_seq_qlen=None,
    actual_seq_kvlen=None,
    sparse_mode=0,
    gen_mask_parallel=True,
    sync=False,
    softmax_layout="",
    sink=None,
    dropout_mask=None,
    seed=0,
    offset=0,
    *,
    _generator=None,
    _kinds=None,
):
    """softmax(mask(scale · (Q·Kᵀ + pse)))·V with dropout; returns the 7-tuple of torch_npu 2.14.

    `atten_mask` True = masked; `scale` defaults to 1.0; GQA repeats each kv head Nq/Nkv times.
    softmax_max / softmax_sum are the row max and row sum of exp replicated 8 times (their device layout
    is UNVERIFIED); softmax_out is empty; seed/offset echo the arguments; numels counts dropout draws.
    `_kinds`, a Counter, is told what each accepted call asked for (`_attention_kinds`).
    """
    op = "npu_fusion_attention"
    q, k, v = (_tensor(t, op, n) for t, n in ((query, "query"), (key, "key"), (value, "value")))
    _kernel_dtype(q, op, "query")
    _same_dtype(q, k, op, "query and key")
    _same_dtype(q, v, op, "query and value")
    _require(input_layout in _LAYOUTS, op, f"input_layout must be one of {', '.join(_LAYOUTS)}, got {input_layout!r}")
    _require(
        isinstance(head_num, int) and 1 <= head_num <= 256, op, f"head_num must be an int in [1, 256], got {head_num!r}"
    )
    _require(padding_mask is None, op, "padding_mask is not supported, pass None")
    _require(
        isinstance(keep_prob, (int, float)) and 0.0 < keep_prob <= 1.0,
        op,
        f"keep_prob must be in (0, 1], got {keep_prob!r}",
    )
    _require(
        isinstance(scale, (int, float)) or (isinstance(scale, torch.Tensor) and scale.dim() == 0),
        op,
        f"scale must be a float, got {type(scale).__name__}",
    )
    scale = float(scale)
    _require(softmax_layout in ("", "TND"), op, f"softmax_layout must be '' or 'TND', got {softmax_layout!r}")
    _require(softmax_layout == "" or input_layout == "TND", op, "softmax_layout 'TND' needs input_layout 'TND'")
    _require(
        k.shape == v.shape, op, f"key and value must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}"
    )
    valid_modes = (0, 1, 2, 3, 4, 6, 7, 8) if input_layout == "TND" else (0, 1, 2, 3, 4, 5, 6)
    _require(
        sparse_mode in valid_modes, op, f"sparse_mode {sparse_mode!r} is not valid for input_layout {input_layout!r}"
    )
    if sparse_mode not in (0, 1, 2, 3, 4):
        raise NotModelledError(
            f"{op}: sparse_mode {sparse_mode} (prefix / split varlen) is not modelled by the CPU reference"
        )
    if dropout_mask is not None:
        raise NotModelledError(f"{op}: an external dropout_mask is not modelled by the CPU reference")
    if atten_mask is not None:
        atten_mask = _tensor(atten_mask, op, "atten_mask")
        _require(
            atten_mask.dtype in (torch.bool, torch.uint8),
            op,
            f"atten_mask must be bool or uint8 (True/1 = masked), got {atten_mask.dtype}",
        )
    if sink is not None:
        sink = _tensor(sink, op, "sink")
        _require(
            sink.dtype == torch.float32 and tuple(sink.shape) == (head_num,),
            op,
            f"sink must be float32 of shape ({head_num},), got {sink.dtype} {tuple(sink.shape)}",
        )

    if input_layout == "TND":
        return _fusion_attention_tnd(
            q,
            k,
            v,
            head_num,
            pse,
            atten_mask,
            scale,
            keep_prob,
            pre_tockens,
            next_tockens,
            inner_precise,
            actual_seq_qlen,
            actual_seq_kvlen,
            sparse_mode,
            sink,
            seed,
            offset,
            _generator,
            _kinds,
            op,
        )

    qb = _to_bnsd(q, input_layout, head_num, None, op, "query")
    head_dim = qb.shape[-1]
    kb = _to_bnsd(k, input_layout, None, head_dim, op, "key")
    vb = _to_bnsd(v, input_layout, None, head_dim, op, "value")
    b, nq, sq, d = qb.shape
    _, nkv, skv, dk = kb.shape
    _require(nq == head_num, op, f"head_num {head_num} does not match the query's {nq} heads")
    _require(1 <= d <= 768, op, f"head dim D = {d} must be in [1, 768]")
    _require(dk == d, op, f"query and key head dims differ: {d} and {dk}")
    _require(kb.shape[0] == b, op, f"query and key batch sizes differ: {b} and {kb.shape[0]}")
    _require(nkv >= 1 and nq % nkv == 0, op, f"query heads {nq} must be a multiple of key/value heads {nkv}")
    if pse is not None:
        pse = _tensor(pse, op, "pse")
        _same_dtype(q, pse, op, "pse and query")
        _require(
            tuple(pse.shape) in {(b, nq, sq, skv), (b, nq, 1, skv), (1, nq, sq, skv)},
            op,
            f"pse shape {tuple(pse.shape)} must be BNSS, BN1S or 1NSS",
        )
    masked = _masked_positions(sparse_mode, atten_mask, sq, skv, pre_tockens, next_tockens, (b, nq), op)
    _count_kinds(_kinds, atten_mask, sparse_mode, nq, nkv)
    if nkv != nq:
        kb, vb = kb.repeat_interleave(nq // nkv, 1), vb.repeat_interleave(nq // nkv, 1)
    out, row_max, row_sum = _attend(qb, kb, vb, pse, masked, scale, keep_prob, sink, inner_precise, _generator)
    numels = b * nq * sq * skv if keep_prob < 1.0 else 0
    return (
        _from_bnsd(out.to(q.dtype), input_layout),
        _stats(row_max),
        _stats(row_sum),
        q.new_empty(0),
        int(seed),
        int(offset),
        numels,
    )


def _count_kinds(kinds, atten_mask, sparse_mode: int, nq: int, nkv: int) -> None:
    """What a call asked for, for tests that check which path a rewrite takes: "full" (no mask, whatever
    the sparse_mode), "mask" (a mask as given, modes 0-1), "causal" (modes 2-3), "band" (mode 4), and
    "gqa" besides when there are fewer kv heads than query heads."""
    if kinds is None:
        return
    if atten_mask is None:
        kinds["full"] += 1
    else:
        kinds[("mask", "mask", "causal", "causal", "band")[sparse_mode]] += 1
    kinds["gqa"] += nkv != nq


def _stats(t: torch.Tensor) -> torch.Tensor:
    return t.unsqueeze(-1).expand(*t.shape, 8).contiguous()


def _fusion_attention_tnd(
    q,
    k,
    v,
    head_num,
    pse,
    atten_mask,
    scale,
    keep_prob,
    pre,
    nxt,
    inner_precise,
    qlen,
    kvlen,
    sparse_mode,
    sink,
    seed,
    offset,
    generator,
    kinds,
    op,
):
    _require(q.dim() == 3 and k.dim() == 3, op, f"query and key must be 3-D (T, N, D) for TND, got {tuple(q.shape)}")
    _require(q.shape[1] == head_num, op, f"head_num {head_num} does not match the query's {q.shape[1]} heads")
    nq, d = q.shape[1], q.shape[2]
    nkv = k.shape[1]
    _require(1 <= d <= 768, op, f"head dim D = {d} must be in [1, 768]")
    _require(k.shape[2] == d, op, f"query and key head dims differ: {d} and {k.shape[2]}")
    _require(nq % nkv == 0, op, f"query heads {nq} must be a multiple of key/value heads {nkv}")
    if pse is not None:
        raise NotModelledError(f"{op}: pse with input_layout 'TND' is not modelled by the CPU reference")
    if atten_mask is not None and sparse_mode in (0, 1):
        raise NotModelledError(f"{op}: a user atten_mask with input_layout 'TND' is not modelled by the CPU reference")
    qends, kvends = _cumulative(qlen, op, "actual_seq_qlen"), _cumulative(kvlen, op, "actual_seq_kvlen")
    _require(len(qends) == len(kvends), op, "actual_seq_qlen and actual_seq_kvlen must have the same length")
    _require(
        qends[-1] <= q.shape[0] and kvends[-1] <= k.shape[0],
        op,
        f"the sequence ends {qends[-1]}/{kvends[-1]} exceed T = {q.shape[0]}/{k.shape[0]}",
    )
    _count_kinds(kinds, atten_mask, sparse_mode, nq, nkv)
    out = q.new_zeros(q.shape[0], nq, v.shape[2], dtype=torch.float32)
    row_max = torch.zeros(q.shape[0], nq)
    row_sum = torch.zeros(q.shape[0], nq)
    q0 = kv0 = 0
    numels = 0
    for q1, kv1 in zip(qends, kvends):
        sq, skv = q1 - q0, kv1 - kv0
        if sq > 0 and skv > 0:
            qb = q[q0:q1].transpose(0, 1).unsqueeze(0)
            kb = k[kv0:kv1].transpose(0, 1).unsqueeze(0).repeat_interleave(nq // nkv, 1)
            vb = v[kv0:kv1].transpose(0, 1).unsqueeze(0).repeat_interleave(nq // nkv, 1)
            masked = _masked_positions(sparse_mode, atten_mask, sq, skv, pre, nxt, (1, nq), op)
            o, m, s = _attend(qb, kb, vb, None, masked, scale, keep_prob, sink, inner_precise, generator)
            out[q0:q1] = o[0].transpose(0, 1)
            row_max[q0:q1], row_sum[q0:q1] = m[0].transpose(0, 1), s[0].transpose(0, 1)
            numels += nq * sq * skv if keep_prob < 1.0 else 0
        q0, kv0 = q1, kv1
    return out.to(q.dtype), _stats(row_max), _stats(row_sum), q.new_empty(0), int(seed), int(offset), numels


# -- the module --------------------------------------------------------------------------------------------

#: Every op the fused rewrites can emit, by kernel name: the names `Idiom.kernels` declare.
OPS = {
    "npu_rms_norm": npu_rms_norm,
    "npu_add_rms_norm": npu_add_rms_norm,
    "npu_swiglu": npu_swiglu,
    "npu_rotary_mul": npu_rotary_mul,
    "npu_fusion_attention": npu_fusion_attention,
}


def torch_npu_module(
    generator: torch.Generator | None = None,
    calls: collections.Counter | None = None,
    kinds: collections.defaultdict | None = None,
) -> types.ModuleType:
    """A stand-in `torch_npu` module: the reference ops plus what they were asked.

    `module.calls` counts the calls per op, rejected ones included; `module.kinds[op]` counts the kinds
    of accepted calls an op tells apart (`npu_fusion_attention`: see `_count_kinds`). `generator` drives
    `npu_fusion_attention` dropout, so `keep_prob < 1` is reproducible; pass a shared `calls` Counter
    (or `kinds`, a defaultdict of Counters) to aggregate several modules. Any other torch_npu attribute
    raises AttributeError, which is what a rewrite reaching for an op the reference lacks should see.
    """
    module = types.ModuleType("torch_npu", "CPU reference model of the torch_npu fused ops (npu-migrate verify).")
    module.calls = collections.Counter() if calls is None else calls
    module.kinds = collections.defaultdict(collections.Counter) if kinds is None else kinds
    module.generator = generator if generator is not None else torch.Generator().manual_seed(0)
    module.__npu_migrate_reference__ = True
    for name, fn in OPS.items():
        setattr(module, name, _counted(module, name, fn))
    return module


def _counted(module: types.ModuleType, name: str, fn):
    # What the module holds for an op, passed to the ops that take it (keyword-only, `_`-prefixed:
    # not part of the torch_npu signature).
    context = {"_generator": lambda: module.generator, "_kinds": lambda: module.kinds[name]}
    extra = {key: value() for key, value in context.items() if key in inspect.signature(fn).parameters}

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        module.calls[name] += 1
        # One fused call in verify's operator counts (and its backward one more), not the CPU operators
        # that model it.
        return op_counts.call_fused(name, fn, *args, **kwargs, **extra)

    return wrapper
