"""NPU705: flash-attn calls get a `torch_npu.npu_fusion_attention` path on NPU tensors.

flash-attn runs only on CUDA: it does not even import on an Ascend host. A call of one of its attention
functions keeps its arguments and gets the original function as a first one, under a wrapper's name:

    flash_attn_func(q, k, v, causal=True)  ->  _npu_flash_attn_func(flash_attn_func, q, k, v, causal=True)

`_npu_flash_attn_func` (templates/fused/flash_attn/) calls `flash_attn_func(q, k, v, causal=True)`
unless the tensors are on an NPU; there it reads the arguments with flash-attn's signature and calls
npu_fusion_attention: BSND (dense) or TND (varlen, `actual_seq_qlen` / `actual_seq_kvlen` = the
cu_seqlens without the leading 0, as host ints), scale = softmax_scale or D**-0.5, keep_prob =
1 - dropout_p, causal = the compressed triu mask with sparse_mode 3 (flash-attn >= 2.1 aligns it
bottom-right; 1.x's `flash_attn_unpadded_func` top-left: sparse_mode 2), window_size = sparse_mode 4.

Where the flash path runs on an NPU host is the program's own decision, never flipped here: flash-attn
is absent there, so every guard that tests for it (`flash_attn_func is not None`, a flag set by a
try-import, `x.is_cuda`) keeps its fallback. A call reached without such a guard (an unconditional
import, or a try-import whose fallback is not tested before the call) runs the kernel through the
wrapper. What the kernel cannot compute on an NPU (ALiBi slopes, softcap, the probabilities, a paged
KV cache, a causal query longer than its keys) calls the name's fallback if the file bound one, and
raises with the reason otherwise: the original could not run there either.

flash-attn's imports, which stop an NPU host before any call, are made conditional where they only feed
wrapped calls, and reported elsewhere (`optional_imports`).
"""

from __future__ import annotations

import ast
from collections.abc import Collection

import libcst as cst

from npu_migrate.engine.rule import EVERY_TARGET, Example, FixSafety, Rule
from npu_migrate.transforms.fused.idiom import Idiom
from npu_migrate.transforms.fused.symbolic import Outcome

#: What every wrapper calls: the NPU path (`_npu_fusion_flash`).
CORE = "fused/flash_attn/core.py.j2"
#: flash-attn's functions -> the helpers a call of it needs besides CORE: `templates/fused/flash_attn/<f>.py.j2`
#: defines its wrapper `_npu_<f>` (the packed ones read their arguments through `flash_attn_func`'s).
FUNCTIONS = {
    "flash_attn_func": ("flash_attn_func",),
    "flash_attn_kvpacked_func": ("flash_attn_func", "flash_attn_kvpacked_func"),
    "flash_attn_qkvpacked_func": ("flash_attn_func", "flash_attn_qkvpacked_func"),
    "flash_attn_varlen_func": ("flash_attn_varlen_func",),
    "flash_attn_varlen_qkvpacked_func": ("flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func"),
    "flash_attn_unpadded_func": ("flash_attn_unpadded_func",),
}
#: The positional arguments a call may pass: past `causal`, flash-attn's versions order the parameters
#: differently (2.8 moved `softcap` last), so a later one passed by position is ambiguous.
POSITIONAL = {"flash_attn_varlen_qkvpacked_func": 6}
#: Their qualified names (`flash_attn.X`, `flash_attn.flash_attn_interface.X`) -> the function.
QUALIFIED = {f"{module}.{f}": f for f in FUNCTIONS for module in ("flash_attn", "flash_attn.flash_attn_interface")}
#: FlashAttention-3 (the Hopper build, module `flash_attn_interface`): reported, never wrapped. Its functions
#: share flash-attn 2's names, not their signatures (no dropout_p; fp8 descales),
#: and its releases differ in what they return (`out` or `(out, softmax_lse)`).
FA3 = frozenset(
    f"flash_attn_interface.{f}" for f in ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_qkvpacked_func")
)


def _template(function: str) -> str:
    return f"fused/flash_attn/{function}.py.j2"


#: Keyword arguments whose non-default value the kernel cannot compute, with the default and the reason: a call
#: passing one is not rewritten.
DECLINED = {  # keyword: (its default, what it asks for, what would let the call be fused: `Outcome.remedy`)
    "alibi_slopes": (
        None,
        "ALiBi slopes (npu_fusion_attention takes a bias tensor, not slopes)",
        "nothing in the code can: the slopes would have to become a bias tensor, by hand",
    ),
    "softcap": (
        0,
        "logit soft-capping (npu_fusion_attention has none)",
        "nothing in the code can: the kernel has no soft-capping",
    ),
    "return_attn_probs": (
        False,
        "the attention probabilities (npu_fusion_attention does not return them)",
        "to fuse it, drop return_attn_probs where the probabilities are not used",
    ),
    "block_table": (
        None,
        "a paged KV cache (block_table)",
        "nothing in the code can: the kernel takes no paged KV cache",
    ),
}

FLASH_ATTN = Rule(
    id="NPU705",
    name="fused-flash-attn",
    family="fused",
    summary="flash-attn calls (`flash_attn_func`, varlen, packed) get a `torch_npu.npu_fusion_attention` path; "
    "its imports that would stop an NPU host are made conditional or reported",
    what="""
    Renames every call of flash-attn's `flash_attn_func`, `flash_attn_kvpacked_func`,
    `flash_attn_qkvpacked_func`, `flash_attn_varlen_func`, `flash_attn_varlen_qkvpacked_func` (its
    arguments after `causal` by keyword only: their order differs between versions) and 1.x's
    `flash_attn_unpadded_func` (imported
    unconditionally or by a try-import) to `_npu_<function>(<the function>, <the original arguments>)`.
    Off an NPU the wrapper calls the function with the original arguments. On NPU tensors it calls
    `torch_npu.npu_fusion_attention` in layout BSND (dense) or TND (varlen, with `actual_seq_qlen` /
    `actual_seq_kvlen` = `cu_seqlens[1:]` as host ints: one device-to-host copy per call), `scale` =
    softmax_scale or D**-0.5 (the kernel's default is 1.0), `keep_prob` = 1 - dropout_p, and
    `causal=True` as the compressed 2048x2048 `triu(1)` mask with sparse_mode 3: flash-attn (>= 2.1) aligns
    a causal mask bottom-right when q is shorter than k (`flash_attn_unpadded_func`, 1.x, top-left:
    sparse_mode 2); `window_size` becomes sparse_mode 4 with pre/next tokens. fp16, bf16, fp32; D <= 768;
    query heads <= 256, a multiple of the kv heads (GQA groups as in flash-attn).

    Where the call is reached on an NPU host stays the program's decision: guards that test for
    flash-attn (`flash_attn_func is not None`, a flag a try-import sets, `x.is_cuda`) are never flipped.
    Declined, with the reason: a call passing `alibi_slopes`, `softcap`, `return_attn_probs=True` or a
    `block_table`. The same values, or a causal query longer than its keys, reaching the wrapper at run
    time on an NPU call the name's fallback when the file binds one, and raise with the reason
    otherwise (flash-attn does not run there).

    flash-attn does not install on an NPU host, so its imports are looked at in every file: an import
    of the wrapped functions, at module level or inside a function, becomes a try-import with a
    fallback of None when the wrapped calls (and tests such as `if flash_attn_func is not None:`) are
    all that read its names in the scope it binds them in; so does `import flash_attn` read only by
    wrapped calls through the module, which then pass `flash_attn and flash_attn.<function>` (None on an
    NPU host, where reading the attribute would fail before the wrapper runs). FlashAttention-3's calls
    (`flash_attn_interface`: other arguments, another return value) are reported with the port. Every
    other import of flash_attn an NPU host would run (`flash_attn.bert_padding`, `flash_attn.ops.rms_norm`,
    `flash_attn.layers.rotary`, a function's own import) is reported, once per statement, with the advice of
    `npu-migrate analyze` for what it imports. Imports an NPU host does not run are left alone: in a
    `try` whose handler catches ImportError (or a base of it) without raising again, under
    `contextlib.suppress(ImportError)`, on the side of an `if` an NPU host does not take (a test of
    flash-attn's presence: `is_flash_attn_2_available()`, `importlib.util.find_spec("flash_attn")`, a
    flag a try-import or such a test sets, `TYPE_CHECKING`, a test of CUDA that the guard rules keep in
    front of it: `torch.cuda.is_available()`, `x.is_cuda`; the `else` of `is_torch_npu_available()`), or
    after an `if` an NPU host takes that returns or raises.
    """,
    why="""
    flash-attn is a CUDA-only package: code that calls it stops on an Ascend host, and a hand port to
    npu_fusion_attention easily computes something else (a 1.0 default scale, a mask where True means
    masked out, causal alignment top-left instead of bottom-right, cumulative sequence ends without the
    leading 0).
    """,
    example=Example(
        before="""
            import torch

            try:
                from flash_attn import flash_attn_func
            except ImportError:
                flash_attn_func = None


            def attend(q, k, v):
                return flash_attn_func(q, k, v, causal=True)
        """,
        after="""
            import torch


            # ... fused-op helpers npu-migrate adds here: import torch_npu (guarded), _is_npu, _npu_causal_mask, _is_npu_flash_call, _npu_flash_attn_declined, _npu_fusion_flash, _npu_flash_attn_func, _flash_attn_func_args

            try:
                from flash_attn import flash_attn_func
            except ImportError:
                flash_attn_func = None


            def attend(q, k, v):
                return _npu_flash_attn_func(flash_attn_func, q, k, v, causal=True)
        """,
    ),
    fix_safety=FixSafety.NEEDS_REVIEW,
    review="""
    The fused kernel computes the same function, not the same bits, and its dropout draws other random
    numbers. Off an NPU nothing changes. Check that the call is reached on an NPU host (a guard that
    tests for flash-attn keeps its fallback there), and the migrated model with `npu-migrate verify`.
    flash-attn's own semantics are assumed from 2.1 on: 2.0 aligned `causal` top-left when q and k lengths
    differ, and took `return_attn_probs` as its 7th positional argument; on 2.0, check causal calls with
    unequal lengths and calls passing more than six arguments by position. The imports it reports stop
    the module (or the function holding them) on an NPU host: port what they import, or make them
    conditional with a fallback the code tests.
    """,
    tags=frozenset({"fused"}),
    needs_torch_npu=False,
    targets=EVERY_TARGET,
)


def _passes(keyword: ast.keyword, default) -> bool:
    """Whether the argument is a literal other than the default; anything else is decided at run time."""
    try:
        return ast.literal_eval(keyword.value) != default
    except ValueError:
        return False


def _blocking_guard(call: ast.Call | None, guards: tuple[ast.expr, ...]) -> ast.expr | None:
    """The test of an enclosing `if` that is False on an NPU host: `x.is_cuda`, or the presence of the
    function called (`flash_attn_func is not None`, `if flash_attn_func:`), absent there."""
    called = call.func.id if call is not None and isinstance(call.func, ast.Name) else None
    for test in guards:
        for node in ast.walk(test):
            if isinstance(node, ast.Attribute) and node.attr == "is_cuda":
                return test
            if isinstance(node, ast.Name) and node.id == called:
                return test
    return None


def match_call(name: str, api, names=None, call: ast.Call | None = None, guards=()) -> Outcome:
    if name in FA3:
        return Outcome(
            FLASH_ATTN,
            f"`{name}` (FlashAttention-3) not rewritten: its arguments and return value are not flash-attn 2's "
            "(no dropout_p, fp8 descales; `out` or `(out, softmax_lse)` by release), and flash_attn_interface "
            "does not install on an NPU host",
            remedy="to fuse it, call flash-attn 2's function, which npu-migrate wraps, or port the call to "
            "torch_npu.npu_fusion_attention (BSND, or TND with actual_seq_qlen / actual_seq_kvlen = cu_seqlens[1:] "
            "as host ints; scale = softmax_scale or D**-0.5; causal = sparse_mode 3 with the 2048x2048 triu mask)",
        )
    function = QUALIFIED[name]
    if api is not None and "npu_fusion_attention" not in api.fused_ops:
        return Outcome(
            FLASH_ATTN,
            f"`{function}` not rewritten: torch_npu {api.version} has no npu_fusion_attention",
            remedy="nothing in the code can: target a torch_npu that has it (--torch-npu-version)",
        )
    for keyword in call.keywords if call is not None else ():
        default, what, remedy = DECLINED.get(keyword.arg, (None, None, None))
        if what is not None and _passes(keyword, default):
            return Outcome(FLASH_ATTN, f"`{function}` not rewritten: it passes `{keyword.arg}`, {what}", remedy=remedy)
    if call is not None and len(call.args) > POSITIONAL.get(function, len(call.args)):
        return Outcome(
            FLASH_ATTN,
            f"`{function}` not rewritten: it passes arguments after `causal` by position, whose order differs "
            "between flash-attn versions",
            remedy="to fuse it, pass them by keyword",
        )
    varlen = ("flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_unpadded_func")
    layout = "TND" if function in varlen else "BSND"
    causal = "sparse_mode 2, top-left as flash-attn 1.x" if function == "flash_attn_unpadded_func" else "sparse_mode 3"
    message = (
        f"`{function}` gets torch_npu's npu_fusion_attention on NPU tensors (`_npu_{function}`, {layout}, "
        f"causal as {causal}); elsewhere the function runs as before"
    )
    guard = _blocking_guard(call, guards)
    if guard is not None:
        message += (
            f"; on an NPU host its guard `{ast.unparse(guard)}` is False (flash-attn is absent there), so the code's "
            "own fallback runs: let the guard pass for NPU tensors to take the kernel"
        )
    return Outcome(
        FLASH_ATTN,
        message,
        template=_template(function),
        helpers=(CORE, *(_template(f) for f in FUNCTIONS[function])),
        context={"wrapper": f"_npu_{function}"},
    )


def wrap(call: cst.Call, wrapper: str, optional: Collection[str] = ()) -> cst.Call:
    """`f(args)` -> `_npu_f(f, args)`: the wrapper gets the function the call reached, whatever binds it.
    Reached through a module the file imports conditionally (`optional`: None where flash-attn is absent),
    `flash_attn.f(args)` -> `_npu_f(flash_attn and flash_attn.f, args)`: the function wherever the module
    imported, None on an NPU host, where reading `flash_attn.f` would fail before the wrapper runs."""
    comma = cst.MaybeSentinel.DEFAULT
    if isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace):  # arguments on lines of their own
        comma = cst.Comma(whitespace_after=call.whitespace_before_args)
    function = call.func
    root = function
    while isinstance(root, cst.Attribute):
        root = root.value
    if root is not function and isinstance(root, cst.Name) and root.value in optional:
        function = cst.BooleanOperation(left=cst.Name(root.value), operator=cst.And(), right=function)
    return call.with_changes(func=cst.Name(wrapper), args=[cst.Arg(function, comma=comma), *call.args])


IDIOM = Idiom(
    rule=FLASH_ATTN,
    markers=("flash_attn",),
    identifiers=(*FUNCTIONS, "flash_attn"),
    kernels=("npu_fusion_attention",),
    match=lambda fn: None,  # calls only
    helpers={
        CORE: "_npu_fusion_flash",
        **{_template(f): f"_npu_{f}" for f in FUNCTIONS},
    },
    calls=(*QUALIFIED, *sorted(FA3)),
    match_call=match_call,
    wrap_call=wrap,
    optional_package="flash_attn",
)
