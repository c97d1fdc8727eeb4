"""NPU707 (opt-in): `F.scaled_dot_product_attention` calls renamed to `_npu_sdpa`, which calls
`torch_npu.npu_fusion_attention` where it computes the same.

Off by default. torch_npu already dispatches SDPA to the FlashAttentionScore kernel, the one behind
`npu_fusion_attention`, for fp16 / bf16 on Atlas A2 / A3 training products (Ascend's PyTorch training
migration guide, 6.0.RC1 to 6.0.0, "performance_tuning_0027": with torch_npu 2.1.0, 2.2.0 and 2.3.1,
described there as a trial feature). There a wrapper adds nothing but mask work and a larger diff, so
NPU704 leaves those calls native and says so once per file. This rule is for the chips, versions and
masks where native dispatch does not fuse: select it by its id (`--select NPU707`, a prefix such as
`NPU7` does not reach it) or with `fused = { fused-sdpa = true }` in the configuration.

    F.scaled_dot_product_attention(q, k, v, attn_mask=m)  ->  _npu_sdpa(q, k, v, attn_mask=m)

The call keeps its arguments, written and evaluated as before, and is only renamed to a typed wrapper with
SDPA's signature (scriptable). `_npu_sdpa` (templates/fused/sdpa.py.j2) calls SDPA with exactly those
arguments unless the tensors are on an NPU and `_npu_fusion_sdpa` can map them, traps included (inverted
bool mask, scale always passed, the compressed causal mask with sparse_mode 2, keep_prob = 1 - dropout_p).
"""

from __future__ import annotations

import libcst as cst

from npu_migrate.engine.rule import EVERY_TARGET, Example, FixSafety, Rule
from npu_migrate.transforms.fused import attention_eager
from npu_migrate.transforms.fused.idiom import Idiom
from npu_migrate.transforms.fused.symbolic import Outcome

SDPA_WRAPPER = Rule(
    id="NPU707",
    name="fused-sdpa",
    family="fused",
    summary="(opt-in) `F.scaled_dot_product_attention` calls get a guarded `torch_npu.npu_fusion_attention` path",
    what="""
    Off unless selected by its id (`--select NPU707`) or by `fused = { fused-sdpa = true }`: torch_npu
    already runs SDPA as the fused kernel on Atlas A2 / A3 for fp16 / bf16, and NPU704 leaves those calls
    as they are. Select it for chips, torch_npu versions or masks where native dispatch does not fuse.

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
    shapes and scaling differ. A file that calls `npu_fusion_attention` itself (diffusers' dispatcher)
    is left alone, with a finding.
    """,
    why="""
    `torch_npu.npu_fusion_attention` is the NPU's fused attention kernel, and its conventions differ from
    SDPA's (a mask where True means masked out, scale 1.0 by default, causal only through a mask and a
    sparse mode): a hand port easily computes something else. `_npu_sdpa` gets them right, and falls
    back to the original call wherever the kernel cannot compute what SDPA does. Source of the native
    dispatch: Ascend's PyTorch training migration guide (6.0.RC1 to 6.0.0, FlashAttentionScore: "supports
    the native SDPA interface"); which chips, versions and masks it does not cover needs a device to tell.
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
    tags=frozenset({"fused", "opt-in"}),
    needs_torch_npu=False,
    targets=EVERY_TARGET,
)

HELPER = "fused/sdpa.py.j2"
WRAPPER = attention_eager.SDPA_WRAPPER
#: `_npu_fusion_sdpa`: SDPA's arguments mapped onto the kernel, shared by the SDPA wrapper and the eager branch.
FUSION_HELPER = "fused/fusion_sdpa.py.j2"
SDPA = attention_eager.SDPA


def match_call(name: str | None, api, names=None, call=None, guards=()) -> Outcome | None:
    """What to do with a call of the function `name` (a resolved qualified name), in a file whose
    identifiers are `names` (when known)."""
    if name != SDPA:
        return None
    if names is not None and "npu_fusion_attention" in names:
        # diffusers' attention dispatcher: its own NPU backend calls the kernel; a second path would compete.
        return Outcome(
            SDPA_WRAPPER,
            "scaled_dot_product_attention not wrapped, here or at the file's other calls: this file already calls "
            "torch_npu's npu_fusion_attention (its own NPU path)",
            per_file=True,
            remedy="to fuse it, select that path on an NPU",
        )
    if api is not None and "npu_fusion_attention" not in api.fused_ops:
        return Outcome(
            SDPA_WRAPPER,
            f"scaled_dot_product_attention not fused: torch_npu {api.version} has no npu_fusion_attention",
            remedy="nothing in the code can: target a torch_npu that has it (--torch-npu-version)",
        )
    return Outcome(
        SDPA_WRAPPER,
        "scaled_dot_product_attention gets a fused `torch_npu.npu_fusion_attention` path (`_npu_sdpa`); "
        "float masks, fp32, and shapes the kernel does not take run the original call",
        template=HELPER,
        helpers=(HELPER, FUSION_HELPER),
    )


def wrap(call: cst.Call) -> cst.Call:
    """`f(args)` -> `_npu_sdpa(args)`: the typed wrapper takes SDPA's arguments, so the call is only renamed
    (and stays scriptable)."""
    return call.with_changes(func=cst.Name(WRAPPER))


IDIOM = Idiom(
    rule=SDPA_WRAPPER,
    markers=(),
    identifiers=("scaled_dot_product_attention",),
    kernels=("npu_fusion_attention",),
    match=lambda fn: None,
    helpers={HELPER: WRAPPER, FUSION_HELPER: "_npu_fusion_sdpa"},
    calls=(SDPA,),
    match_call=match_call,
    wrap_call=wrap,
)
