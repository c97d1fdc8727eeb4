"""NPU704: hand-written attention gets a `torch_npu.npu_fusion_attention` branch; SDPA calls stay native.

torch_npu dispatches `F.scaled_dot_product_attention` to the FlashAttentionScore kernel (the one behind
`npu_fusion_attention`) for fp16 / bf16 on Atlas A2 / A3 (Ascend's training migration guide; see
`sdpa_wrapper.py`), so an SDPA call is left as it is and reported once per file as fused natively. The
wrapper that routes it to the kernel itself is NPU707, opt-in, for the chips, versions and masks native
dispatch does not fuse; when it is selected it takes the calls instead (`FusedOpsChecker._call`: the
idiom with the higher rule id among those selected).

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
    summary="hand-written attention gets a guarded `torch_npu.npu_fusion_attention` branch;"
    " `F.scaled_dot_product_attention` calls are left to torch_npu's native fused dispatch",
    what="""
    Hand-written attention, `softmax(q @ k.transpose(-2, -1) * scale + mask) @ v` (or `torch.matmul`,
    `/ sqrt(d)`, a softmax upcast and cast back, dropout by `F.dropout` or an `nn.Dropout`, the output
    transposed and projected after), gets a branch in front of the statement computing the scores:
    what comes before it (`repeat_kv`, the heads' transposes) runs on both paths, so the kernel gets the
    tensors the matmuls get. `_npu_eager_attention` converts an additive mask to the kernel's bool mask
    only where every value is 0 or -inf / the dtype's lowest, ORs in a `masked_fill(cond, -inf or
    finfo.min)` condition, declines a row that drops every key (the original spreads it evenly or gives
    NaN), and otherwise calls `_npu_fusion_sdpa`: on an NPU, fp16 / bf16, 4-D (B, N, S, D) tensors,
    D <= 768, N <= 256, the mask inverted (True masks out on the NPU), scale always passed (the kernel's
    default is 1.0), keep_prob = 1 - dropout_p, not under torch.compile; where it returns None the
    original code runs. The branch copies the statements after the output and returns
    None in place of the probabilities only where they are not needed: a false `output_attentions` /
    `need_weights` parameter (guarded; callers are not proof: a subclass or another module may keep
    them). Only the scores and probabilities become None: any other value returned beside them declines.
    A mask computed in the function that would repeat a computation or not fit the line as an argument is
    bound to names in the branch first, each step once, under the test the original computes it under.
    A bias read from an `nn.Parameter` (a trained relative-position table) is never 0 / -inf: the branch
    is skipped where it is added, and the finding says so. Declined, with the reason: such a bias added on
    every call, an additive term computed by a call the branch cannot repeat (ALiBi, relative position)
    or two terms, masked scores set to a value other than -inf or
    the lowest, a scale applied after the mask, probabilities used or possibly needed, a mask on heads
    folded into the batch, softcapping, code interleaved with the attention.

    Matmuls are read by what they compute: an einsum of two operands (torch's or einops' spelling, `...`
    leading dims) is the matmul it equals once each operand is arranged as (batch, heads, ...), so
    channel-first or sequence-first layouts pass the kernel transposed views; `torch.bmm` or a 3-D einsum
    on (batch * heads, seq, dim) passes one head each (`unsqueeze(1)`, the output squeezed back); one kv
    head shared by every query head (`"b h i d, b j d -> b h i j"`) is grouped-query attention. A mask
    applied under a one-line predicate of the module (`exists(mask)`: `return val is not None`) is
    tested again by the branch; `-torch.finfo(t.dtype).max` is the dtype's lowest.

    Calls of `torch.nn.functional.scaled_dot_product_attention` (however imported, `from
    torch.nn.functional import scaled_dot_product_attention` too) are left as they are and reported
    once per file: torch_npu runs them as the fused FlashAttentionScore kernel on Atlas A2 / A3 for
    fp16 / bf16. For the chips, versions and masks where it does not, the opt-in NPU707 wraps them.
    flash-attn's calls are NPU705's.
    """,
    why="""
    `torch_npu.npu_fusion_attention` is the NPU's fused attention kernel; native SDPA dispatch reaches it,
    hand-written attention (matmul, mask, softmax, matmul) never does, so that is what needs a branch. The
    kernel's conventions differ from the original's (a mask where True means masked out, scale 1.0 by
    default, causal only through a mask and a sparse mode): a hand port easily computes something else.
    Source for the native dispatch: Ascend's PyTorch training migration guide (6.0.RC1 to 6.0.0,
    "performance_tuning_0027", FlashAttentionScore supports the native SDPA interface with torch_npu
    2.1.0 / 2.2.0 / 2.3.1 on Atlas A2 / A3; a trial feature there).
    """,
    example=Example(
        before="""
            import torch


            def attend(q, k, v, bias):
                return (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5 + bias).softmax(dim=-1) @ v
        """,
        after="""
            import torch


            # ... fused-op helpers npu-migrate adds here: import torch_npu (guarded), _is_npu, _npu_causal_mask, _npu_fusion_sdpa, _npu_eager_attention


            def attend(q, k, v, bias):
                if _is_npu(q):
                    fused_attention = _npu_eager_attention(
                        q, k, v, bias, None, 0.0, 1.0 / q.shape[-1] ** 0.5
                    )
                    if fused_attention is not None:
                        return fused_attention
                return (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5 + bias).softmax(dim=-1) @ v
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


#: The finding at a file's first SDPA call; per file, as the reason is the same at every call.
NATIVE = (
    "scaled_dot_product_attention left as it is (and the file's other calls): torch_npu runs it as the fused "
    "FlashAttentionScore kernel on Atlas A2 / A3 for fp16 / bf16 (Ascend's training migration guide); for other "
    "chips, versions or masks select NPU707 (`fused = { fused-sdpa = true }`), a wrapper that calls "
    "npu_fusion_attention itself"
)


def match_call(name: str | None, api, names=None, call=None, guards=()) -> Outcome | None:
    """An SDPA call is fused natively: reported once per file, not rewritten (NPU707 wraps it, opt-in)."""
    if name != SDPA:
        return None
    # Not a candidate left for a human (analyze counts those as work): nothing is left to do.
    return Outcome(ATTENTION, NATIVE, per_file=True, data={"fused": "native"})


def wrap(call: cst.Call) -> cst.Call:
    """Never reached: NPU704 rewrites no call (its outcome has no template)."""
    return call


# -- hand-written attention ---------------------------------------------------------------------------


def match(fn: Function) -> Outcome | None:
    """A branch for hand-written attention, or a finding that says why it gets none."""
    if not attention_eager.is_hand_written_attention(fn):
        return None
    try:
        fusion = attention_eager.fuse(fn)
    except attention_eager.Declined as why:
        return Outcome(
            ATTENTION, f"hand-written attention (softmax of q @ k^T, then @ v) not fused: {why}", remedy=why.remedy
        )
    if fusion is None:
        return None  # fused by an earlier run
    # Where the scores get a learned bias the branch is skipped, not taken to fall back every call: say so.
    skipped = "".join(
        f"; the branch is skipped where `{test}`: there the scores get a learned bias (from `{bias}`), never a mask"
        " of 0 / -inf, which the kernel cannot take"
        for test, bias in fusion.attention.skipped
    )
    return Outcome(
        ATTENTION,
        "hand-written attention gets a fused `torch_npu.npu_fusion_attention` branch (`_npu_eager_attention`);"
        " masks other than 0 / -inf, fp32, and shapes the kernel does not take run the original code" + skipped,
        EAGER_TEMPLATE,
        fusion.context(),
        (FUSION_HELPER, EAGER_HELPER),
        before=fusion.before,
    )


IDIOM = Idiom(
    rule=ATTENTION,
    # `Softmax`: an `nn.Softmax(dim=-1)` module called on the scores (attention_eager._softmax_module)
    markers=("scaled_dot_product_attention", "softmax", "Softmax"),
    identifiers=("scaled_dot_product_attention", "softmax", "Softmax"),
    kernels=("npu_fusion_attention",),
    match=match,
    template=EAGER_TEMPLATE,
    # `_npu_sdpa` stays declared here too: a stale copy of it is reported under NPU704, selected by default.
    helpers={HELPER: WRAPPER, FUSION_HELPER: "_npu_fusion_sdpa", EAGER_HELPER: "_npu_eager_attention"},
    calls=(SDPA,),
    match_call=match_call,
    wrap_call=wrap,
)
