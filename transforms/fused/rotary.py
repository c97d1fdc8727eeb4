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
"""

from __future__ import annotations

import ast
import copy
import re

from npu_migrate.engine.rule import EVERY_TARGET, Example, FixSafety, Rule
from npu_migrate.program.api import load_table
from npu_migrate.transforms.fused.evaluator import KNOWN_FUNCTIONS, KNOWN_METHODS, Structure, chain_base
from npu_migrate.transforms.fused.idiom import Idiom
from npu_migrate.transforms.fused.imported import (
    NO_FILE,
    after_imports,
    following,
    rebinding,
    unbound_name,
    why_not_followed,
    why_unfollowed_call,
)
from npu_migrate.transforms.fused.rotary_screen import Runs, may_be_rotation, may_hold_site, may_rotate
from npu_migrate.transforms.fused.rotary_window import bind_windows, in_order, unify_copies
from npu_migrate.transforms.fused.rotation import Declined, meaning, pure_rotation
from npu_migrate.transforms.fused.symbolic import (
    STRAIGHT_LINE,
    Function,
    NotStraightLine,
    Outcome,
    Path,
    body_statements,
    contains_call,
    cuda_only_tensor,
    evaluates_twice,
    fold,
    inline_functions,
    is_pure,
    module_function,
    parameter_paths,
    replace_nodes,
    same,
    source,
    straight_tail,
    substitute_children,
    walk_shared,
)

ROTARY = Rule(
    id="NPU703",
    name="fused-rotary",
    family="fused",
    summary="hand-written rotary embedding (`x * cos + rotate_half(x) * sin`) gets a guarded `torch_npu.npu_rotary_mul` branch",
    what="""
    Recognises a rotary embedding by what it computes, not by how it is written: the function's folded
    expression (helpers inlined: module-level, nested in the body, sibling methods, or imported from a
    sibling module, `from .rope import rotate_half`, read with `ast` and never imported) is run on a small
    symbolic tensor x (`transforms/fused/evaluator.py`), every subexpression that does not read x taken
    as an opaque table, and a subexpression is fused when each element of its result is
    `x[j] * C[j] + x[partner(j)] * sign * S[j]`, `npu_rotary_mul`'s `x * C + rotate(x) * S` in mode
    'half' (`rotate_half`, the halves `cat((-x2, x1))`) or 'interleave' (GPT-J's pairs), sign included,
    at two head dims (`transforms/fused/rotation.py`). Spellings it covers, among others: HF's
    `x * cos + rotate_half(x) * sin` (either operand order, any helper name), `x.chunk(2)` halves, einops
    halves and pairs (`rearrange(x, "... (j d) -> ... j d", j=2).unbind(-2)`, `"... (d r) -> ... d r"`),
    the halves written out (`cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin))`, half-width tables: the
    kernel on `cos.tile((2,))`), the rotation by -theta (`cat((x2, -x1))`, the rotated half subtracted,
    the signs of the halves swapped: the kernel with the sin table negated), interleaved pairs
    (`stack((-x1, x0), -1).flatten(3)`, `x0 * c - x1 * s` per pair: tables repeated per pair,
    `t.repeat_interleave(2, dim=-1)`), complex numbers (`view_as_real(view_as_complex(x.float()...) *
    freqs_cis)`: `freqs_cis.real` / `.imag` repeated per pair, the kernel on `x.float()`), pair tables
    (`f[..., 0]`, `f[..., 1]`), a 2x2 rotation matrix per pair (`rot[..., 0] * xp[..., 0] + rot[..., 1] *
    xp[..., 1]`: the kernel tables stacked per parity, the matrix's trailing shape checked first), tables
    times a scale (`t * freqs.cos() * scale`, checked to be tensors), tables given x's sizes
    (`cache.view(-1, x.size(1), 1, d)`), a shape unpacked with a star (k-diffusion's interleaved
    `*shape, d, r = x.shape; x.view(*shape, d * r)`, where the starred name is only read unpacked),
    partial rotary (the rotated window, the rest passed through;
    ChatGLM's width read from the table, `x[..., :rope_cache.shape[-2] * 2]`, checked first to lie within
    x), a rotation of another dim than the last (Sana-WM's `x.permute(0, 1, 3, 2)` rotated, moved back
    after: the kernel on the moved view), a CUDA-only fast path in front (kept for CUDA, the branch goes first), a body that is one
    `with torch.autocast(..., enabled=False):` (Z-image: the branch goes first inside the block, where
    the kernel runs with autocast disabled as the original's ops do). The kernel tables are built
    once per call, by tensor operations, in the branch. Interleaved rotary maps to
    rotary_mode='interleave' for torch_npu versions that have it. A branch in front of the untouched
    body runs the kernel when the tensors are on an NPU and `_npu_rotary_fits` holds: 4-D x (the rotation is proven on
    one; code naming dims computes something else at a lower rank), one dtype for x, cos and sin, cos/sin broadcasting into x in a layout the kernel accepts (BNSD: 11SD/B1SD/BNSD,
    BSND: 1S1D/BS1D/BSND, SBND: S11D/SB1D/SBND), an even head dim below 896; tables of lower rank (QwenImage's `(S, 1, D/2)`
    complex table) broadcast as with leading 1s, and the kernel gets them so. What the original computes
    once (the unsqueezed tables, an upcast `q.float()`, a cache view both tables slice, a rotated width and
    its window `q[..., :cos.shape[-1]]`) is bound once, in the branch. Tensors rotated with tables of their
    own (a helper called for q and for k that cuts the cache to each one's length, xpos scaling k's tables
    by the inverse of q's scale) are each checked and rotated with their own. When the tables are
    prepared under `if`s or asserts and only the rest of the body is straight-line code, the branch goes
    in front of that rest, reading the values the names hold there (assignments before the `if`s that
    still hold, as litgpt's `rotated`, are read as computed). When
    `if`s on parameters choose the rotation (diffusers' `apply_rotary_emb`: `if use_real:`, `if
    use_real_unbind_dim == -1:`, complex numbers in the `else`), each way through them is read as
    straight-line code and fused on its own, in one branch per way under the tests that select it (tests
    of parameters the body never rebinds, calling nothing; a way that raises gets none).

    Declined, with a finding saying what differs: an element read from a position neither mode pairs it
    with, a term scaled by a constant, a kernel table that would be a sum of tables, a complex table the
    code computes by arithmetic on tables (audiocraft's xPos `rotation * decay * scale + (1 - scale)`:
    scaled and shifted, not a rotation alone, and not checkable as complex before the branch reads it),
    x cast to a dtype read from elsewhere (`x.to(self.dtype)`: read as kept only to say so), elements not
    rotated, a computation that differs at another head dim (a fixed-width slice), interleaved rotary
    where the torch_npu version has no rotary_mode, a rotation under other control flow, rotations with
    different tables in one function where a table's trailing shape must be checked (a rotation matrix per
    pair), 3-D activations [B, S, D] rotated over the whole last dim as one head
    (LTX: the kernel takes 4-D x and a head dim below 896), a view of x by a size read from an attribute
    (torchtune's vision `self.max_num_tiles`: read where it is 1 only), a branch that would call anything but a tensor operation
    (`self.bn(x)`, dropout) before `_npu_rotary_fits` decides, where no later placement avoids it (the
    original calls it again when the kernel does not apply), or that would repeat what the function calls
    on the rotated tensors (`self.out(sdpa(q, k, v))` after `q, k = apply_rotary(...)`: the helper gets
    its own branch). An operation the evaluator does not know is
    never guessed: the function is left alone, and one that multiplies what a `rotate*` helper returns
    gets a finding saying why (the helper imported from a module the tool cannot read, as from stdin, or
    not recognised, or the tensor it rotates computed by a call the evaluator does not model). An imported
    helper is followed next to the file (relative imports through the package, absolute ones from a
    script's folder or the package root), by name (`from .rope import rotate_half`), as a module's
    function (`from . import rope`, `rope.rotate_half(x)`), from imports at the top of the function body
    (the branch goes after them), and one import further (a helper of the sibling calling what its module
    imports); its names are read as its module binds them, and a branch that would need a name this file
    does not bind alike is declined, as is a helper a star import, `global`, a `try` import's fallback or
    a later assignment may rebind. A complex table is checked to be complex before the branch reads its
    imaginary part. A rotation inside a loop, or one that names the dims it splits from the front (the
    last dim of a 3-D x only, where the same code counted from the end is one), is declined with why.
    """,
    why="""
    The hand-written rotation is several operators per tensor (halves, a negation, a concatenation, two
    products and a sum), each a kernel launch and a trip through device memory;
    `torch_npu.npu_rotary_mul` is one kernel.
    """,
    example=Example(
        before="""
            import torch


            def rotate_half(x):
                x1, x2 = x.chunk(2, dim=-1)
                return torch.cat((-x2, x1), dim=-1)


            def apply_rotary(q, cos, sin):
                return q * cos + rotate_half(q) * sin
        """,
        after="""
            import torch


            # ... fused-op helpers npu-migrate adds here: import torch_npu (guarded), _is_npu, _npu_rotary_mul, _npu_rotary_fits


            def rotate_half(x):
                x1, x2 = x.chunk(2, dim=-1)
                return torch.cat((-x2, x1), dim=-1)


            def apply_rotary(q, cos, sin):
                if _is_npu(q) and _npu_rotary_fits(cos, sin, q, mode="half"):
                    return _npu_rotary_mul(q, cos, sin, rotary_mode="half")
                return q * cos + rotate_half(q) * sin
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

TEMPLATE = "fused/rotary.py.j2"
HELPER = "fused/rotary_fits.py.j2"
_NAMES = ("_npu_cos", "_npu_sin")


#: Abstract runs one function may take: a big function that is no rotary embedding stays cheap.
_BUDGET = 400


class Site:
    """One subexpression of the folded expression that computes `npu_rotary_mul(x, cos, sin, mode)`."""

    def __init__(self, node: ast.expr, x: ast.expr, cos: ast.expr, sin: ast.expr, mode: str) -> None:
        self.node, self.x, self.cos, self.sin, self.mode = node, x, cos, sin, mode
        #: The tables as the code has them, when the kernel's are built from them (`torch.cat((cos, cos))`):
        #: building them must not fail where the original runs, so they are checked to be tensors first.
        self.source_tables: tuple[ast.expr, ...] = ()
        #: The tables that are products of the code's factors (`freqs.cos() * scale`): a product of numbers
        #: is no table, so they are bound in the branch and checked to be tensors before the kernel reads them.
        self.products: tuple[ast.expr, ...] = ()
        #: The tables whose trailing sizes the evaluator assumed, with those sizes (`rotation.Meaning`).
        self.shapes: tuple[tuple[ast.expr, tuple[str, ...]], ...] = ()
        #: (base, width) of x = `base[..., :width]` when the rotation read `width` as x's last size
        #: (`rotation.Meaning.window`): checked first, `0 <= width <= base.shape[-1]`.
        self.window: tuple[ast.expr, ast.expr] | None = None


def _candidates(
    node: ast.expr, fn: Function, structure: Structure, known: dict[int, int | None] | None = None
) -> list[ast.expr]:
    """The subexpressions of `node` that may be the rotated tensor: a name (a parameter, once the body is
    folded), or slices, casts and views of one, read at least twice (x is read plainly and again by its
    rotation), outermost first. Names of modules and imports (`torch`) are no tensor."""
    counts: dict[int, list[ast.expr]] = {}
    known = {} if known is None else known
    moved: list[ast.expr] = []
    # `walk_shared`'s order (depth first, a shared subtree once per occurrence), without its nested
    # generators; what a node is (its structure, when it may be x) is kept for the next, nested node
    # `sites` asks about (#26: this walk was a third of `sites`).
    todo = [node]
    while todo:
        sub = todo.pop()
        children = []
        for name in sub._fields:
            value = getattr(sub, name, None)
            if isinstance(value, ast.AST):
                children.append(value)
            elif type(value) is list:
                children.extend(item for item in value if isinstance(item, ast.AST))
        todo.extend(reversed(children))
        if sub is node:
            continue
        key = known.get(id(sub), ...)
        if key is ...:
            base = chain_base(sub)
            key = known[id(sub)] = (
                structure.of(sub) if isinstance(base, ast.Name) and fn.qualname(base) is None else None
            )
        if key is not None:
            counts.setdefault(key, []).append(sub)
            if _moves_dims(sub):
                moved.append(sub)
    found = [found[0] for found in counts.values() if len(found) > 1]
    # A rotation of another dim than the last (Sana-WM's `x.permute(0, 1, 3, 2)` then pairs of the last):
    # x moved into place is read once, the rotated tensor the kernel gets, its result moved back outside.
    keys = {known[id(f)] for f in found}
    found += [m for m in moved if known[id(m)] not in keys]
    return found[:8]


def _moves_dims(sub: ast.expr) -> bool:
    """`x.permute(...)` / `x.transpose(...)` of a name: a view of x with another dim last."""
    return (
        isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and sub.func.attr in ("permute", "transpose")
        and isinstance(sub.func.value, ast.Name)
    )


#: Calls that join two terms as a rotary embedding's result does (besides `+` / `-`).
_JOINS = ("cat", "concat", "concatenate", "stack", "view_as_real", "rearrange", "flatten", "reshape", "view")


def _flags(node: ast.AST, memo: dict[int, int]) -> int:
    """Bit 1: `node` holds a product; bit 2: a sum, a concatenation or a stack (what joins the kept and
    the rotated terms). A rotary embedding has both; a subexpression without them is not run."""
    found = memo.get(id(node))
    if found is None:
        found = 0
        if isinstance(node, ast.BinOp):
            found |= 1 if isinstance(node.op, ast.Mult) else 2 if isinstance(node.op, (ast.Add, ast.Sub)) else 0
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            found |= 2 if name in _JOINS else 0
        for child in ast.iter_child_nodes(node):
            found |= _flags(child, memo)
        memo[id(node)] = found
    return found


def sites(expr: ast.AST, fn: Function, declined: list[Declined] | None = None) -> list[Site]:
    """The rotary embeddings in `expr`, outermost first, by what each subexpression computes; the reason
    of each close miss goes to `declined`."""
    found: list[Site] = []
    built: dict[int, ast.expr] = {}  # one node per kernel table: q and k share what the branch binds
    structure = Structure()
    seen: set[int] = set()
    flags: dict[int, int] = {}
    budget = [_BUDGET]
    declined = [] if declined is None else declined
    runs = Runs(fn.qualname, structure)
    known: dict[int, int | None] = {}  # `_candidates`' memo, for the nested nodes of this expression

    def share(table: ast.expr) -> ast.expr:
        return built.setdefault(structure.of(table), table)

    def visit(node: ast.AST) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, (ast.BinOp, ast.Call)) and _flags(node, flags) == 3:
            for x in _candidates(node, fn, structure, known):
                if budget[0] <= 0:
                    return
                budget[0] -= 1
                if runs.cannot_run(node, x):
                    continue  # the run fails, `meaning` is None: not run (`rotary_screen.Runs`, #26)
                try:
                    meant = meaning(node, x, fn.qualname, structure)
                except Declined as why:
                    declined.append(why)
                    continue
                if meant is None:
                    continue
                rotated = ast.Call(ast.Attribute(x, "float", ast.Load()), [], []) if meant.upcast else x
                site = Site(node, rotated, share(meant.cos), share(meant.sin), meant.mode)
                site.source_tables = tuple(meant.sources)
                site.products = tuple(share(p) for p in meant.products)
                site.shapes = tuple(meant.shapes)
                site.window = meant.window
                found.append(site)
                return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(expr)
    return found


def _rotates(expr: ast.expr, fn: Function) -> tuple[str, ast.expr] | None:
    """(mode, x) when `expr` is a rotation of x itself: rotate_half or its interleaved form."""
    if not may_be_rotation(expr, fn):
        return None
    structure = Structure()
    runs = Runs(fn.qualname, structure)
    for x in _candidates(expr, fn, structure):
        if runs.cannot_run(expr, x):
            continue  # the run fails, `pure_rotation` is None (`rotary_screen.Runs`, #26)
        mode = pure_rotation(expr, x, fn.qualname, structure)
        if mode is not None:
            return mode, x
    return None


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


def _rotary_modes(fn: Function) -> tuple[bool, bool]:
    """(npu_rotary_mul exists, it takes rotary_mode) in the chosen torch_npu version."""
    if fn.api is None:
        return True, True
    entry = load_table("torch_npu_api.toml")["versions"].get(fn.api.version, {})
    return "npu_rotary_mul" in fn.api.fused_ops, bool(entry.get("rotary_mul_has_rotary_mode", False))


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
        tail = _straight_tail_outcome(fn) or _with_outcome(fn)
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
                _rotates(inline_functions(fn, n), fn) is not None for n in fn.calls if _may_rotate(n, fn)
            )
        except NotStraightLine:
            calls_rotation = False
        if not calls_rotation:
            return _rotate_helper_outcome(fn) or _loop_outcome(fn)
        return Outcome(ROTARY, f"rotary embedding not fused: {why}", remedy=STRAIGHT_LINE)
    outcome = _outcome(fn, result)
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
        later = _straight_tail_outcome(fn)
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
    fused: list[tuple[Path, Outcome]] = []
    declined: list[tuple[Path, Outcome]] = []
    for path in paths:
        try:
            outcome = _outcome(path.function, inline_functions(path.function, fold(path.function, unpack=True)))
        except NotStraightLine:
            continue
        if outcome is None:
            continue
        if outcome.template is not None and outcome.before is None and path.function.autocast_off is None:
            if not fused or outcome.context["x"] == fused[0][1].context["x"]:
                fused.append((path, outcome))
                continue
        declined.append((path, outcome))
    if fused and covered is not None and all(any(s is covered for s in p.function.tree.body) for p, _ in fused):
        return None
    if not fused:
        if not declined:
            return None
        path, outcome = declined[0]
        outcome.message = f"{outcome.message} (where {_where(path)})"
        return outcome
    branches = []
    for path, outcome in fused:
        context = outcome.context
        # joined by `and` in the branch: an `or` keeps its parentheses
        conditions = [
            f"({source(c)})" if isinstance(c, ast.BoolOp) and isinstance(c.op, ast.Or) else source(c)
            for c in path.conditions
        ]
        branches.append(
            {
                "guards": [*conditions, *context["guards"]],
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
        message += f"; not where {_where(path)}: {outcome.message}"
    context = {"x": fused[0][1].context["x"], "paths": branches}
    return Outcome(ROTARY, message, TEMPLATE, context, (HELPER,))


def _returns_before(fn: Function, stmt: ast.stmt | None) -> bool:
    """Whether a statement of the body before `stmt` may return (`if use_real: ... return out`): a branch
    in front of `stmt` then misses the ways through the body that return there."""
    body = body_statements(fn.tree)
    before = body[: next((at for at, s in enumerate(body) if s is stmt), 0)]
    return any(isinstance(n, ast.Return) for s in before for n in ast.walk(s))


def _where(path: Path) -> str:
    return " and ".join(f"`{source(c)}`" for c in path.conditions) or "no test holds"


def _with_outcome(fn: Function) -> Outcome | None:
    """The finding for a body that is one `with` other than an autocast-disabled one (`fold`), around a
    rotary embedding: what the block sets up (autocast on, a device, a hook) may change what the kernel
    would compute, so it is not read through, and not left silent either."""
    body = body_statements(fn.tree)
    if len(body) != 1 or not isinstance(body[0], (ast.With, ast.AsyncWith)):
        return None
    tree = copy.copy(fn.tree)
    tree.body = body[0].body
    inner = fn.around(tree)
    try:
        if not sites(inline_functions(inner, fold(inner, unpack=True)), inner):
            return None
    except NotStraightLine:
        return None
    items = ", ".join(source(item.context_expr) for item in body[0].items)
    return Outcome(
        ROTARY,
        f"rotary embedding inside `with {items}:` not fused: only a block that disables autocast "
        "(`enabled=False`, nothing bound by `as`) is read through, and what this one sets up may change what "
        "the kernel computes",
        remedy="to fuse it, rotate in a function of its own, called inside the `with`",
    )


def _straight_tail_outcome(fn: Function) -> Outcome | None:
    """The branch in front of the longest straight-line tail of the body that holds the rotary embedding
    (x-transformers: the tables are prepared under `if`s, then rotated in straight-line code), for the
    values the names hold there; None when no tail holds one."""
    body = body_statements(fn.tree)
    # A tail holding a statement that is not straight-line (other than a CUDA-only fast path, which `fold`
    # reads) does not fold: the tails to try begin after the last such statement.
    blocks = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.Assert, ast.Raise)
    first = 1 + max(
        (
            at
            for at, stmt in enumerate(body)
            if isinstance(stmt, blocks) and not (isinstance(stmt, ast.If) and cuda_only_tensor(stmt.test, fn))
        ),
        default=0,
    )
    if not may_hold_site(straight_tail(fn, max(first, 1), True)):
        # The longest tail holds every later one (a later tail keeps no assignment the longest does not
        # hold): without a product and a sum or join, none holds a site (`rotary_screen`, #26).
        return None
    for start in range(max(first, 1), len(body)):
        # The names the skipped statements bind, as they are (the branch reads them), and only where that
        # finds no rotation, with the assignments that still hold read as computed (litgpt's `rotated`).
        declines: list[Declined] = []
        for keep in (False, True):
            candidate = straight_tail(fn, start, keep)
            if keep and len(candidate.tree.body) == len(body) - start:
                continue  # nothing to keep: the tail just tried, whose outcome stands (#26)
            tail = candidate
            try:
                result = inline_functions(tail, fold(tail, unpack=True))
            except NotStraightLine:
                tail = None
                continue
            if sites(result, tail, declines):
                break
        else:
            if tail is None:
                continue
            read = next((d for d in declines if not d.differs), None)
            if read is not None:
                # A rotation read, in a shape the kernel does not take or at a size not known (torchtune's vision
                # rotary after its `if ...: raise`): said, not left silent. (A difference from the kernel's
                # formula is no evidence of a rotary embedding here: `(1 - t) * noise + t * x` has one.)
                return Outcome(ROTARY, f"rotary embedding not fused: {read}", remedy=read.remedy)
            return None
        if any(isinstance(n, ast.Name) and n.id.startswith("_npu_") for n in fn.nodes):
            return Outcome(
                ROTARY,
                "rotary embedding not fused: the code already uses `_npu_` names the branch needs",
                remedy="to fuse it, rename the code's own `_npu_` names",
            )
        outcome = _outcome(tail, result)
        if _reruns(outcome) and start + 1 < len(body):
            continue  # the call is in this tail: a shorter one may begin after it
        if outcome is not None and outcome.template is not None:
            outcome.before = body[start]
        return outcome
    return None


def _outcome(fn: Function, result: ast.expr) -> Outcome | None:
    declined: list[Declined] = []
    found = sites(result, fn, declined)
    if not found:
        if declined:
            # dims named from the front (`unflatten(2, ...)`) read as 3-D x: the rewrite counted from the end
            # is proven, so that is the remedy (before the 3-D decline's, which is about per-head tables)
            front = _front_dims_outcome(result, fn)
            if front is not None:
                return front
            return Outcome(
                ROTARY,
                f"rotary embedding not fused: {declined[0]}"
                + (", so it is not what npu_rotary_mul computes" if declined[0].differs else ""),
                remedy=declined[0].remedy,
            )
        return (
            _unmatched_rotation(result, fn)
            or _rotate_helper_outcome(fn)
            or _unfollowed_outcome(result, fn)
            or _front_dims_outcome(result, fn)
        )
    modes = {s.mode for s in found}
    if len(modes) > 1:
        return Outcome(
            ROTARY,
            "rotary embedding not fused: it mixes half and interleaved rotations",
            remedy="to fuse it, rotate each mode in a function of its own (the kernel applies one mode per call)",
        )
    mode = modes.pop()
    exists, has_mode = _rotary_modes(fn)
    version = fn.api.version if fn.api is not None else "?"
    if not exists:
        return Outcome(
            ROTARY,
            f"rotary embedding not fused: torch_npu {version} has no npu_rotary_mul",
            remedy="to fuse it, target a newer torch_npu (--torch-npu-version)",
        )
    if mode == "interleave" and not has_mode:
        return Outcome(
            ROTARY,
            f"interleaved rotary embedding not fused: npu_rotary_mul in torch_npu {version} has no rotary_mode='interleave'",
            remedy="to fuse it, target a torch_npu that has it (2.1.0.post17 or newer: --torch-npu-version)",
        )
    return _rewrite(fn, result, found, mode)


def _unmatched_rotation(result: ast.expr, fn: Function) -> Outcome | None:
    """The finding for a function that multiplies a rotation (rotate_half or its interleaved form, by what
    it computes) by something but has no `x * cos + rotate(x) * sin`: never silent about a rotary
    embedding it leaves alone."""
    for node in walk_shared(result):
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
            continue
        for factor in (node.left, node.right):
            found = _rotates(factor, fn) if isinstance(factor, ast.Call) else None
            if found is not None:
                return Outcome(
                    ROTARY,
                    f"rotary embedding not fused: the rotation of `{source(found[1])}` is multiplied by a table, "
                    "but not summed as `x * cos + rotate(x) * sin` with that same x, which is what "
                    "npu_rotary_mul computes",
                    remedy="to fuse it, rotate the tensor that is multiplied by cos, if that is what it means",
                )
    return None


def _rotate_helper_outcome(fn: Function) -> Outcome | None:
    """The finding for a function that multiplies what a `rotate*` function returns (`rotate_half(q) * sin`)
    where no rotation was recognised: the helper is imported, defined conditionally or not straight-line
    (its body cannot be read), or it computes something else. Only where the function reads cos and sin
    tables: `rotate_image(img) * mask` is no rotary embedding."""
    words = {n.id for n in fn.nodes if isinstance(n, ast.Name)} | {
        n.attr for n in fn.nodes if isinstance(n, ast.Attribute)
    }
    words |= set(fn.params)
    if not (any("cos" in w for w in words) and any("sin" in w for w in words)):
        return None
    for node in fn.nodes:
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
            continue
        for factor in (node.left, node.right):
            if not isinstance(factor, ast.Call):
                continue
            name = factor.func.id if isinstance(factor.func, ast.Name) else getattr(factor.func, "attr", "")
            if "rotate" not in name.lower():
                continue
            computed = _unmodelled_argument(factor, fn) if isinstance(factor.func, ast.Name) else None
            imported = why_not_followed(fn, name) if isinstance(factor.func, ast.Name) else None
            if isinstance(factor.func, ast.Attribute) and isinstance(factor.func.value, ast.Name):
                # `rope.rotate_half(q)`: the function of a module the file imports, not read (why says so).
                dotted = f"{factor.func.value.id}.{name}"
                if dotted in fn.functions or why_not_followed(fn, dotted) is not None:
                    name, imported = dotted, why_not_followed(fn, dotted)
            readable = (isinstance(factor.func, ast.Name) or "." in name) and name in fn.functions
            if computed is not None:
                # The helper is a rotation (as it is in the function next door): what is declined is its argument.
                why = (
                    f"the tensor that `{name}` rotates, `{source(computed)}`, is computed by a call the evaluator does not "
                    "model, so it cannot be shown to be the tensor multiplied by cos"
                )
                remedy = "to fuse it, compute that tensor in a statement of its own (`x = ...`) before the rotation"
            elif readable and _branches(fn.functions[name]):
                # Megatron's `_rotate_half(x, rotary_interleaved)`: `if not rotary_interleaved: <half> else: <pairs>`.
                why = (
                    f"`{name}` has control flow (`{_branches(fn.functions[name])}`): which rotation it computes is "
                    "only decided at run time"
                )
                remedy = "to fuse it, write one straight-line helper per rotation and choose between them in the caller"
            elif readable:
                why = (
                    f"`{name}` is not recognised as rotate_half (`cat((-x2, x1), -1)` of the halves of the last "
                    "dim) or its interleaved form, the rotations npu_rotary_mul applies"
                )
                remedy = (
                    f"to fuse it, if `{name}` computes one of those, write it that way (`x1, x2 = x.chunk(2, dim=-1)`, "
                    "`torch.cat((-x2, x1), dim=-1)`) as straight-line code"
                )
            elif imported is not None:
                why = f"`{name}` is {imported}, so what it computes cannot be proven to be the rotation npu_rotary_mul applies"
                remedy = (
                    "to fuse it, migrate the file by its path (not from stdin)"
                    if imported == NO_FILE
                    else _rebound_remedy(name, imported)
                    if "may rebind" in imported
                    else f"to fuse it, import `{name.rpartition('.')[2]}` by name from its module"
                    if "__init__.py" in imported
                    else f"to fuse it, define `{name}` in this file or in a module next to it"
                )
            elif isinstance(factor.func, ast.Name) and rebinding(fn, name) is not None:
                # A def of this file that a star import or a `global` may rebind (`imported` says so of an import).
                why = f"`{name}` is defined in this file, but {rebinding(fn, name)}"
                remedy = _rebound_remedy(name, why)
            else:
                why = (
                    f"`{source(factor.func)}` is not one straight-line function of this module (it is imported, "
                    "defined twice or has control flow): what it computes cannot be proven to be the rotation "
                    "npu_rotary_mul applies"
                )
                remedy = f"to fuse it, define `{name}` once, at module level, as straight-line code"
            return Outcome(ROTARY, f"rotary embedding not fused: {why}", remedy=remedy)
    return None


def _unfollowed_outcome(result: ast.expr, fn: Function) -> Outcome | None:
    """The finding for a folded function (helpers inlined) that multiplies what an imported helper it could
    not read returns by a table (`rotate_half(q) * sin`, `rotate_half` imported by the sibling `layers.py`
    under a `try` with a fallback), where the function reads cos and sin: which rotation it is cannot be
    proven, and it is not left silent."""
    words = {n.id for n in walk_shared(result) if isinstance(n, ast.Name)}
    words |= {n.attr for n in walk_shared(result) if isinstance(n, ast.Attribute)}
    if not (any("cos" in w for w in words) and any("sin" in w for w in words)):
        return None
    for node in walk_shared(result):
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
            continue
        for factor in (node.left, node.right):
            why = why_unfollowed_call(fn, factor) if isinstance(factor, ast.Call) else None
            if why is not None:
                name = source(factor.func)
                return Outcome(
                    ROTARY,
                    f"rotary embedding not fused: {why}, so what it computes cannot be proven to be the rotation "
                    "npu_rotary_mul applies",
                    remedy=(
                        _rebound_remedy(name, why)
                        if "may rebind" in why
                        else "to fuse it, import the rotation from a module nearer the file migrated"
                        if "past the" in why
                        else f"to fuse it, import `{name}` once, by name, with no fallback, from a module next to "
                        "the one that calls it"
                    ),
                )
    return None


#: The dim-taking operations `_front_dims_outcome` reads: method or function -> (dim's position, keyword).
_DIM_OPS = {
    "unflatten": (0, "dim"),
    "unbind": (0, "dim"),
    "flatten": (0, "start_dim"),
    "chunk": (1, "dim"),
    "split": (1, "dim"),
}
_DIM_FUNCTIONS = {"torch.stack": (1, "dim"), "torch.cat": (1, "dim"), "torch.concat": (1, "dim")}
_SAME_NDIM = frozenset({"float", "half", "bfloat16", "double", "to", "type_as", "contiguous", "clone", "detach", "neg"})


def _front_dims_outcome(result: ast.expr, fn: Function, ndim: int = 3) -> Outcome | None:
    """The finding for a rotation that names the dims it splits and joins from the front (diffusers' LTX:
    `x.unflatten(2, (-1, 2))` ... `.flatten(2)` on x of [B, S, C], heads folded into C): on the 4-D x the
    kernel takes, those dims are not the last one, so nothing was recognised. Proven by the evaluator: the
    same code with each such dim counted from the end, as for an `ndim`-D x, is a rotary embedding."""
    params = set(fn.params)
    dims: dict[int, object] = {}  # id(node) -> its ndim, or ("seq", ndim) for a sequence of tensors
    changed: list[ast.Call] = []

    def of(node: ast.AST):
        if id(node) not in dims:
            dims[id(node)] = _ndim(node, of, params, ndim, fn.qualname)
        return dims[id(node)]

    def visit(node: ast.AST) -> ast.AST:
        new = substitute_children(node, visit)
        if not isinstance(node, ast.Call):
            return new
        spec, receiver = None, None
        if isinstance(node.func, ast.Attribute) and node.func.attr in _DIM_OPS and fn.qualname(node.func) is None:
            spec, receiver = _DIM_OPS[node.func.attr], of(node.func.value)
        elif fn.qualname(node.func) in _DIM_FUNCTIONS and node.args:
            spec, items = _DIM_FUNCTIONS[fn.qualname(node.func)], of(node.args[0])
            receiver = items[1] + (fn.qualname(node.func) == "torch.stack") if isinstance(items, tuple) else None
        if spec is None or not isinstance(receiver, int):
            return new
        at, keyword = spec
        given = (
            node.args[at] if len(node.args) > at else next((k.value for k in node.keywords if k.arg == keyword), None)
        )
        if not (isinstance(given, ast.Constant) and type(given.value) is int and given.value >= 0):
            return new
        new = copy.copy(new)
        counted = ast.Constant(given.value - receiver)
        if len(node.args) > at:
            new.args = [*new.args[:at], counted, *new.args[at + 1 :]]
        else:
            new.keywords = [ast.keyword(k.arg, counted) if k.arg == keyword else k for k in new.keywords]
        changed.append(node)
        return new

    rewritten = visit(result)
    if not changed or not sites(rewritten, fn):
        return None
    spelled = ", ".join(f"`{call}`" for call in list(dict.fromkeys(_front_call(n) for n in changed))[:3])
    return Outcome(
        ROTARY,
        f"rotary embedding not fused: it names the dims it splits and joins from the front ({spelled}), so "
        f"the dim it rotates is the last one only of a {ndim}-D tensor, and npu_rotary_mul takes a 4-D x",
        remedy="to fuse it, count those dims from the end (as `unflatten(-1, (-1, 2))`, `flatten(-2)`) and rotate "
        "a 4-D x (heads split out of the last dim): the branch applies where x is 4-D",
    )


def _front_call(call: ast.Call) -> str:
    """`.unflatten(2, (-1, 2))`, or `torch.stack(..., dim=2)` (a function's sequence argument left out)."""
    method = isinstance(call.func, ast.Attribute) and call.func.attr in _DIM_OPS
    parts = [source(a) for a in call.args[0 if method else 1 :]] + [f"{k.arg}={source(k.value)}" for k in call.keywords]
    return f".{call.func.attr}({', '.join(parts)})" if method else f"{source(call.func)}(..., {', '.join(parts)})"


def _ndim(node: ast.AST, of, params: set[str], ndim: int, qualname):
    """How many dims `node` has where each parameter the rotation reads has `ndim` (None: not known)."""
    if isinstance(node, ast.Name):
        return ndim if node.id in params else None
    if isinstance(node, ast.UnaryOp):
        return of(node.operand)
    if isinstance(node, ast.BinOp):
        sides = [of(node.left), of(node.right)]
        known = [s for s in sides if isinstance(s, int)]
        return max(known) if known else None
    if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
        first = of(node.elts[0])
        return ("seq", first) if isinstance(first, int) else None
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        value = of(node.value)
        return value[1] if isinstance(value, tuple) else None
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return None
    joined = qualname(node.func)
    if joined in _DIM_FUNCTIONS:
        items = of(node.args[0]) if node.args else None
        return items[1] + (joined == "torch.stack") if isinstance(items, tuple) else None
    method, receiver = node.func.attr, of(node.func.value)
    if not isinstance(receiver, int):
        return None
    if method in _SAME_NDIM:
        return receiver
    if method == "unflatten" and len(node.args) == 2 and isinstance(node.args[1], (ast.Tuple, ast.List)):
        return receiver + len(node.args[1].elts) - 1
    if method == "unbind":
        return ("seq", receiver - 1)
    if method in ("chunk", "split"):
        return ("seq", receiver)
    if method == "flatten" and len(node.args) <= 2 and all(isinstance(a, ast.Constant) for a in node.args):
        start, end = [*(a.value for a in node.args), 0, -1][:2] if node.args else (0, -1)
        if len(node.args) == 1:
            end = -1
        start, end = start % receiver, end % receiver
        return receiver - (end - start)
    return None


def _loop_outcome(fn: Function) -> Outcome | None:
    """The finding for a rotation written in the body of a loop at the top of the function (diffusers' Wan
    Animate 2 rotates each sample's prefix in a `for` over the batch's grid sizes): a complex product, or a
    `rotate*` helper multiplied by a table, with cos / sin / freqs tables in the loop. The evaluator reads
    straight-line code; the kernel rotates one whole tensor per call; never silent about it."""
    for stmt in body_statements(fn.tree):
        if not isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
            continue
        nodes = [n for part in stmt.body for n in ast.walk(part)]
        words = {n.id for n in nodes if isinstance(n, ast.Name)} | {
            n.attr for n in nodes if isinstance(n, ast.Attribute)
        }
        if not any("freq" in w or "cos" in w or "sin" in w or "rope" in w for w in words):
            continue
        complex_product = any(
            isinstance(n, ast.Call) and fn.qualname(n.func) in ("torch.view_as_complex", "torch.polar") for n in nodes
        ) and any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult) for n in nodes)
        rotate_product = any(
            isinstance(n, ast.BinOp)
            and isinstance(n.op, ast.Mult)
            and any(
                isinstance(f, ast.Call) and "rotate" in source(f.func).rpartition(".")[2].lower()
                for f in (n.left, n.right)
            )
            for n in nodes
        )
        if not (complex_product or rotate_product):
            continue
        wide = any(
            isinstance(n, (ast.Attribute, ast.Name))
            and fn.qualname(n) in ("torch.float64", "torch.double")
            or isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr == "double"
            for n in nodes
        )
        head = ast.unparse(stmt).splitlines()[0]
        return Outcome(
            ROTARY,
            f"rotary embedding inside `{head}` not fused: the loop rotates a part of a tensor per iteration, "
            "which is not read (straight-line code is), and npu_rotary_mul rotates one whole 4-D tensor per call"
            + (", in fp16, bf16 or fp32 (this rotation is computed in float64)" if wide else ""),
            remedy="to fuse it, rotate in a function of its own that the loop calls"
            + (", in a dtype the kernel takes if float64 is not needed" if wide else "")
            + " (NPU703 fuses it there when it is one kernel call)",
        )
    return None


def _rebound_remedy(name: str, why: str) -> str:
    if "." in name:  # `rope.rotate_half`: the module, or its function, may be rebound
        return f"to fuse it, import `{name.rpartition('.')[2]}` by name where nothing rebinds it"
    if "import *` " in why:
        return f"to fuse it, bind `{name}` after the `import *` (or import by name what it is needed for)"
    return f"to fuse it, give what the `global {name}` statement assigns a name of its own"


def _branches(helper: ast.FunctionDef) -> str | None:
    """The first line of the first statement of `helper`'s body that is no straight-line code, if any."""
    blocks = (ast.If, ast.For, ast.While, ast.With, ast.Try, ast.Match)
    found = next((stmt for stmt in body_statements(helper) if isinstance(stmt, blocks)), None)
    return None if found is None else ast.unparse(found).splitlines()[0]


def _unmodelled_argument(call: ast.Call, fn: Function) -> ast.expr | None:
    """The argument of `rotate_half(torch.relu(x))` when the helper is a rotation of a plain name (its body
    recognised) and the argument is a call the evaluator does not read (`torch.relu`, `F.rms_norm`)."""
    if len(call.args) != 1 or not isinstance(call.args[0], ast.Call) or call.func.id not in fn.functions:
        return None
    probe = ast.Call(call.func, [ast.Name("_npu_probe", ast.Load())], [])
    try:
        found = _rotates(inline_functions(fn, probe), fn)
    except NotStraightLine:
        return None
    return call.args[0] if found is not None and source(found[1]) == "_npu_probe" else None


def _rewrite(fn: Function, result: ast.expr, found: list[Site], mode: str) -> Outcome:
    # One cos and one sin for every site, as in most implementations: binding them once keeps each
    # evaluated exactly once, as in the original. A helper that builds the tables from the tensor it
    # rotates (ChatGLM's `cache[:x.size(0)]`), called for q and for k, or xpos (k's tables scaled by the
    # inverse of q's scale) gives each its own: a pair of tables per rotated tensor then, each checked with
    # its tensor and bound once (`_npu_cos1`, `_npu_sin1`).
    pairs: list[tuple[ast.expr, ast.expr]] = []
    of_site: list[int] = []
    for site in found:
        at = next(
            (at for at, (c, s) in enumerate(pairs) if _same_table(site.cos, c, fn) and _same_table(site.sin, s, fn)),
            None,
        )
        if at is None:
            if pairs and any(site.shapes for site in found):
                return Outcome(
                    ROTARY,
                    "rotary embedding not fused: its rotations use different cos/sin tables, and the shape of a "
                    "table must be checked (its trailing sizes are read as a rotation per pair)",
                    remedy="to fuse it, rotate each tensor with its own tables in a function of its own",
                )
            at = len(pairs)
            pairs.append((site.cos, site.sin))
        of_site.append(at)
    factors = [p for site in found for p in site.products]
    if any(isinstance(n, ast.Name) and n.id.startswith("_npu_") for n in fn.nodes):
        return Outcome(
            ROTARY,
            "rotary embedding not fused: the code already uses `_npu_` names the branch needs",
            remedy="to fuse it, rename the code's own `_npu_` names",
        )
    replacements: dict[int, ast.AST] = {}
    # What the guard and the kernel share and the original computes by a call (`cos.unsqueeze(1)`,
    # `q.float()`) is bound once, first thing in the branch, in the original's order.
    bindings: list[tuple[str, ast.expr]] = []
    for at, pair in enumerate(pairs):
        for table, name in zip(pair, _NAMES):
            # A negated table (`-sin`, the rotation by -theta) too: the checks and the kernel read one tensor.
            # So is a table that computes anything (torchtitan's `rope_cache[..., :query.shape[-1]]`, ESM's
            # `cos[:, :x.shape[-2], :]`): written once, not in every check and kernel call.
            negated = isinstance(table, ast.UnaryOp)
            if contains_call(table) or negated or not _plain(table) or any(table is p for p in factors):
                name = f"{name}{at}" if at else name
                replacements[id(table)] = ast.Name(name, ast.Load())
                bindings.append((name, table))
    tables = [tuple(replacements.get(id(t), t) for t in pair) for pair in pairs]
    xs = []  # the tensors the guard checks: each rotated tensor, or its binding
    fused: dict[int, ast.AST] = {}
    for site, at in zip(found, of_site):
        base = site.x
        while isinstance(base, ast.Subscript):
            base = base.value
        if base is not site.x and contains_call(base) and id(base) not in replacements:
            # Qwen's partial rotary slices one upcast `t.float()` into the rotated part and the tail: bind
            # the upcast, not the slice, so that the tail reads it too instead of computing it again.
            name = f"_npu_x{sum(n.startswith('_npu_x') for n, _ in bindings)}"
            bindings.append((name, replace_nodes(base, replacements)))
            replacements[id(base)] = ast.Name(name, ast.Load())
        x = replace_nodes(site.x, replacements)
        if contains_call(x):
            if id(site.x) not in replacements:
                name = f"_npu_x{sum(n.startswith('_npu_x') for n, _ in bindings)}"
                replacements[id(site.x)] = ast.Name(name, ast.Load())
                bindings.append((name, x))
            x = replacements[id(site.x)]
        xs.append(x)
        fused[id(site.node)] = _kernel_call(x, *tables[at], mode)
    rewritten = replace_nodes(result, {**replacements, **fused})
    originals = dict(bindings)
    # A width read from elsewhere and its window are bound once, and a size a view states is read from it
    # (`rotary_window`): the branch writes neither five times, nor reshapes x to read a size.
    before = {name for name, _ in bindings}
    bindings, (rewritten, *xs) = bind_windows(found, bindings, [rewritten, *xs], _size_expression, xs)
    first = [name for name, _ in bindings if name not in before]
    *values, rewritten = unify_copies([*(value for _, value in bindings), rewritten], lambda c: not _user_calls(c, fn))
    bindings = [(name, value) for (name, _), value in zip(bindings, values)]
    count = 0
    for _ in range(4):
        shared = _repeated_calls([*(value for _, value in bindings), rewritten])
        if not shared:
            break
        # What the original computes once and two kernel tables read (`cache.view(...)` of both halves)
        # is bound once too, before what reads it (an inner one found in a later round goes first).
        names = {id(node): ast.Name(f"_npu_t{count + at}", ast.Load()) for at, node in enumerate(shared)}
        bound = [(name, replace_nodes(value, names)) for name, value in bindings]
        bindings = [(f"_npu_t{count + at}", node) for at, node in enumerate(shared)] + bound
        rewritten = replace_nodes(rewritten, names)
        count += len(shared)
        # A binding of a name bound in this round (`_npu_t1 = _npu_t3`) is that name.
        aliases = {
            name: value
            for name, value in bindings
            if isinstance(value, ast.Name) and value.id.startswith("_npu_t") and name.startswith("_npu_t")
        }
        if aliases:
            uses = {
                id(n): aliases[n.id]
                for _, v in bindings
                for n in walk_shared(v)
                if isinstance(n, ast.Name) and n.id in aliases
            }
            uses.update(
                {id(n): aliases[n.id] for n in walk_shared(rewritten) if isinstance(n, ast.Name) and n.id in aliases}
            )
            bindings = [(name, replace_nodes(value, uses)) for name, value in bindings if name not in aliases]
            rewritten = replace_nodes(rewritten, uses)
    # A rotated tensor bound as what two bindings share (`_npu_x0 = _npu_t4` of `x.float()`) is bound
    # once, under the rotated tensor's name, where the shared one was.
    for name, value in list(bindings):
        if name.startswith("_npu_x") and isinstance(value, ast.Name) and value.id.startswith("_npu_t"):
            bindings, rewritten = _renamed(bindings, rewritten, value.id, name)
    # The width and window stay first, as the original reads them first: what this loop bound reads them.
    bindings = in_order(bindings, first)
    evaluated = [value for _, value in bindings]
    # The bindings run before `_npu_rotary_fits` decides, and the original runs again when it says no: a
    # call that is not a tensor operation (`self.bn(x)`, dropout, a hook) would run twice, changing
    # numbers (BatchNorm's running stats, a second random draw). `match` then tries the branch after the
    # statement that makes the call, reading the value it computed.
    user_call = next((c for _, value in bindings for c in _user_calls(value, fn)), None)
    if user_call is not None:
        return Outcome(
            ROTARY,
            f"rotary embedding not fused: the branch would call `{source(user_call.func)}`{_RERUN}, and the "
            "original would call it again where the kernel does not apply (running stats, random draws and hooks "
            "twice)",
            remedy="to fuse it, compute it in a statement of its own before the rotation",
        )
    # What the function does with the rotation besides tensor operations (`self.out(sdpa(q, k, v))` after
    # `q, k = apply_rotary(...)`) the branch would repeat: a second copy of model code that other rules
    # rewrite in the original only (NPU707's SDPA wrapper), and no longer one rotary embedding.
    after = next((c for c in _user_calls(rewritten, fn) if source(c.func) != "_npu_rotary_mul"), None)
    if after is not None:
        return Outcome(
            ROTARY,
            f"rotary embedding not fused here: the branch would repeat `{source(after.func)}(...)`, which the "
            "function calls on the rotated tensors",
            remedy="to fuse it, rotate in a function of its own that returns the rotated tensors, which NPU703 "
            "fuses where it is defined",
        )
    if evaluates_twice(ast.Tuple([*evaluated, rewritten], ast.Load())):
        return Outcome(
            ROTARY,
            "rotary embedding not fused: the branch would evaluate a call of the original twice",
            remedy="to fuse it, compute that call in a statement of its own before the rotation",
        )
    # The guard tests the rotated tensor's parameter (`t` of `t[..., start:end]`), else any it is computed from.
    rotated = found[0].x
    while isinstance(rotated, ast.Subscript):
        rotated = rotated.value
    if isinstance(rotated, ast.Name) and rotated.id in fn.params:
        x_param = rotated.id
    else:
        x_param = next(
            (p for p in fn.params if any(isinstance(n, ast.Name) and n.id == p for n in walk_shared(found[0].x))),
            None,
        )
    if x_param is None:
        return Outcome(
            ROTARY,
            "rotary embedding not fused: the rotated tensor is not computed from a parameter",
            remedy="to fuse it, pass the tensor it rotates as a parameter of the function",
        )
    if not set(fn.fast_path_tensors) <= {x_param}:
        return Outcome(
            ROTARY,
            "rotary embedding not fused: its CUDA fast path tests another tensor than it rotates",
            remedy="to fuse it, test the tensor it rotates in the fast path's condition",
        )
    # Tables passed in as arguments may be Python numbers or lists: the kernel needs tensors.
    sources = _unique([t for site in found for t in site.source_tables])
    tensors = [f"isinstance({source(t)}, torch.Tensor)" for t in sources if is_pure(t)]
    # One check per rotated tensor, in the order the original computes them.
    products = [name for name, _ in bindings if any(originals.get(name) is p for p in factors)]
    checks = [f"isinstance({name}, torch.Tensor)" for name in products]
    for x, at in zip(xs, of_site):
        check = source(
            ast.Call(
                ast.Name("_npu_rotary_fits", ast.Load()), [*tables[at], x], [ast.keyword("mode", ast.Constant(mode))]
            )
        )
        if check not in checks:
            checks.append(check)
    # A table read at a size the evaluator assumed (`rot[..., 0]` of a 2x2 rotation per pair) is checked
    # to have it: at another size the kernel tables would be built from the wrong entries, or fail.
    # Checked first, before the branch builds the kernel tables from it.
    rotated = found[0].x
    if isinstance(rotated, ast.Call) and not rotated.args and getattr(rotated.func, "attr", None) == "float":
        rotated = rotated.func.value  # an upcast has x's shape
    for at, (table, sizes) in enumerate(found[0].shapes):
        if not (_plain(table) and _plain(rotated)):
            return Outcome(
                ROTARY,
                f"rotary embedding not fused: the shape of `{source(table)}` cannot be checked",
                remedy="to fuse it, bind that table and the rotated tensor to names before the rotation",
            )
        d = f"{source(rotated)}.shape[-1]"
        expected = ", ".join(s.replace("d", d) for s in sizes)
        tensors.insert(at, f"{source(table)}.shape[-{len(sizes)}:] == ({expected})")
    # A table read as complex numbers (`freqs_cis.imag`, from `xc * freqs_cis`) was assumed complex because
    # it multiplies a complex tensor; a real one scales both parts instead (liger's Llama4 reference says
    # a cast may have dropped the imaginary part), and `.imag` of it raises. Checked first, on the table
    # the code passes in, through steps that keep the dtype.
    for part in _complex_parts(*(t for pair in pairs for t in pair)):
        base = _dtype_kept_base(part)
        if base is None:
            return Outcome(
                ROTARY,
                f"rotary embedding not fused: `{source(part)}` is read as complex numbers, and whether it is "
                "complex cannot be checked before the branch reads it (a real table is no rotation)",
                remedy="to fuse it, bind the complex table to a name before the rotation",
            )
        for check in (f"isinstance({source(base)}, torch.Tensor)", f"torch.is_complex({source(base)})"):
            if check not in tensors:
                tensors.append(check)
    # A rotated width read from elsewhere (ChatGLM's `rope_cache.shape[-2] * 2`) was taken to be the width of
    # the window `x[..., :width]`: so it is where it lies within x's last dim, checked before anything reads it.
    windows = 0  # q's check before k's, as the original slices them
    for site in found:
        if site.window is None:
            continue
        base, width = site.window
        if not (is_pure(base) and _size_expression(width)):
            return Outcome(
                ROTARY,
                f"rotary embedding not fused: the rotated width `{source(width)}` cannot be checked against the "
                "tensor it slices",
                remedy="to fuse it, bind the width and the tensor to names before the rotation",
            )
        check = f"0 <= {source(width)} <= {source(base)}.shape[-1]"
        if check not in tensors:
            tensors.insert(windows, check)
            windows += 1
    # What the branch states of an imported helper's body (a `torch.cat` of the tables, a constant) must
    # mean here what it meant there: `torch` imported in both, not a name only the sibling binds.
    foreign = unbound_name(
        fn,
        [*evaluated, rewritten, *(t for pair in tables for t in pair), *xs, *sources, *(t for t, _ in found[0].shapes)],
    )
    if foreign is not None:
        name, where = foreign
        return Outcome(
            ROTARY,
            f"rotary embedding not fused: the branch would read `{name}`, which `{where.name}` (the module the "
            "helper is imported from) binds and this file does not bind the same way",
            remedy=f"to fuse it, bind `{name}` in this file as `{where.name}` does",
        )
    what = "interleaved rotary embedding" if mode == "interleave" else "rotary embedding"
    context = {
        "x": x_param,
        "guards": tensors if bindings else [*tensors, *checks],
        "bindings": [(name, source(value)) for name, value in bindings],
        "checks": checks if bindings else [],
        "result": source(rewritten),
    }
    return Outcome(ROTARY, f"{what} gets a fused `torch_npu.npu_rotary_mul` branch", TEMPLATE, context, (HELPER,))


def _renamed(
    bindings: list[tuple[str, ast.expr]], rewritten: ast.expr, old: str, new: str
) -> tuple[list[tuple[str, ast.expr]], ast.expr]:
    """`bindings` and `rewritten` with the binding of `old` named `new`, and `new = old` dropped."""

    def rename(expr: ast.expr) -> ast.expr:
        uses = {id(n): ast.Name(new, ast.Load()) for n in walk_shared(expr) if isinstance(n, ast.Name) and n.id == old}
        return replace_nodes(expr, uses)

    kept = [(new if name == old else name, rename(value)) for name, value in bindings if name != new]
    return kept, rename(rewritten)


def _same_table(mine: ast.expr, first: ast.expr, fn: Function) -> bool:
    """Whether the kernel may read `first` for `mine`: the same node, or the same expression computed by
    tensor operations only (`cos.unsqueeze(1)` in a helper inlined for q and again for k), which give the
    same tensor each time; a call of anything else (a module, a random draw) may not."""
    return mine is first or (same(mine, first) and not _user_calls(mine, fn))


def _complex_parts(*tables: ast.expr) -> list[ast.expr]:
    """The expressions whose `.imag` the kernel tables read (`_npu_t0.imag` is of what `_npu_t0` binds)."""
    found: list[ast.expr] = []
    for table in tables:
        for node in walk_shared(table):
            if isinstance(node, ast.Attribute) and node.attr == "imag" and not any(node.value is f for f in found):
                found.append(node.value)
    return found


#: Tensor methods whose result is complex exactly where their receiver is (with these arguments).
_DTYPE_KEPT = frozenset(
    {"view", "reshape", "unsqueeze", "squeeze", "expand", "contiguous", "detach", "clone", "flatten"}
)


def _dtype_kept_base(node: ast.expr) -> ast.Name | None:
    """The name `node` is computed from by steps that keep its dtype (indexing, views, `.to(x.device)`),
    else None."""
    while not isinstance(node, ast.Name):
        if isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.keywords:
            method = node.func.attr
            to_device = (
                method == "to"
                and len(node.args) == 1
                and isinstance(node.args[0], ast.Attribute)
                and node.args[0].attr == "device"
            )
            if method not in _DTYPE_KEPT and not to_device:
                return None
            if method == "view" and len(node.args) == 1 and isinstance(node.args[0], (ast.Name, ast.Attribute)):
                return None  # `t.view(dtype)` reinterprets the bits in another dtype
            node = node.func.value
        else:
            return None
    return node


#: What the finding of a branch declined for calling user code twice says (`_reruns`): a later placement,
#: after the statement that makes the call, may do.
_RERUN = " before knowing whether the kernel applies"


def _reruns(outcome: Outcome | None) -> bool:
    return outcome is not None and outcome.template is None and _RERUN in outcome.message


#: Calls of tensor operations besides the ones the evaluator models (`KNOWN_*`), that compute a new value
#: and nothing else: the branch may run them again (the tables `freqs.cos()`, `t.repeat_interleave(2)`).
_PURE_METHODS = KNOWN_METHODS | {
    "cos",
    "sin",
    "exp",
    "detach",
    "expand",
    "expand_as",
    "narrow",
    "repeat",
    "repeat_interleave",
    "select",
    "tile",
}
_PURE_FUNCTIONS = KNOWN_FUNCTIONS | {"torch.cos", "torch.sin", "torch.repeat_interleave", "torch.tile", "torch.polar"}


def _user_calls(expr: ast.expr, fn: Function) -> list[ast.Call]:
    """The calls in `expr` that are not known tensor operations: modules (`self.bn(x)`), methods of the
    instance, functions the evaluator did not read. They may have side effects, so run once only."""
    found = []
    for node in walk_shared(expr):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if fn.qualname(func) in _PURE_FUNCTIONS:
            continue
        if isinstance(func, ast.Attribute):
            receiver = func.value.id if isinstance(func.value, ast.Name) else None
            # `torch.stack` as the branch spells a table it builds, whatever the file imports
            if receiver == "torch" and source(func) in _PURE_FUNCTIONS:
                continue
            # a method of a tensor, but not of the module itself (`self.view(...)` is the module's own)
            if func.attr in _PURE_METHODS and (receiver is None or receiver != fn.self_name):
                continue
        found.append(node)
    return found


def _repeated_calls(exprs: list[ast.expr]) -> list[ast.expr]:
    """The outermost calls, and arithmetic (xpos' `scale ** -1` of both of k's tables), that occur (by
    identity) more than once in `exprs`, first occurrence first."""
    kinds = (ast.Call, ast.BinOp)
    seen: dict[int, int] = {}
    for expr in exprs:
        for node in walk_shared(expr):
            if isinstance(node, kinds):
                seen[id(node)] = seen.get(id(node), 0) + 1
    found: list[ast.expr] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, kinds) and seen.get(id(node), 0) > 1:
            if not any(node is f for f in found):
                found.append(node)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    for expr in exprs:
        visit(expr)
    return found


def _plain(node: ast.expr) -> bool:
    """A name, attribute or constant index of one (`rot[..., 0]`): safe and cheap to read again."""
    if isinstance(node, ast.Subscript):
        index = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return _plain(node.value) and all(
            isinstance(i, ast.Constant)
            or isinstance(i, ast.Slice)
            and all(b is None or is_pure(b) for b in (i.lower, i.upper, i.step))
            for i in index
        )
    return is_pure(node)


def _kernel_call(x: ast.expr, r1: ast.expr, r2: ast.expr, mode: str) -> ast.Call:
    return ast.Call(
        ast.Name("_npu_rotary_mul", ast.Load()),
        [x, r1, r2],
        [ast.keyword("rotary_mode", ast.Constant(mode))],
    )


def _size_expression(node: ast.AST) -> bool:
    """Names, numbers, attributes, shape entries (`t.shape[-2]`, `t.size(1)`) and arithmetic on them: a
    size the guard may read again, which computes nothing."""
    if isinstance(node, ast.Subscript):
        return _size_expression(node.value) and _size_expression(node.slice)
    if isinstance(node, ast.Call):
        return (
            isinstance(node.func, ast.Attribute)
            and node.func.attr in ("size", "dim")
            and not node.keywords
            and _size_expression(node.func.value)
            and all(_size_expression(a) for a in node.args)
        )
    if isinstance(node, ast.BinOp):
        return _size_expression(node.left) and _size_expression(node.right)
    if isinstance(node, ast.UnaryOp):
        return _size_expression(node.operand)
    if isinstance(node, ast.Attribute):
        return _size_expression(node.value)
    return isinstance(node, (ast.Name, ast.Constant))


def _unique(nodes: list[ast.expr]) -> list[ast.expr]:
    kept: list[ast.expr] = []
    for node in nodes:
        if not any(same(node, k) for k in kept):
            kept.append(node)
    return kept


IDIOM = Idiom(
    rule=ROTARY,
    markers=("cos", "sin", "rotate", "rotary", "rope", "view_as_complex", "polar"),
    identifiers=(("cos", "sin"), "view_as_complex", "polar"),
    kernels=("npu_rotary_mul",),
    match=match,
    template=TEMPLATE,
    helpers={HELPER: "_npu_rotary_fits"},
)
