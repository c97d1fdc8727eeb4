"""NPU703: hand-written rotary position embedding gets a `torch_npu.npu_rotary_mul` branch.

`npu_rotary_mul(x, r1, r2)` returns `r1 * x + r2 * rotate(x)`, with `rotate` (rotary_mode 'half') the
GPT-NeoX / HF `rotate_half`, `cat((-x2, x1), -1)` of the two halves of the last dim, or ('interleave')
GPT-J's `rotate_every_two`, `stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)`. Each subexpression of
the function's folded expression (helpers inlined) is run abstractly (`evaluator`) and compared with
what the kernel computes (`rotation`): the rotation is recognised by what it computes, whatever the
spelling, and the kernel tables are read off as expressions over the tables the code has.

What the branch must preserve and the kernel cannot see is checked at run time by `_npu_rotary_fits`:
the original broadcasts `x * cos`, the kernel returns x's shape and dtype, so cos/sin may only
broadcast *into* x (never grow it), in one of the shapes the kernel's table allows, with x's dtype (an
fp32 table with bf16 activations would promote the original's result), and to be tensors at all (a
Python number is a table for the original). The cos/sin expressions and the rotated tensors, where
computed by a call, are bound once at the top of the branch and reused; the original runs them again
when `_npu_rotary_fits` says no, so only tensor operations may be bound there: a rotation of what a
module returns (`x = self.bn(x)`), or of a call the evaluator does not model (`x = torch.relu(x)`),
gets its branch after that statement, reading the value it computed.

This module is the rule's entry: `match` chooses where a branch can go (the whole folded body, the ways
through its `if`s on parameters, `ways.split_ways`, or a straight-line tail) and which finding speaks
for a function that gets none. The parts it calls live apart, each importing only the ones below it:
`rotary_rule` (the rule and its templates), `rotary_sites` (recognition), `rotary_declines` (the
findings), `rotary_branch` (the branch writer), `rotary_outcome` (one folded expression's outcome) and
`rotary_tail` (the straight-tail search).
"""

from __future__ import annotations

import ast
import re

from npu_migrate.transforms.fused.evaluator import KNOWN_FUNCTIONS, KNOWN_METHODS
from npu_migrate.transforms.fused.idiom import Idiom
from npu_migrate.transforms.fused.imported import after_imports, following
from npu_migrate.transforms.fused.rotary_declines import loop_outcome, rotate_helper_outcome, with_outcome
from npu_migrate.transforms.fused.rotary_outcome import folded_outcome
from npu_migrate.transforms.fused.rotary_rule import HELPER, ROTARY, TEMPLATE
from npu_migrate.transforms.fused.rotary_screen import may_rotate
from npu_migrate.transforms.fused.rotary_sites import rotates
from npu_migrate.transforms.fused.rotary_tail import straight_tail_outcome
from npu_migrate.transforms.fused.symbolic import (
    STRAIGHT_LINE,
    Function,
    NotStraightLine,
    Outcome,
    body_statements,
    fold,
    inline_functions,
    module_function,
    parameter_paths,
    source,
)
from npu_migrate.transforms.fused.ways import conditions, first_decline, split_ways, where


def _calls(fn: Function, names: tuple[str, ...]) -> bool:
    return fn.may_call(names) and any(fn.qualname(n.func) in names for n in fn.calls)


def _may_rotate(call: ast.Call, fn: Function) -> bool:
    """Whether `call` can be a rotation once module functions are inlined into it: a module function, or
    an operation the evaluator reads. Inlining is the dear part; this is not."""
    func = call.func
    return (
        isinstance(func, ast.Name)
        and func.id in fn.functions
        or module_function(fn, func) is not None
        or isinstance(func, ast.Attribute)
        and func.attr in KNOWN_METHODS
        or fn.qualname(func) in KNOWN_FUNCTIONS
    )


def _complex_only_in_a_branch(fn: Function) -> ast.If | None:
    """The top-level `if` whose one side holds the complex rotation, when the other side does not:
    diffusers' `if use_real: <real rotation> else: <view_as_complex>`. Only a side that views a tensor as
    complex numbers rotates one: `torch.polar` alone builds a table (audiocraft's cached `get_decay`)."""
    complex_names = ("torch.view_as_complex", "torch.view_as_real")
    for stmt in body_statements(fn.tree):
        calls = [n for n in ast.walk(stmt) if isinstance(n, ast.Call) and fn.qualname(n.func) in complex_names]
        if not calls:
            continue
        if not isinstance(stmt, ast.If):
            return None
        sides = [any(n in calls for part in side for n in ast.walk(part)) for side in (stmt.body, stmt.orelse)]
        return stmt if sides.count(True) == 1 else None
    return None


def match(fn: Function) -> Outcome | None:
    # Helpers imported from a sibling module (`from .rope import rotate_half`) are read as local ones,
    # before the screen, which looks into the helpers a function may inline.
    fn = following(fn)
    if not may_rotate(fn):  # most functions: nothing the evaluator could report (`rotary_screen`, #26)
        return None
    branch = _complex_only_in_a_branch(fn) if _calls(fn, ("torch.view_as_complex", "torch.polar")) else None
    if branch is not None:
        paths = _paths_outcome(fn)
        if paths is not None and paths.template is not None:
            return paths
        return Outcome(
            ROTARY,
            f"rotary embedding under `if {source(branch.test)}:` (complex numbers on one side, real tables on the"
            " other) left alone: the function is not straight-line code, and a branch must hold for both sides",
            remedy="to fuse it, give each side a function of its own",
        )
    try:
        result = inline_functions(fn, fold(fn, unpack=True, autocast_off=True))
    except NotStraightLine as why:
        # The straight-line tail first: what it computes decides, whatever calls it makes.
        tail = straight_tail_outcome(fn) or with_outcome(fn)
        if tail is not None and tail.template is not None and not _returns_before(fn, tail.before):
            return tail  # every way through the body reaches the tail: one branch covers them all
        covered = tail.before if tail is not None and tail.template is not None else None
        paths = _paths_outcome(fn, covered)
        if paths is not None and (paths.template is not None or tail is None):
            return paths
        if tail is not None:
            return tail
        try:
            calls_rotation = any(
                rotates(inline_functions(fn, n), fn) is not None for n in fn.calls if _may_rotate(n, fn)
            )
        except NotStraightLine:
            calls_rotation = False
        if not calls_rotation:
            return rotate_helper_outcome(fn) or loop_outcome(fn)
        return Outcome(ROTARY, f"rotary embedding not fused: {why}", remedy=STRAIGHT_LINE)
    outcome = folded_outcome(fn, result)
    if outcome is not None and outcome.template is not None and outcome.before is None:
        # The body began with imports (`from .rope import rotate_half`), read as the function's own names:
        # the branch goes after them, which run first as in the original.
        outcome.before = after_imports(fn)
    if outcome is not None and outcome.template is not None and fn.autocast_off is not None:
        # Z-image's `with torch.amp.autocast("cuda", enabled=False):` around the rotation: the branch goes
        # first inside the block, so the kernel runs with autocast disabled as the original's ops do (in
        # front of the `with`, an enclosing autocast could run it in another dtype).
        outcome.before = fn.autocast_off.body[0]
    if outcome is not None and outcome.template is None and len(body_statements(fn.tree)) > 1:
        # `x = self.bn(x)` or `x = torch.relu(x)` then the rotation: folded, the rotated tensor is that call
        # (run twice by a branch in front, or not read by the evaluator); a branch after the statement
        # reads the value it computed, as a name. Taken only where that one fuses.
        later = straight_tail_outcome(fn)
        if later is not None and later.template is not None:
            return later
    return outcome


def _paths_outcome(fn: Function, covered: ast.stmt | None = None) -> Outcome | None:
    """A branch per way through the function's `if`s on its parameters (`parameter_paths`: diffusers'
    `if use_real:` ... `else:`, `if use_real_unbind_dim == -1:` ...), each guarded by its path's tests and
    fused by what that path computes, in front of the untouched body; None when no path holds a rotary
    embedding. The tests read parameters the body never rebinds and call nothing, so the branch sees what
    the original's `if`s see, and they exclude each other: where a path's kernel does not apply, the next
    ones' tests are false and the original runs. None too when every fused way runs `covered`, the statement
    a straight tail's branch goes in front of: that one branch covers them (`if n < 2: return x`, then the
    rotation)."""
    paths = parameter_paths(fn)
    if paths is None:
        return None
    fused, declined = split_ways(paths, lambda way: folded_outcome(way, inline_functions(way, fold(way, unpack=True))))
    if fused and covered is not None and all(any(s is covered for s in p.function.tree.body) for p, _ in fused):
        return None
    if not fused:
        return first_decline(declined)
    branches = []
    for path, outcome in fused:
        context = outcome.context
        branches.append(
            {
                "guards": [*conditions(path), *context["guards"]],
                "bindings": context["bindings"],
                "checks": context["checks"],
                "result": context["result"],
            }
        )
    modes = sorted({m for _, o in fused for m in re.findall(r"rotary_mode=.(\w+).", o.context["result"])})
    message = (
        "rotary embedding gets a fused `torch_npu.npu_rotary_mul` branch per way through its `if`s on parameters "
        f"that rotates ({len(fused)} of {len(paths)} ways, rotary_mode {' and '.join(repr(m) for m in modes)})"
    )
    if declined:
        path, outcome = declined[0]
        message += f"; not where {where(path)}: {outcome.message}"
    context = {"x": fused[0][1].context["x"], "paths": branches}
    return Outcome(ROTARY, message, TEMPLATE, context, (HELPER,))


def _returns_before(fn: Function, stmt: ast.stmt | None) -> bool:
    """Whether a statement of the body before `stmt` may return (`if use_real: ... return out`): a branch
    in front of `stmt` then misses the ways through the body that return there."""
    body = body_statements(fn.tree)
    before = body[: next((at for at, s in enumerate(body) if s is stmt), 0)]
    return any(isinstance(n, ast.Return) for s in before for n in ast.walk(s))


IDIOM = Idiom(
    rule=ROTARY,
    markers=("cos", "sin", "rotate", "rotary", "rope", "view_as_complex", "polar"),
    identifiers=(("cos", "sin"), "view_as_complex", "polar"),
    kernels=("npu_rotary_mul",),
    match=match,
    template=TEMPLATE,
    helpers={HELPER: "_npu_rotary_fits"},
)
