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

from npu_migrate.engine.rule import EVERY_TARGET, Example, FixSafety, Rule
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
        after="""
            import torch
            import torch.nn.functional as F


            # ... fused-op helpers npu-migrate adds here: import torch_npu (guarded), _is_npu, _npu_sdpa, _sdpa_enable_gqa, _npu_causal_mask, _npu_fusion_sdpa


            def attend(q, k, v, mask):
                return _npu_sdpa(q, k, v, attn_mask=mask)
        """,
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
