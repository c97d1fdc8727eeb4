"""NPU708: xformers' `memory_efficient_attention` calls get a `torch_npu.npu_fusion_attention` path.

xformers runs only on CUDA: it does not install on an Ascend host. A call keeps its arguments and gets
the original function as a first one, under a wrapper's name, as NPU705 does for flash-attn:

    xops.memory_efficient_attention(q, k, v, attn_bias=xops.LowerTriangularMask())
    ->  _npu_memory_efficient_attention(
            xops.memory_efficient_attention, q, k, v,
            attn_bias=_NpuXformersBias("LowerTriangularMask", lambda: xops.LowerTriangularMask),
        )

The bias is read at the call, where the tool can see what it is: on an NPU host xformers' classes cannot
even be named, so the bias becomes `_NpuXformersBias(<its class>, lambda: <its constructor>, <its
arguments>)`: its kind and sequence lengths are what the kernel takes, and where the original function
runs the lambda gives the constructor, called then with the arguments evaluated once at the call (the
original bias, the original call). `_npu_memory_efficient_attention` (templates/fused/xformers/) calls
npu_fusion_attention through flash-attn's NPU path (`_npu_fusion_flash`, NPU705's): BSND for BMHK (3-D
BMK as one head), scale = `scale` or K**-0.5, keep_prob = 1 - p, `LowerTriangularMask` top-left
(sparse_mode 2), `LowerTriangularFromBottomRightMask` bottom-right (sparse_mode 3), block-diagonal
(`from_seqlens`) biases TND with the cumulative sequence ends.

A bias it cannot read at the call (a variable, a tensor, another xformers bias class, `op=`) is declined
with the reason: an NPU host could not build it. Guards that test for xformers are never flipped; an
import of xformers that only feeds wrapped calls (and the biases they defer) is made conditional
(`optional_imports`), every other one an NPU host would run is reported.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Collection

import libcst as cst

from npu_migrate.engine.rule import EVERY_TARGET, Example, FixSafety, Rule
from npu_migrate.transforms.fused.flash_attn import CORE
from npu_migrate.transforms.fused.idiom import Idiom
from npu_migrate.transforms.fused.symbolic import Outcome

WRAPPER = "fused/xformers/memory_efficient_attention.py.j2"
BIAS = "fused/xformers/bias.py.j2"
#: Where xformers defines or re-exports the function, by version.
QUALIFIED = ("xformers.ops.memory_efficient_attention", "xformers.ops.fmha.memory_efficient_attention")
#: The modules xformers' bias classes are read from (`xops.LowerTriangularMask`, `fmha.attn_bias.X`).
_BIAS_MODULES = ("xformers.ops", "xformers.ops.fmha", "xformers.ops.fmha.attn_bias")
#: The bias classes built without arguments: class -> what the kernel does.
MASKS = {
    "LowerTriangularMask": "causal aligned top-left (sparse_mode 2)",
    "LowerTriangularFromBottomRightMask": "causal aligned bottom-right (sparse_mode 3)",
}
#: The block-diagonal (varlen) classes built by `from_seqlens(q_seqlen, kv_seqlen=None, *, device=None)`.
BLOCK_DIAGONAL = {
    "BlockDiagonalMask": "block-diagonal",
    "BlockDiagonalCausalMask": "block-diagonal, each block causal aligned top-left (sparse_mode 2)",
    "BlockDiagonalCausalFromBottomRightMask": "block-diagonal, each block causal aligned bottom-right (sparse_mode 3)",
}
#: xformers' other biases: what they ask for, which the kernel (or a read at the call) cannot give.
OTHER_BIASES = {
    "LowerTriangularMaskWithTensorBias": "a causal mask plus a tensor bias",
    "LocalAttentionFromBottomRightMask": "local attention",
    "LowerTriangularFromBottomRightLocalAttentionMask": "local attention",
    "BlockDiagonalCausalLocalAttentionMask": "block-diagonal local attention",
    "BlockDiagonalCausalLocalAttentionFromBottomRightMask": "block-diagonal local attention",
    "BlockDiagonalPaddedKeysMask": "padded keys",
    "BlockDiagonalCausalWithOffsetPaddedKeysMask": "padded keys with offsets (a KV cache)",
    "BlockDiagonalCausalLocalAttentionPaddedKeysMask": "padded keys with local attention",
    "PagedBlockDiagonalPaddedKeysMask": "a paged KV cache",
    "PagedBlockDiagonalCausalWithOffsetPaddedKeysMask": "a paged KV cache",
    "BlockDiagonalGappyKeysMask": "gappy keys",
    "BlockDiagonalCausalWithOffsetGappyKeysMask": "gappy keys",
    "PagedBlockDiagonalGappyKeysMask": "a paged KV cache",
}
#: What makes a bias readable at the call.
_BUILD_IN_CALL = (
    "to fuse it, build the bias in the call: `xops.LowerTriangularMask()`, "
    "`LowerTriangularFromBottomRightMask()`, a `BlockDiagonal*Mask.from_seqlens(...)` of the three, or None"
)
#: What to do about a bias the kernel is not given.
_BY_HAND = "nothing in the code can: npu_fusion_attention is not given it here; port the call by hand"

XFORMERS_ATTENTION = Rule(
    id="NPU708",
    name="fused-xformers-attention",
    family="fused",
    summary="xformers `memory_efficient_attention` calls get a `torch_npu.npu_fusion_attention` path; the bias "
    "built at the call is read there (causal, bottom-right causal, block-diagonal varlen)",
    what="""
    Renames every call of xformers' `memory_efficient_attention` (`xformers.ops` or `xformers.ops.fmha`,
    imported unconditionally or by a try-import) to `_npu_memory_efficient_attention(<the function>,
    <the original arguments>)`, its `attn_bias` (by keyword or 4th by position) read at the call:
    None or absent; `LowerTriangularMask()` (causal, aligned top-left: sparse_mode 2);
    `LowerTriangularFromBottomRightMask()` (aligned bottom-right: sparse_mode 3);
    `BlockDiagonalMask`, `BlockDiagonalCausalMask` or `BlockDiagonalCausalFromBottomRightMask`
    `.from_seqlens(q_seqlen, kv_seqlen)` (the sequences packed as [1, total, H, K]: TND, with
    `actual_seq_qlen` / `actual_seq_kvlen` their cumulative ends as host ints); or a conditional
    expression of those. The bias becomes `_NpuXformersBias("<class>", lambda: <its constructor>,
    <its arguments>)`: the class tells the NPU path what to compute, and off the NPU the lambda gives
    the constructor, called with the arguments evaluated once at the call, so that the function gets
    the original bias. On NPU tensors npu_fusion_attention runs in layout BSND (BMHK; 3-D BMK inputs as
    one head), `scale` = the call's or K**-0.5 (the kernel's default is 1.0), keep_prob = 1 - p
    (xformers drops out whenever p > 0, as the kernel does). Off an NPU the function runs with the
    original arguments.

    Declined, with the reason and what would make it apply: a bias that is not read at the call (a
    variable, a tensor, an expression), xformers' other biases (`LowerTriangularMaskWithTensorBias`,
    local attention, padded, paged or gappy keys, `.make_causal()`), `op=` (it names an xformers kernel),
    `output_dtype`, and arguments passed by `*args` / `**kwargs`. At run time on NPU tensors, 5-D
    BMGHK inputs, a block-diagonal bias with a batch other than 1 or lengths that do not add up to
    the tensors', a bottom-right causal query longer than its keys, and what the kernel cannot take
    (dtype, head dim over 768) call the function if the file bound it, and raise with the reason
    otherwise (xformers does not run there).

    Guards that test for xformers (`xops is not None`, `XFORMERS_AVAILABLE`, `x.is_cuda`) are never
    flipped: on an NPU host they keep the code's own fallback, and the finding says so. xformers'
    imports are handled as flash-attn's (NPU705): one that only feeds wrapped calls and the biases
    they defer becomes a try-import with a fallback of None; any other an NPU host would run is
    reported with what to do.
    """,
    why="""
    xformers is CUDA-only: code that calls it stops on an Ascend host, and a hand port to
    npu_fusion_attention easily computes something else (a 1.0 default scale, LowerTriangularMask
    aligned bottom-right as flash-attn's causal is, when xformers aligns it top-left, the block lengths
    given per sequence instead of as cumulative ends).
    """,
    example=Example(
        before="""
            import torch
            import xformers.ops as xops


            def attend(q, k, v):
                return xops.memory_efficient_attention(q, k, v, attn_bias=xops.LowerTriangularMask())
        """,
        after="""
            import torch
            try:
                import xformers.ops as xops
            except ImportError:
                import importlib.util

                if importlib.util.find_spec("torch_npu") is None:
                    raise  # not an Ascend host: the original's error
                xops = None  # the calls take torch_npu's kernel


            # ... fused-op helpers npu-migrate adds here: import torch_npu (guarded), _is_npu, _npu_causal_mask, _is_npu_flash_call, _npu_flash_attn_declined, _npu_fusion_flash, _NpuXformersBias, _npu_xformers_seqlens, _npu_memory_efficient_attention, _npu_xformers_built, _npu_fusion_xformers


            def attend(q, k, v):
                return _npu_memory_efficient_attention(
                    xops and xops.memory_efficient_attention,
                    q,
                    k,
                    v,
                    attn_bias=_NpuXformersBias(
                        "LowerTriangularMask",
                        lambda: xops.LowerTriangularMask,
                    ),
                )
        """,
    ),
    fix_safety=FixSafety.NEEDS_REVIEW,
    review="""
    The fused kernel computes the same function, not the same bits, and its dropout draws other random
    numbers. Off an NPU the function gets the original arguments (the bias built as before, at the
    call of the function instead of just before it). Check that the call is reached on an NPU host (a
    guard that tests for xformers keeps its fallback there), and the migrated model with
    `npu-migrate verify`. The imports it reports stop the module (or the function holding them) on an
    NPU host: port what they import, or make them conditional with a fallback the code tests.
    """,
    tags=frozenset({"fused"}),
    needs_torch_npu=False,
    targets=EVERY_TARGET,
)


def _bias_class(node: ast.expr, resolve: Callable[[ast.expr], str | None]) -> str | None:
    """The xformers bias class `node` names (`xops.LowerTriangularMask` -> "LowerTriangularMask")."""
    name = resolve(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
    if name is None:
        return None
    module, _, last = name.rpartition(".")
    return last if module in _BIAS_MODULES else None


def _read_bias(node: ast.expr, resolve) -> tuple[list[str], str, str]:
    """The bias classes of the leaves of `node` (in `_leaves`' order), or why it cannot be read at the call
    and what would make it (`Outcome.remedy`)."""
    if isinstance(node, ast.IfExp):
        body, why, remedy = _read_bias(node.body, resolve)
        if why:
            return [], why, remedy
        orelse, why, remedy = _read_bias(node.orelse, resolve)
        return body + orelse, why, remedy
    if isinstance(node, ast.Constant) and node.value is None:
        return [], "", ""
    shown = ast.unparse(node)
    if isinstance(node, ast.Call):
        func = node.func
        kind = _bias_class(func, resolve)
        if kind in MASKS:
            if node.args or node.keywords:
                return (
                    [],
                    f"its bias `{shown}` passes arguments (a device) the read at the call does not take",
                    (f"to fuse it, build it as `{kind}()`"),
                )
            return [kind], "", ""
        if isinstance(func, ast.Attribute) and func.attr == "from_seqlens":
            kind = _bias_class(func.value, resolve)
            if kind in BLOCK_DIAGONAL:
                if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
                    return [], f"its bias `{shown}` passes the lengths by `*` / `**`", _BUILD_IN_CALL
                return [kind], "", ""
        if kind is None and isinstance(func, ast.Attribute):
            # `.make_causal()`, `.add_bias(t)`, `from_tensor_list`: named by the method.
            owner = _bias_class(func.value, resolve) or _called_class(func.value, resolve)
            if owner is not None:
                why = f"its bias `{shown}` is built by `{func.attr}`, which the read at the call does not take"
                return [], why, _BY_HAND if func.attr == "add_bias" else _BUILD_IN_CALL
        if kind in OTHER_BIASES:
            return [], f"its bias `{kind}` asks for {OTHER_BIASES[kind]}", _BY_HAND
    if isinstance(node, (ast.Name, ast.Attribute)):
        why = (
            f"its bias `{shown}` is built elsewhere: the rewrite reads a bias only where the call builds it (an NPU "
            "host has no xformers to build one with, and a tensor bias is not fused)"
        )
        return [], why, _BUILD_IN_CALL
    why = f"its bias `{shown}` is not one the rewrite reads at the call (a tensor bias, or an expression)"
    return [], why, _BUILD_IN_CALL


def _called_class(node: ast.expr, resolve) -> str | None:
    """The xformers bias class of a chain of calls (`BlockDiagonalMask.from_seqlens(s)` in `.make_causal()`)."""
    while isinstance(node, (ast.Call, ast.Attribute)):
        node = node.func if isinstance(node, ast.Call) else node.value
        found = _bias_class(node, resolve)
        if found is not None:
            return found
    return None


def _bias_argument(call: ast.Call) -> ast.expr | None:
    if len(call.args) > 3:
        return call.args[3]
    return next((k.value for k in call.keywords if k.arg == "attn_bias"), None)


def _leaves(node):
    """The bias constructors of an `attn_bias` expression, through conditional expressions (ast or libcst)."""
    if isinstance(node, (ast.IfExp, cst.IfExp)):
        body = node.body
        orelse = node.orelse
        return [*_leaves(body), *_leaves(orelse)]
    if isinstance(node, ast.Constant) or (isinstance(node, cst.Name) and node.value == "None"):
        return []
    return [node]


def _nones(node: ast.expr) -> int:
    """The None branches of a conditional bias."""
    if isinstance(node, ast.IfExp):
        return _nones(node.body) + _nones(node.orelse)
    return int(isinstance(node, ast.Constant) and node.value is None)


def _blocking_guard(call: ast.Call, guards: tuple[ast.expr, ...]) -> ast.expr | None:
    """The test of an enclosing `if` that tests for xformers: the module or function called (`xops is not
    None`), a flag or function named after it (`XFORMERS_AVAILABLE`, `is_xformers_available()`), or CUDA."""
    root = call.func
    while isinstance(root, ast.Attribute):
        root = root.value
    called = root.id if isinstance(root, ast.Name) else None
    for test in guards:
        for node in ast.walk(test):
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
            if name == "is_cuda" or name == called or "xformers" in name.lower():
                return test
    return None


def match_call(name, api, names=None, call: ast.Call | None = None, guards=(), resolve=None) -> Outcome:
    function = "memory_efficient_attention"

    def declined(why: str, remedy: str) -> Outcome:
        return Outcome(XFORMERS_ATTENTION, f"`{function}` not rewritten: {why}", remedy=remedy)

    if api is not None and "npu_fusion_attention" not in api.fused_ops:
        return declined(
            f"torch_npu {api.version} has no npu_fusion_attention",
            "nothing in the code can: target a torch_npu that has it (--torch-npu-version)",
        )
    if call is None:
        return declined("the call was not seen", "")
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return declined(
            "it passes arguments by `*` / `**`, where the bias cannot be read at the call",
            "to fuse it, pass query, key, value and attn_bias by name or position",
        )
    for keyword in call.keywords:
        if keyword.arg == "op" and not (isinstance(keyword.value, ast.Constant) and keyword.value.value is None):
            return declined(
                "it passes `op=`, an xformers kernel, which an NPU host cannot name",
                "to fuse it, drop op= where xformers may choose its kernel",
            )
        if keyword.arg == "output_dtype" and not (
            isinstance(keyword.value, ast.Constant) and keyword.value.value is None
        ):
            return declined(
                "it passes `output_dtype` (npu_fusion_attention returns the inputs' dtype)",
                "to fuse it, drop output_dtype and cast the result",
            )
    bias = _bias_argument(call)
    kinds, why, remedy = _read_bias(bias, resolve or (lambda node: None)) if bias is not None else ([], "", "")
    if why:
        return declined(why, remedy)
    described = " or ".join(dict.fromkeys(MASKS.get(k) or BLOCK_DIAGONAL[k] for k in kinds)) or "no bias"
    if kinds and _nones(bias):
        described += " or no bias"
    layouts = {"TND" if k in BLOCK_DIAGONAL else "BSND" for k in kinds} if kinds else {"BSND"}
    layout = " or ".join(sorted(layouts | ({"BSND"} if _nones(bias) else set())))
    message = (
        f"`{function}` gets torch_npu's npu_fusion_attention on NPU tensors (`_npu_{function}`, {layout}, "
        f"{described}); elsewhere the function runs as before"
    )
    guard = _blocking_guard(call, guards)
    if guard is not None:
        message += (
            f"; its guard `{ast.unparse(guard)}` tests for xformers, absent on an NPU host: where it is False there "
            "the code's own fallback runs; let it pass for NPU tensors to take the kernel"
        )
    return Outcome(
        XFORMERS_ATTENTION,
        message,
        template=WRAPPER,
        helpers=(CORE, BIAS, WRAPPER),
        context={"wrapper": f"_npu_{function}", "kinds": tuple(kinds)},
    )


def deferred(call: ast.Call) -> list[ast.expr]:
    """What the rewrite of `call` reads only where the original function runs: the bias constructors."""
    bias = _bias_argument(call)
    parts = []
    for leaf in _leaves(bias) if bias is not None else ():
        parts.append(leaf.func)
    return parts


def _deferred_bias(node: cst.BaseExpression, kinds: list[str]) -> cst.BaseExpression:
    """The bias expression with each constructor read at the call: `_NpuXformersBias(kind, lambda: <the
    constructor>, <its arguments>)`."""
    if isinstance(node, cst.IfExp):
        return node.with_changes(body=_deferred_bias(node.body, kinds), orelse=_deferred_bias(node.orelse, kinds))
    if not isinstance(node, cst.Call):
        return node  # None
    kind = kinds.pop(0)
    lam = cst.Lambda(params=cst.Parameters(), body=node.func)
    args = [cst.Arg(cst.SimpleString(f'"{kind}"')), cst.Arg(lam)]
    args += [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in node.args]
    return cst.Call(
        func=cst.Name("_NpuXformersBias"),
        args=[a.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))) for a in args[:-1]]
        + [args[-1]],
        lpar=node.lpar,
        rpar=node.rpar,
    )


def wrap(call: cst.Call, wrapper: str, kinds: tuple[str, ...] = (), optional: Collection[str] = ()) -> cst.Call:
    """`f(q, k, v, attn_bias=B)` -> `_npu_f(f, q, k, v, attn_bias=<B read at the call>)`, as NPU705's `wrap`
    (`xops and xops.f` where the module is imported conditionally)."""
    from npu_migrate.transforms.fused.flash_attn import wrap as wrap_flash

    if kinds:
        left = list(kinds)
        positional = [a for a in call.args if a.keyword is None]
        args = []
        for arg in call.args:
            is_bias = (arg.keyword is not None and arg.keyword.value == "attn_bias") or (
                arg.keyword is None and len(positional) > 3 and arg is positional[3]
            )
            args.append(arg.with_changes(value=_deferred_bias(arg.value, left)) if is_bias else arg)
        call = call.with_changes(args=args)
    return wrap_flash(call, wrapper, optional)


IDIOM = Idiom(
    rule=XFORMERS_ATTENTION,
    markers=("xformers",),
    identifiers=("memory_efficient_attention", "xformers"),
    kernels=("npu_fusion_attention",),
    match=lambda fn: None,  # calls only
    helpers={
        CORE: "_npu_fusion_flash",
        BIAS: "_NpuXformersBias",
        WRAPPER: "_npu_memory_efficient_attention",
    },
    calls=QUALIFIED,
    match_call=match_call,
    wrap_call=wrap,
    optional_package="xformers",
    resolves_arguments=True,
    deferred=deferred,
)
