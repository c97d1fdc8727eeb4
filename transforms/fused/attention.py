"""NPU704: `F.scaled_dot_product_attention` calls get a `torch_npu.npu_fusion_attention` path.

Unlike the other fused ops this is a call, not a function body: it sits among control flow (HF's
`sdpa_attention_forward`), and what decides whether the kernel computes the same (mask dtype and
shape, dtypes, head counts, GQA) is only known at run time. So the call keeps its arguments, written
and evaluated as before, and only gets renamed to a typed wrapper with SDPA's signature (scriptable):

    F.scaled_dot_product_attention(q, k, v, attn_mask=m)  ->  _npu_sdpa(q, k, v, attn_mask=m)

`_npu_sdpa` (templates/fused/sdpa.py.j2) calls SDPA with exactly those arguments unless the
tensors are on an NPU and `_npu_fusion_sdpa` can map them, traps included (inverted bool mask, scale
always passed, the compressed causal mask with sparse_mode 2, keep_prob = 1 - dropout_p).

Hand-written attention (`softmax(q @ k.transpose(-2, -1) * scale + mask) @ v`) gets a branch in front
of its scores (`attention_eager.py`), where its mask is converted at run time if it can be and the
probabilities are provably not needed. flash-attn calls are NPU705's (`flash_attn.py`).
"""

from __future__ import annotations

import libcst as cst

from npu_migrate.rule import EVERY_TARGET, Example, FixSafety, Rule
from npu_migrate.transforms.fused import attention_eager
from npu_migrate.transforms.fused.idiom import Idiom
from npu_migrate.transforms.fused.symbolic import Function, Outcome

ATTENTION = Rule(
    id="NPU704",
    name="fused-attention",
    family="fused",
    summary="`F.scaled_dot_product_attention` calls and hand-written attention get a guarded"
    " `torch_npu.npu_fusion_attention` path",
    what="""
    Renames every call of `torch.nn.functional.scaled_dot_product_attention` (however imported) to
    `_npu_sdpa(<the original arguments>)`, a typed wrapper with SDPA's signature. Off an NPU, under
    TorchScript or FX, or wherever the kernel would compute something else, `_npu_sdpa` calls SDPA with
    the original arguments.
    On an NPU it calls `torch_npu.npu_fusion_attention(q, k, v, q.shape[1], "BNSD", ...)[0]` when:
    q, k, v are 4-D (B, N, S, D) of one dtype, fp16 or bf16; D <= 768; N <= 256; k and v have one
    shape; the kv heads equal the query heads, or divide them with `enable_gqa=True` (passed
    un-repeated: the kernel groups heads as SDPA does); the mask is None or bool (inverted: True masks
    out on the NPU), broadcast to BNSS/B1SS/11SS, with inner_precise=2 so fully masked rows stay zero;
    not both is_causal and a mask (SDPA raises); not under torch.compile. `is_causal=True` becomes the
    compressed 2048x2048 `triu(1)` mask with sparse_mode=2 (top-left aligned, as SDPA); scale is always
    passed (the kernel's default is 1.0, SDPA's 1/sqrt(D)); keep_prob = 1 - dropout_p.

    Float (additive) masks run the original call: the kernel has no additive mask besides `pse`, whose
    shapes and scaling differ.

    Hand-written attention, `softmax(q @ k.transpose(-2, -1) * scale + mask) @ v` (or `torch.matmul`,
    `/ sqrt(d)`, a softmax upcast and cast back, dropout by `F.dropout` or an `nn.Dropout`, the output
    transposed and projected after), gets a branch in front of the statement computing the scores:
    what comes before it (`repeat_kv`, the heads' transposes) runs on both paths, so the kernel gets the
    tensors the matmuls get. `_npu_eager_attention` converts an additive mask to the kernel's bool mask
    only where every value is 0 or -inf / the dtype's lowest, ORs in a `masked_fill(cond, -inf or
    finfo.min)` condition, declines a row that drops every key (the original spreads it evenly or gives
    NaN), and otherwise calls `_npu_fusion_sdpa` (the same checks as above, fp16 / bf16 only); where it
    returns None the original code runs. The branch copies the statements after the output and returns
    None in place of the probabilities only where they are not needed: a false `output_attentions` /
    `need_weights` parameter (guarded; callers are not proof: a subclass or another module may keep
    them). Only the scores and probabilities become None: any other value returned beside them declines.
    Declined, with the reason: an additive term computed in the
    function (ALiBi, relative position) or two of them, masked scores set to a value other than -inf or
    the lowest, a scale applied after the mask, probabilities used or possibly needed, einsum or 3-D
    layouts, softcapping, code interleaved with the attention.
    flash-attn's calls are NPU705's.
    """,
    why="""
    `torch_npu.npu_fusion_attention` is the NPU's fused attention kernel, and its conventions differ from
    SDPA's (a mask where True means masked out, scale 1.0 by default, causal only through a mask and a
    sparse mode): a hand port easily computes something else. `_npu_sdpa` gets them right, and falls
    back to the original call wherever the kernel cannot compute what SDPA does.
    """,
    example=Example(
        before="""
            import torch
            import torch.nn.functional as F


            def attend(q, k, v, mask):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        """,
        after='''
            import torch
            import torch.nn.functional as F


            try:
                import torch_npu
            except ImportError:  # not an Ascend host: the original code runs
                torch_npu = None


            def _is_npu(x: torch.Tensor) -> bool:
                """Whether the fused torch_npu kernels may run on `x`.

                True where torch_npu imported and `x` is on an NPU.
                """
                # Never while TorchScript compiles or FX traces: their graphs keep the
                # original code.
                if torch.jit.is_scripting():
                    return False
                if torch_npu is None or isinstance(x, torch.fx.Proxy):
                    return False
                return x.device.type == "npu"


            def _npu_sdpa(
                query,  # type: Tensor
                key,  # type: Tensor
                value,  # type: Tensor
                attn_mask=None,  # type: Optional[Tensor]
                dropout_p=0.0,  # type: float
                is_causal=False,  # type: bool
                scale=None,  # type: Optional[float]
                enable_gqa=False,  # type: bool
            ):
                # type: (...) -> Tensor
                """torch.nn.functional.scaled_dot_product_attention, fused on an NPU.

                By npu_fusion_attention where that computes the same; anything else
                runs SDPA itself, with the arguments it was given.
                """
                if _is_npu(query):
                    fused = _npu_fusion_sdpa(
                        query,
                        key,
                        value,
                        attn_mask,
                        dropout_p,
                        is_causal,
                        scale,
                        enable_gqa,
                    )
                    if fused is not None:
                        return fused
                if enable_gqa:
                    return _sdpa_enable_gqa(
                        query, key, value, attn_mask, dropout_p, is_causal, scale
                    )
                if scale is None:  # torch before 2.1 has no `scale`
                    return torch.nn.functional.scaled_dot_product_attention(
                        query, key, value, attn_mask, dropout_p, is_causal
                    )
                return torch.nn.functional.scaled_dot_product_attention(
                    query, key, value, attn_mask, dropout_p, is_causal, scale=scale
                )


            @torch.jit.unused
            def _sdpa_enable_gqa(
                query, key, value, attn_mask, dropout_p, is_causal, scale
            ):
                # type: (Any, Any, Any, Any, Any, Any, Any) -> Tensor
                """SDPA with enable_gqa=True, out of TorchScript's reach.

                torch before 2.5 does not know the argument.
                """
                # TorchScript's stub of this never runs: only its return type counts.
                return torch.nn.functional.scaled_dot_product_attention(
                    query,
                    key,
                    value,
                    attn_mask,
                    dropout_p,
                    is_causal,
                    scale=scale,
                    enable_gqa=True,
                )


            _NPU_CAUSAL_MASK_BY_DEVICE = {}


            def _npu_causal_mask(device):
                """npu_fusion_attention's compressed causal mask, made once per device.

                The 2048x2048 mask its sparse modes 2 to 4 read; True = masked out.
                """
                mask = _NPU_CAUSAL_MASK_BY_DEVICE.get(device)
                if mask is None:
                    mask = torch.ones(2048, 2048, dtype=torch.bool, device=device).triu(1)
                    _NPU_CAUSAL_MASK_BY_DEVICE[device] = mask
                return mask


            @torch.jit.unused
            def _npu_fusion_sdpa(
                query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa
            ):
                # type: (Any, Any, Any, Any, Any, Any, Any, Any) -> Optional[Tensor]
                """SDPA by npu_fusion_attention, or None where the kernel differs."""
                # TorchScript's stub of this never runs: only its return type counts.
                # Where the kernel differs from SDPA: True in its mask means masked
                # *out*; its scale defaults to 1.0, not 1/sqrt(D); without a mask every
                # sparse_mode is full attention, so causal needs the 2048x2048 triu mask
                # with sparse_mode 2, top-left aligned like SDPA's is_causal.
                compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
                if compiling is not None and compiling():
                    return None  # the kernel has no graph mode: torch.compile keeps SDPA
                if not (query.dim() == key.dim() == value.dim() == 4):
                    return None
                if not (
                    query.dtype == key.dtype == value.dtype
                    and query.dtype in (torch.float16, torch.bfloat16)
                ):
                    return None
                batch, heads, q_len, dim = query.shape
                kv_heads, kv_len = key.shape[1], key.shape[2]
                if (
                    key.shape != value.shape
                    or key.shape[0] != batch
                    or key.shape[-1] != dim
                    or dim > 768
                    or heads > 256
                ):
                    return None
                # The kernel groups query head h with kv head h // (heads // kv_heads),
                # as SDPA's enable_gqa does.
                if kv_heads != heads and not (enable_gqa and heads % kv_heads == 0):
                    return None
                if is_causal and attn_mask is not None:
                    return None  # SDPA raises: let it
                mask, sparse_mode, inner_precise = None, 0, 0
                if attn_mask is not None:
                    # A float mask is additive: the kernel only takes masks to drop.
                    if attn_mask.dtype != torch.bool or attn_mask.dim() > 4:
                        return None
                    shape = (1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape)
                    if any(
                        m not in (1, full)
                        for m, full in zip(shape, (batch, heads, q_len, kv_len))
                    ):
                        return None
                    # The kernel takes BNSS, B1SS and 11SS masks: broadcast SDPA's to
                    # the nearest of those.
                    mask_heads = heads if shape[1] != 1 else 1
                    mask_batch = batch if shape[0] != 1 or mask_heads != 1 else 1
                    expanded = attn_mask.reshape(shape).expand(
                        mask_batch, mask_heads, q_len, kv_len
                    )
                    mask = torch.logical_not(expanded).contiguous()
                    # Rows SDPA masks entirely are zeros; the kernel needs 2 for that.
                    inner_precise = 2
                elif is_causal:
                    mask = _npu_causal_mask(query.device)
                    sparse_mode = 2
                if scale is None:
                    import math

                    scale = 1.0 / math.sqrt(dim)  # SDPA's default, computed as SDPA does
                return torch_npu.npu_fusion_attention(
                    query,
                    key,
                    value,
                    heads,
                    "BNSD",
                    atten_mask=mask,
                    scale=scale,
                    keep_prob=1.0 - dropout_p,
                    sparse_mode=sparse_mode,
                    inner_precise=inner_precise,
                )[0]


            def attend(q, k, v, mask):
                return _npu_sdpa(q, k, v, attn_mask=mask)
        ''',
    ),
    fix_safety=FixSafety.NEEDS_REVIEW,
    review="""
    The fused kernel computes the same function, not the same bits: it rounds differently from the
    operators it replaces (within the dtype's precision). Off an NPU nothing changes, bit for bit.
    Check the migrated model with `npu-migrate verify`, which compares one forward pass of the original
    and the migrated tree.
    """,
    tags=frozenset({"fused"}),
    needs_torch_npu=False,
    targets=EVERY_TARGET,
)

HELPER = "fused/sdpa.py.j2"
WRAPPER = attention_eager.SDPA_WRAPPER
#: `_npu_fusion_sdpa`: SDPA's arguments mapped onto the kernel, shared by the SDPA wrapper and the eager branch.
FUSION_HELPER = "fused/fusion_sdpa.py.j2"
EAGER_TEMPLATE = "fused/eager_attention.py.j2"
EAGER_HELPER = "fused/npu_eager_attention.py.j2"
SDPA = attention_eager.SDPA


def match_call(name: str | None, api, names=None, call=None, guards=()) -> Outcome | None:
    """What to do with a call of the function `name` (a resolved qualified name), in a file whose
    identifiers are `names` (when known)."""
    if name != SDPA:
        return None
    if names is not None and "npu_fusion_attention" in names:
        # diffusers' attention dispatcher: its own NPU backend calls the kernel; a second path would compete.
        return Outcome(
            ATTENTION,
            "scaled_dot_product_attention not wrapped, here or at the file's other calls: this file already calls "
            "torch_npu's npu_fusion_attention (its own NPU path); select that path on an NPU",
            per_file=True,
        )
    if api is not None and "npu_fusion_attention" not in api.fused_ops:
        return Outcome(
            ATTENTION, f"scaled_dot_product_attention not fused: torch_npu {api.version} has no npu_fusion_attention"
        )
    return Outcome(
        ATTENTION,
        "scaled_dot_product_attention gets a fused `torch_npu.npu_fusion_attention` path (`_npu_sdpa`); "
        "float masks, fp32, and shapes the kernel does not take run the original call",
        template=HELPER,
        helpers=(HELPER, FUSION_HELPER),
    )


def wrap(call: cst.Call) -> cst.Call:
    """`f(args)` -> `_npu_sdpa(args)`: the typed wrapper takes SDPA's arguments, so the call is only renamed
    (and stays scriptable)."""
    return call.with_changes(func=cst.Name(WRAPPER))


# -- hand-written attention ---------------------------------------------------------------------------


def match(fn: Function) -> Outcome | None:
    """A branch for hand-written attention, or a finding that says why it gets none."""
    if not attention_eager.is_hand_written_attention(fn):
        return None
    try:
        fusion = attention_eager.fuse(fn)
    except attention_eager.Declined as why:
        return Outcome(ATTENTION, f"hand-written attention (softmax of q @ k^T, then @ v) not fused: {why}")
    if fusion is None:
        return None  # fused by an earlier run
    return Outcome(
        ATTENTION,
        "hand-written attention gets a fused `torch_npu.npu_fusion_attention` branch (`_npu_eager_attention`);"
        " masks other than 0 / -inf, fp32, and shapes the kernel does not take run the original code",
        EAGER_TEMPLATE,
        fusion.context(),
        (FUSION_HELPER, EAGER_HELPER),
        before=fusion.before,
    )


IDIOM = Idiom(
    rule=ATTENTION,
    markers=("scaled_dot_product_attention", "softmax"),
    identifiers=("scaled_dot_product_attention", "softmax"),
    kernels=("npu_fusion_attention",),
    match=match,
    template=EAGER_TEMPLATE,
    helpers={HELPER: WRAPPER, FUSION_HELPER: "_npu_fusion_sdpa", EAGER_HELPER: "_npu_eager_attention"},
    calls=(SDPA,),
    match_call=match_call,
    wrap_call=wrap,
)
