"""NPU703: hand-written rotary position embedding gets a `torch_npu.npu_rotary_mul` branch.

`npu_rotary_mul(x, r1, r2)` returns `r1 * x + r2 * rotate(x)`, with `rotate` (rotary_mode 'half') the
GPT-NeoX / HF `rotate_half`, `cat((-x2, x1), -1)` of the two halves of the last dim, or ('interleave')
GPT-J's `rotate_every_two`, `stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)`. The idiom
`x * cos + rot(x) * sin` is found in the function's folded expression with module-level helpers inlined,
so the rotation is recognised by what it computes, not by the helper's name.

What the branch must preserve and the kernel cannot see is checked at run time by `_npu_rotary_fits`:
the original broadcasts `x * cos`, the kernel returns x's shape and dtype, so cos/sin may only
broadcast *into* x (never grow it), in one of the shapes the kernel's table allows, with x's dtype (an
fp32 table with bf16 activations would promote the original's result). The cos/sin expressions and
the rotated tensors, where computed by a call, are bound once at the top of the branch and reused.
"""

from __future__ import annotations

import ast
import re

from npu_migrate.engine.rule import EVERY_TARGET, Example, FixSafety, Rule
from npu_migrate.program.api import load_table
from npu_migrate.transforms.fused.idiom import Idiom
from npu_migrate.transforms.fused.symbolic import (
    Function,
    NotStraightLine,
    Outcome,
    argument,
    body_statements,
    contains_call,
    evaluates_twice,
    fold,
    inline_functions,
    is_pure,
    method_call,
    replace_nodes,
    same,
    source,
    straight_tail,
    walk_shared,
)

ROTARY = Rule(
    id="NPU703",
    name="fused-rotary",
    family="fused",
    summary="hand-written rotary embedding (`x * cos + rotate_half(x) * sin`) gets a guarded `torch_npu.npu_rotary_mul` branch",
    what="""
    Recognises `x * cos + rotate_half(x) * sin` (either operand order), where `rotate_half` is any
    module-level function, method or inline expression computing `torch.cat((-x2, x1), dim=-1)` of the
    halves `x[..., : x.shape[-1] // 2]`, `x[..., x.shape[-1] // 2 :]` (or `x.chunk(2, -1)`), as in HF's
    `apply_rotary_pos_emb`, partial rotary on a leading slice included (Phi-3, and Qwen's
    `t_float[..., :rot_dim]` of one upcast with the tail passed through), einops halves
    (`rearrange(x, "... (j d) -> ... j d", j=2).unbind(-2)`), tables passed as a list (`cos, sin = freqs`),
    a CUDA-only fast path in front (kept for CUDA, the branch goes first), and the split-halves spelling
    `cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin))` with half-width tables (the kernel on the tables
    doubled, `cos.tile((2,))`; with the signs the other way round a rotation by -theta, the sin table
    negated). Interleaved rotary on real pairs (`x.reshape(*x.shape[:-1], -1, 2)`, unbound and stacked
    back as `stack((-x1, x0), -1).flatten(3)`, or the pair formulas `x0 * c - x1 * s`, `x1 * c + x0 * s` with
    tables per pair, repeated per element for the kernel) and GPT-J's interleaved
    `rotate_every_two` maps to rotary_mode='interleave' for torch_npu versions that have it, einops' pairs
    too (`rearrange(x, "... (d r) -> ... d r", r=2)`, unbound, stacked as `(-x2, x1)` and merged back with
    `rearrange(..., "... d r -> ... (d r)")`, as x-transformers and rotary-embedding-torch write it).
    Tables times a scale (`t * freqs.cos() * scale`, a number or an xpos tensor) are the kernel's tables
    `freqs.cos() * scale`, checked to be tensors; a part of the head before the rotated window
    (`t[..., :start]`) passes through as the tail does. A branch in
    front of the untouched body runs the kernel when the tensors are on an NPU and `_npu_rotary_fits`
    holds: 4-D, one dtype for x, cos and sin, cos/sin broadcasting into x in a layout the kernel accepts
    (BNSD: 11SD/B1SD/BNSD, BSND: 1S1D/BS1D/BSND, SBND: S11D/SB1D/SBND), an even head dim below 896.
    What the original computes once (the unsqueezed tables, an upcast `q.float()`) is bound once, in the
    branch, before the checks and the kernel read it. When the tables are prepared under `if`s or
    asserts and only the rest of the body is straight-line code, the branch goes in front of that rest,
    reading the values the names hold there.

    Declined, with a finding saying why: the sign-flipped rotation `cat((x2, -x1))` or
    `x * cos - rotate_half(x) * sin` (the inverse rotation), complex-number rotary (`view_as_complex`,
    `torch.polar`), interleaved rotary where the torch_npu version has no rotary_mode, a rotation under
    control flow. A function that multiplies a rotation, or what a `rotate*` helper returns, and is not
    fused always gets a finding saying why: the helper imported or not recognised, the rotated tensor not
    the one times cos.
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
_CAT = ("torch.cat", "torch.concat", "torch.concatenate")
_NAMES = ("_npu_cos", "_npu_sin")


def _negative(node: ast.expr | None, value: int) -> bool:
    return (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and isinstance(node.operand, ast.Constant)
        and node.operand.value == value
    )


def _minus_one(node: ast.expr | None) -> bool:
    return _negative(node, 1)


def _last_dim_half(node: ast.expr | None, x: ast.expr) -> bool:
    """`x.shape[-1] // 2` or `x.size(-1) // 2`."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv)):
        return False
    if not (isinstance(node.right, ast.Constant) and node.right.value == 2):
        return False
    size = node.left
    if isinstance(size, ast.Subscript) and isinstance(size.value, ast.Attribute) and size.value.attr == "shape":
        return _minus_one(size.slice) and same(size.value.value, x)
    call = method_call(size, "size")
    return (
        call is not None
        and len(call.args) == 1
        and not call.keywords
        and _minus_one(call.args[0])
        and same(call.func.value, x)
    )


def _last_dim_slice(node: ast.expr) -> tuple[ast.expr, ast.Slice] | None:
    """(x, the slice) for `x[..., s]`, or `x[:, :, :, s]` (the last dim of a 4-D x: the guard checks 4-D)."""
    if not (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Tuple)):
        return None
    *lead, last = node.slice.elts
    if not isinstance(last, ast.Slice):
        return None
    ellipsis = len(lead) == 1 and isinstance(lead[0], ast.Constant) and lead[0].value is Ellipsis
    full = len(lead) == 3 and all(
        isinstance(e, ast.Slice) and e.lower is None and e.upper is None and e.step is None for e in lead
    )
    return (node.value, last) if ellipsis or full else None


def _half(node: ast.expr, fn: Function) -> tuple[ast.expr, int] | None:
    """(x, 0 or 1) when `node` is the first or second half of x's last dim."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value in (0, 1):
        split = _einops_halves(node.value, fn)
        if split is not None:
            return split, node.slice.value
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value in (0, 1):
        chunk = node.value
        if isinstance(chunk, ast.Call):
            if fn.qualname(chunk.func) == "torch.chunk":
                x, chunks, dim = (
                    chunk.args[0] if chunk.args else None,
                    argument(chunk, 1, "chunks"),
                    argument(chunk, 2, "dim"),
                )
            elif method_call(chunk, "chunk") is not None:
                x, chunks, dim = chunk.func.value, argument(chunk, 0, "chunks"), argument(chunk, 1, "dim")
            else:
                return None
            if x is not None and isinstance(chunks, ast.Constant) and chunks.value == 2 and _minus_one(dim):
                return x, node.slice.value
        return None
    sliced = _last_dim_slice(node)
    if sliced is None:
        return None
    x, part = sliced
    if part.step is not None:
        return None
    if part.lower is None and _last_dim_half(part.upper, x):
        return x, 0
    if part.upper is None and _last_dim_half(part.lower, x):
        return x, 1
    return None


def _einops_halves(node: ast.expr, fn: Function) -> ast.expr | None:
    """x for `rearrange(x, "... (j d) -> ... j d", j=2).unbind(dim=-2)`: the halves of x's last dim, as
    Qwen's `_rotate_half` splits them."""
    unbind = method_call(node, "unbind")
    if unbind is None or len(unbind.args) + len(unbind.keywords) != 1 or not _negative(argument(unbind, 0, "dim"), 2):
        return None
    return _einops_split(unbind.func.value, fn, 0)


#: An einops axis list: names and `...`, no groups (the prefix both sides of a split or merge share).
_AXES = r"((?:\w+|\.\.\.)(?:\s+(?:\w+|\.\.\.))*)"


def _einops_groups(call: ast.Call, fn: Function) -> tuple[str, str, str] | None:
    """(first, second, direction) for `rearrange(x, "... (a b) -> ... a b", ...)` ("split") or
    `rearrange(x, "... a b -> ... (a b)")` ("merge"): the last dim split in two, or the last two merged,
    the axes in front (`...`, or `b ...`) the same on both sides."""
    if not (fn.qualname(call.func) == "einops.rearrange" and len(call.args) == 2):
        return None
    pattern = call.args[1]
    if not (isinstance(pattern, ast.Constant) and isinstance(pattern.value, str)):
        return None
    grouped, plain = r"\(\s*(\w+)\s+(\w+)\s*\)", r"(\w+)\s+(\w+)"
    for direction, left, right in (("split", grouped, plain), ("merge", plain, grouped)):
        found = re.fullmatch(rf"\s*{_AXES}\s*{left}\s*->\s*{_AXES}\s*{right}\s*", pattern.value)
        if found is None:
            continue
        prefix, a, b, prefix_after, a_after, b_after = found.groups()
        if prefix.split() == prefix_after.split() and (a, b) == (a_after, b_after) and a != b:
            names = [n for n in prefix.split() if n != "..."]
            if a not in names and b not in names:
                return a, b, direction
    return None


def _einops_split(node: ast.expr, fn: Function, axis: int) -> ast.expr | None:
    """x for `rearrange(x, "... (a b) -> ... a b", <a or b>=2)`, with axis 0 naming `a`, 1 naming `b`, as
    the one set to 2: `a=2` makes the two halves of x's last dim, `b=2` its (even, odd) pairs."""
    if not isinstance(node, ast.Call):
        return None
    groups = _einops_groups(node, fn)
    if groups is None or groups[2] != "split" or len(node.keywords) != 1:
        return None
    two = node.keywords[0]
    if two.arg != groups[axis] or not (isinstance(two.value, ast.Constant) and two.value.value == 2):
        return None
    return node.args[0]


def _real_pairs(node: ast.expr, fn: Function) -> ast.expr | None:
    """x for `x.reshape(*x.shape[:-1], -1, 2)` (or `.view`, or `rearrange(x, "... (d r) -> ... d r", r=2)`):
    x's last dim as (real, imaginary) pairs."""
    paired = _einops_split(node, fn, 1)
    if paired is not None:
        return paired
    call = method_call(node, "reshape") or method_call(node, "view")
    if call is None or call.keywords or len(call.args) != 3:
        return None
    lead, pairs, two = call.args
    x = call.func.value
    # `x.float().reshape(*x.shape[:-1], -1, 2)`: the shape may be read from x before its upcast.
    shapes = [x, x.func.value] if method_call(x, "float") is not None and not x.args else [x]
    leading = [
        ast.Starred(
            ast.Subscript(
                ast.Attribute(shaped, "shape", ast.Load()),
                ast.Slice(None, ast.UnaryOp(ast.USub(), ast.Constant(1)), None),
                ast.Load(),
            ),
            ast.Load(),
        )
        for shaped in shapes
    ]
    if any(same(lead, s) for s in leading) and _minus_one(pairs) and isinstance(two, ast.Constant) and two.value == 2:
        return x
    return None


def _pair_part(node: ast.expr, fn: Function) -> tuple[ast.expr, int] | None:
    """(x, 0 or 1) for the even or odd elements of x's last dim taken as pairs: `pairs[..., 0]`, or
    `pairs.unbind(-1)[0]`, where `pairs = x.reshape(*x.shape[:-1], -1, 2)`."""
    if not isinstance(node, ast.Subscript):
        return None
    index = node.slice
    if isinstance(index, ast.Tuple) and len(index.elts) == 2 and isinstance(index.elts[0], ast.Constant):
        if index.elts[0].value is not Ellipsis:
            return None
        pairs, index = node.value, index.elts[1]
    else:
        unbind = method_call(node.value, "unbind")
        if unbind is None or len(unbind.args) + len(unbind.keywords) != 1 or not _minus_one(argument(unbind, 0, "dim")):
            return None
        pairs = unbind.func.value
    if not (isinstance(index, ast.Constant) and index.value in (0, 1)):
        return None
    x = _real_pairs(pairs, fn)
    return None if x is None else (x, index.value)


def _every_other(node: ast.expr, fn: Function) -> tuple[ast.expr, int] | None:
    """(x, 0 or 1) for `x[..., ::2]` / `x[..., 1::2]`, or the parts of `x` reshaped into pairs."""
    paired = _pair_part(node, fn)
    if paired is not None:
        return paired
    sliced = _last_dim_slice(node)
    if sliced is None:
        return None
    x, part = sliced
    if part.upper is not None or not (isinstance(part.step, ast.Constant) and part.step.value == 2):
        return None
    if part.lower is None:
        return x, 0
    if isinstance(part.lower, ast.Constant) and part.lower.value in (0, 1):  # `0::2` is `::2`
        return x, part.lower.value
    return None


def _negated(node: ast.expr) -> ast.expr | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return node.operand
    return None


def _pair(call: ast.Call, names: tuple[str, ...], fn: Function) -> tuple[ast.expr, ast.expr] | None:
    """The two operands of `torch.cat((a, b), dim=-1)` (or `torch.stack`), nothing else passed."""
    if fn.qualname(call.func) not in names or not call.args:
        return None
    seq = call.args[0]
    dim = argument(call, 1, "dim")
    if any(k.arg != "dim" for k in call.keywords) or len(call.args) > 2:
        return None
    if not (isinstance(seq, (ast.Tuple, ast.List)) and len(seq.elts) == 2 and _minus_one(dim)):
        return None
    return seq.elts[0], seq.elts[1]


def _ordered(first: ast.expr, second: ast.expr, part) -> tuple[ast.expr, bool] | None:
    """(x, flipped): `(-x2, x1)` is the rotation the kernel computes, `(x2, -x1)` its inverse."""
    for neg, pos, halves, flipped in ((first, second, (1, 0), False), (second, first, (0, 1), True)):
        inner = _negated(neg)
        if inner is None:
            continue
        a, b = part(inner), part(pos)
        if a is not None and b is not None and (a[1], b[1]) == halves and same(a[0], b[0]):
            return a[0], flipped
    return None


def rotation(node: ast.expr, fn: Function) -> tuple[str, ast.expr, bool] | None:
    """(mode, x, flipped) when `node` rotates x's last dim: 'half' (rotate_half) or 'interleave'."""
    if not isinstance(node, ast.Call):
        return None
    operands = _pair(node, _CAT, fn)
    if operands is not None:
        found = _ordered(*operands, lambda e: _half(e, fn))
        return None if found is None else ("half", found[0], found[1])
    merged = _einops_groups(node, fn)
    if merged is not None and merged[2] == "merge" and not node.keywords:
        # `rearrange(stacked, "... d r -> ... (d r)")`: the last two dims merged, whatever the rank.
        stacked = node.args[0]
    else:
        if fn.qualname(node.func) == "torch.flatten" and node.args:
            stacked, start, count = node.args[0], argument(node, 1, "start_dim"), 2
        elif method_call(node, "flatten") is not None:
            stacked, start, count = node.func.value, argument(node, 0, "start_dim"), 1
        else:
            return None
        # flatten(3): the 5-D stack of a 4-D x (the guard checks 4-D), as torchtune and diffusers write it.
        start_ok = _negative(start, 2) or isinstance(start, ast.Constant) and start.value == 3
        if len(node.args) + len(node.keywords) != count or not start_ok:
            return None
    if not isinstance(stacked, ast.Call):
        return None
    operands = _pair(stacked, ("torch.stack",), fn)
    if operands is None:
        return None
    found = _ordered(*operands, lambda e: _every_other(e, fn))
    return None if found is None else ("interleave", found[0], found[1])


class Site:
    """One `x * cos + rot(x) * sin` in the folded expression."""

    def __init__(self, node: ast.BinOp, x: ast.expr, cos: ast.expr, sin: ast.expr, mode: str, flipped: bool) -> None:
        self.node, self.x, self.cos, self.sin, self.mode, self.flipped = node, x, cos, sin, mode, flipped
        #: The tables as the code has them, when the kernel's are built from them (`torch.cat((cos, cos))`):
        #: building them must not fail where the original runs, so they are checked to be tensors first.
        self.source_tables: tuple[ast.expr, ...] = ()
        #: The tables that are products of the code's factors (`freqs.cos() * scale`): a product of numbers
        #: is no table, so they are bound in the branch and checked to be tensors before the kernel reads them.
        self.products: tuple[ast.expr, ...] = ()


def _factor(product: ast.expr, test) -> tuple[ast.expr, object] | None:
    """(the other factor, what `test` found) for a product one of whose factors passes `test`."""
    if not (isinstance(product, ast.BinOp) and isinstance(product.op, ast.Mult)):
        return None
    for this, other in ((product.left, product.right), (product.right, product.left)):
        found = test(this)
        if found:
            return other, found
    return None


def _doubled(table: ast.expr, negate: bool) -> ast.expr:
    """`table.tile((2,))` (negated): a half-width table made the kernel's full-width one, `cat((t, t), -1)`
    with the table written (and evaluated) once."""
    doubled = ast.Call(ast.Attribute(table, "tile", ast.Load()), [ast.Tuple([ast.Constant(2)], ast.Load())], [])
    return ast.UnaryOp(ast.USub(), doubled) if negate else doubled


def _upcast_rotation(node: ast.expr, fn: Function) -> tuple[str, ast.expr, bool] | None:
    """`rotate(x).float()`: the rotation of `x.float()` (a rotation only moves and negates elements)."""
    call = method_call(node, "float")
    if call is None or call.args or call.keywords:
        return None
    found = rotation(call.func.value, fn)
    if found is None:
        return None
    mode, x, flipped = found
    return mode, ast.Call(ast.Attribute(x, "float", ast.Load()), [], []), flipped


def sites(expr: ast.AST, fn: Function) -> list[Site]:
    found = []
    # The kernel's tables built from a table of the code: one node per table, so that q and k rotated
    # with the same table share what the branch builds (and binds) once.
    built: dict[tuple[str, int, bool], ast.expr] = {}
    products: dict[tuple[int, ...], ast.expr] = {}

    def table(build, source: ast.expr, negate: bool = False) -> ast.expr:
        key = (build.__name__, id(source), negate)
        if key not in built:
            built[key] = build(source, negate)
        return built[key]

    for node in walk_shared(expr):
        split = _split_halves(node, fn)
        if split is not None:
            x, cos, sin, negative = split
            found.append(Site(node, x, table(_doubled, cos), table(_doubled, sin, negative), "half", False))
            found[-1].source_tables = (cos, sin)
            continue
        pairs = _pair_formulas(node, fn)
        if pairs is not None:
            x, cos, sin = pairs
            found.append(Site(node, x, table(_repeated, cos), table(_repeated, sin), "interleave", False))
            found[-1].source_tables = (cos, sin)
            continue
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub))):
            continue
        pairs = (
            ((node.left, node.right), (node.right, node.left))
            if isinstance(node.op, ast.Add)
            else ((node.left, node.right),)
        )
        for plain, rotated in pairs:
            rot = _chain_factor(rotated, lambda e: rotation(e, fn) or _upcast_rotation(e, fn), products)
            if rot is None:
                continue
            sin, (mode, x, flipped) = rot
            cos = _chain_factor(plain, lambda e: same(e, x), products)  # noqa: B023 (called before x changes)
            if cos is None:
                continue
            # `x * cos - cat((x2, -x1)) * sin` negates twice: exactly the kernel's rotation.
            found.append(Site(node, x, cos[0], sin, mode, flipped != isinstance(node.op, ast.Sub)))
            found[-1].products = tuple(t for t in (cos[0], sin) if any(t is p for p in products.values()))
            break
    return found


def _factors(product: ast.expr) -> list[ast.expr]:
    """The factors of `a * b * c` (however parenthesised), left to right."""
    if isinstance(product, ast.BinOp) and isinstance(product.op, ast.Mult):
        return [*_factors(product.left), *_factors(product.right)]
    return [product]


def _chain_factor(product: ast.expr, test, products: dict[tuple[int, ...], ast.expr]) -> tuple[ast.expr, object] | None:
    """(the product of the other factors, what `test` found) for a product of two or more factors one of
    which passes `test`: `t * freqs.cos() * scale` is `t` times the table `freqs.cos() * scale`, the
    scale folded into it. A table of several factors is one node per set of factors (`products`), so
    that q and k rotated by the same factors share it."""
    found = _factor(product, test)
    if found is not None:
        return found
    factors = _factors(product)
    if len(factors) < 3:
        return None
    for index, factor in enumerate(factors):
        what = test(factor)
        if what:
            others = factors[:index] + factors[index + 1 :]
            key = tuple(id(f) for f in others)
            if key not in products:
                table = others[0]
                for other in others[1:]:
                    table = ast.BinOp(table, ast.Mult(), other)
                products[key] = table
            return products[key], what
    return None


def _terms(node: ast.expr) -> list[tuple[int, ast.expr]] | None:
    """The two signed terms of `a + b`, `a - b` (a sign of -1 for `-b`, or for a factor `(-s)`)."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub))):
        return None
    terms = [(1, node.left), (1 if isinstance(node.op, ast.Add) else -1, node.right)]
    found = []
    for sign, term in terms:
        inner = _negated(term)
        if inner is not None:
            sign, term = -sign, inner
        found.append((sign, term))
    return found


def _scaled(term: ast.expr, half: ast.expr) -> tuple[int, ast.expr] | None:
    """(sign, table) when `term` is `half * table`, `table * half`, or either with a negated table."""
    found = _factor(term, lambda e: same(e, half))
    if found is None:
        return None
    table = found[0]
    inner = _negated(table)
    return (-1, inner) if inner is not None else (1, table)


def _split_halves(node: ast.expr, fn: Function) -> tuple[ast.expr, ast.expr, ast.expr, bool] | None:
    """(x, cos, sin, by -theta) for `cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)` on the halves
    x1, x2 of x's last dim, with half-width tables: the rotation by +theta, the kernel's on
    `cat((cos, cos))` and `cat((sin, sin))`. With the signs the other way round (`x1 * cos + x2 * sin`,
    `x2 * cos - x1 * sin`) it rotates by -theta: the kernel's with the sin table negated."""
    if not isinstance(node, ast.Call):
        return None
    operands = _pair(node, _CAT, fn)
    if operands is None:
        return None
    first, second = (_terms(o) for o in operands)
    if first is None or second is None:
        return None

    def half_factor(term: ast.expr, index: int) -> ast.expr | None:
        if not (isinstance(term, ast.BinOp) and isinstance(term.op, ast.Mult)):
            return None
        return next((f for f in (term.left, term.right) if (_half(f, fn) or (None, -1))[1] == index), None)

    for (sign_cos, cos_term), (sign_sin, sin_term) in (first, first[::-1]):
        x1, x2 = half_factor(cos_term, 0), half_factor(sin_term, 1)
        if x1 is None or x2 is None or not same(_half(x1, fn)[0], _half(x2, fn)[0]):
            continue
        cos, sin = _scaled(cos_term, x1), _scaled(sin_term, x2)
        if sign_cos * cos[0] != 1:
            continue
        sign = sign_sin * sin[0]  # -1: `x1 * cos - x2 * sin`, the rotation by +theta
        for (sign_cos2, cos_term2), (sign_sin2, sin_term2) in (second, second[::-1]):
            cos2, sin2 = _scaled(cos_term2, x2), _scaled(sin_term2, x1)
            if cos2 is None or sin2 is None or sign_cos2 * cos2[0] != 1 or sign_sin2 * sin2[0] != -sign:
                continue
            if same(cos2[1], cos[1]) and same(sin2[1], sin[1]):
                return _half(x1, fn)[0], cos[1], sin[1], sign == 1
    return None


def _pair_formulas(node: ast.expr, fn: Function) -> tuple[ast.expr, ast.expr, ast.expr] | None:
    """(x, cos, sin) for `stack([x0 * c - x1 * s, x1 * c + x0 * s], -1).flatten(3)` on x's pairs (x0, x1)
    with half-width tables: the interleaved rotation by +theta, the kernel's on the tables repeated per
    pair (`repeat_interleave(2, -1)`)."""
    if fn.qualname(node.func if isinstance(node, ast.Call) else None) == "torch.flatten" and node.args:
        stacked, start = node.args[0], argument(node, 1, "start_dim")
    elif method_call(node, "flatten") is not None and len(node.args) == 1 and not node.keywords:
        stacked, start = node.func.value, node.args[0]
    else:
        return None
    if not (_negative(start, 2) or isinstance(start, ast.Constant) and start.value == 3):
        return None
    operands = _pair(stacked, ("torch.stack",), fn) if isinstance(stacked, ast.Call) else None
    if operands is None:
        return None
    first, second = (_terms(o) for o in operands)
    if first is None or second is None:
        return None

    def part(term: ast.expr, index: int) -> ast.expr | None:
        if not (isinstance(term, ast.BinOp) and isinstance(term.op, ast.Mult)):
            return None
        return next((f for f in (term.left, term.right) if (_pair_part(f, fn) or (None, -1))[1] == index), None)

    for (sign_cos, cos_term), (sign_sin, sin_term) in (first, first[::-1]):
        x0, x1 = part(cos_term, 0), part(sin_term, 1)
        if x0 is None or x1 is None or not same(_pair_part(x0, fn)[0], _pair_part(x1, fn)[0]):
            continue
        cos, sin = _scaled(cos_term, x0), _scaled(sin_term, x1)
        if sign_cos * cos[0] != 1 or sign_sin * sin[0] != -1:
            continue
        for (sign_cos2, cos_term2), (sign_sin2, sin_term2) in (second, second[::-1]):
            cos2, sin2 = _scaled(cos_term2, x1), _scaled(sin_term2, x0)
            if cos2 is None or sin2 is None or sign_cos2 * cos2[0] != 1 or sign_sin2 * sin2[0] != 1:
                continue
            if same(cos2[1], cos[1]) and same(sin2[1], sin[1]):
                return _pair_part(x0, fn)[0], cos[1], sin[1]
    return None


def _repeated(table: ast.expr, negate: bool = False) -> ast.expr:
    """`table.repeat_interleave(2, dim=-1)` (negated): a per-pair table made the kernel's per-element one."""
    repeated = ast.Call(
        ast.Attribute(table, "repeat_interleave", ast.Load()),
        [ast.Constant(2)],
        [ast.keyword("dim", ast.UnaryOp(ast.USub(), ast.Constant(1)))],
    )
    return ast.UnaryOp(ast.USub(), repeated) if negate else repeated


def _calls(fn: Function, names: tuple[str, ...]) -> bool:
    return fn.may_call(names) and any(fn.qualname(n.func) in names for n in fn.calls)


def _may_rotate(call: ast.Call, fn: Function) -> bool:
    """Whether `rotation` can accept `call` once module functions are inlined into it: inlining replaces
    a call of a module function by anything, and keeps every other call's function as it is, which
    `rotation` needs to be a concatenation or a flatten. Inlining is the dear part; this is not."""
    func = call.func
    return (
        isinstance(func, ast.Name)
        and func.id in fn.functions
        or isinstance(func, ast.Attribute)
        and func.attr == "flatten"
        or fn.qualname(func) in (*_CAT, "torch.flatten", "einops.rearrange")
    )


def _rotary_modes(fn: Function) -> tuple[bool, bool]:
    """(npu_rotary_mul exists, it takes rotary_mode) in the chosen torch_npu version."""
    if fn.api is None:
        return True, True
    entry = load_table("torch_npu_api.toml")["versions"].get(fn.api.version, {})
    return "npu_rotary_mul" in fn.api.fused_ops, bool(entry.get("rotary_mul_has_rotary_mode", False))


def _complex_only_in_a_branch(fn: Function) -> ast.If | None:
    """The top-level `if` whose one side holds the complex rotation, when the other side does not:
    diffusers' `if use_real: <real rotation> else: <view_as_complex>`."""
    complex_names = ("torch.view_as_complex", "torch.polar")
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
    branch = _complex_only_in_a_branch(fn) if _calls(fn, ("torch.view_as_complex", "torch.polar")) else None
    if branch is not None:
        return Outcome(
            ROTARY,
            f"complex-number rotary on one side of `if {source(branch.test)}:` left alone (npu_rotary_mul takes"
            " real cos/sin tables); the real side is not fused either: the function is not straight-line code",
        )
    if _calls(fn, ("torch.view_as_complex",)):
        return Outcome(
            ROTARY,
            "complex-number rotary (`torch.view_as_complex`) left alone: npu_rotary_mul takes real cos/sin tables; "
            "rewrite it as `x * cos + rotate_half(x) * sin` with cos/sin = freqs.cos()/sin() repeated per half to fuse it",
        )
    if _calls(fn, ("torch.polar",)):
        return Outcome(
            ROTARY,
            "complex rotary frequencies (`torch.polar`) left alone: the rotation they feed uses complex "
            "multiplication, which npu_rotary_mul does not take",
        )
    try:
        result = inline_functions(fn, fold(fn))
    except NotStraightLine as why:
        try:
            calls_rotation = any(
                rotation(inline_functions(fn, n), fn) is not None for n in fn.calls if _may_rotate(n, fn)
            )
        except NotStraightLine:
            calls_rotation = False
        if not calls_rotation:
            return _rotate_helper_outcome(fn)
        tail = _straight_tail_outcome(fn)
        return tail if tail is not None else Outcome(ROTARY, f"rotary embedding not fused: {why}")
    return _outcome(fn, result)


def _straight_tail_outcome(fn: Function) -> Outcome | None:
    """The branch in front of the longest straight-line tail of the body that holds the rotary embedding
    (x-transformers: the tables are prepared under `if`s, then rotated in straight-line code), for the
    values the names hold there; None when no tail holds one."""
    body = body_statements(fn.tree)
    for start in range(1, len(body)):
        tail = straight_tail(fn, start)
        try:
            result = inline_functions(tail, fold(tail))
        except NotStraightLine:
            continue
        if not sites(result, tail):
            return None
        if any(isinstance(n, ast.Name) and n.id.startswith("_npu_") for n in fn.nodes):
            return Outcome(ROTARY, "rotary embedding not fused: the code already uses `_npu_` names the branch needs")
        outcome = _outcome(tail, result)
        if outcome is not None and outcome.template is not None:
            outcome.before = body[start]
        return outcome
    return None


def _outcome(fn: Function, result: ast.expr) -> Outcome | None:
    found = sites(result, fn)
    if not found:
        return _unmatched_rotation(result, fn) or _rotate_helper_outcome(fn)
    if any(s.flipped for s in found):
        return Outcome(
            ROTARY,
            "rotary embedding not fused: it rotates by -theta (a sign-flipped `cat((x2, -x1))`, or the rotated "
            "half subtracted); npu_rotary_mul only computes `x * cos + cat((-x2, x1)) * sin`",
        )
    modes = {s.mode for s in found}
    if len(modes) > 1:
        return Outcome(ROTARY, "rotary embedding not fused: it mixes half and interleaved rotations")
    mode = modes.pop()
    exists, has_mode = _rotary_modes(fn)
    version = fn.api.version if fn.api is not None else "?"
    if not exists:
        return Outcome(ROTARY, f"rotary embedding not fused: torch_npu {version} has no npu_rotary_mul")
    if mode == "interleave" and not has_mode:
        return Outcome(
            ROTARY,
            f"interleaved rotary embedding not fused: npu_rotary_mul in torch_npu {version} has no rotary_mode='interleave'",
        )
    return _rewrite(fn, result, found, mode)


def _unmatched_rotation(result: ast.expr, fn: Function) -> Outcome | None:
    """The finding for a function that multiplies a rotation (rotate_half or its interleaved form, by what
    it computes) by something but has no `x * cos + rotate(x) * sin`: never silent about a rotary
    embedding it leaves alone."""
    for node in walk_shared(result):
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
            continue
        for factor in _factors(node):
            found = rotation(factor, fn) or _upcast_rotation(factor, fn)
            if found is not None:
                return Outcome(
                    ROTARY,
                    f"rotary embedding not fused: the rotation of `{source(found[1])}` is multiplied by a table, "
                    "but not summed as `x * cos + rotate(x) * sin` with that same x, which is what "
                    "npu_rotary_mul computes",
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
            if isinstance(factor.func, ast.Name) and name in fn.functions:
                why = (
                    f"`{name}` is not recognised as rotate_half (`cat((-x2, x1), -1)` of the halves of the last "
                    "dim) or its interleaved form, the rotations npu_rotary_mul applies"
                )
            else:
                why = (
                    f"`{source(factor.func)}` is not one straight-line function of this module (it is imported, "
                    "defined twice or has control flow): what it computes cannot be proven to be the rotation "
                    "npu_rotary_mul applies"
                )
            return Outcome(ROTARY, f"rotary embedding not fused: {why}")
    return None


def _rewrite(fn: Function, result: ast.expr, found: list[Site], mode: str) -> Outcome:
    # One cos and one sin for every site, as in every known implementation: binding them once keeps
    # each evaluated exactly once, as in the original.
    cos, sin = found[0].cos, found[0].sin
    for site in found[1:]:
        for mine, first in ((site.cos, cos), (site.sin, sin)):
            if not (mine is first or (same(mine, first) and not contains_call(mine))):
                return Outcome(ROTARY, "rotary embedding not fused: its rotations use different cos/sin tables")
    if any(isinstance(n, ast.Name) and n.id.startswith("_npu_") for n in fn.nodes):
        return Outcome(ROTARY, "rotary embedding not fused: the code already uses `_npu_` names the branch needs")
    replacements: dict[int, ast.AST] = {}
    # What the guard and the kernel share and the original computes by a call (`cos.unsqueeze(1)`,
    # `q.float()`) is bound once, first thing in the branch, in the original's order.
    bindings: list[tuple[str, ast.expr]] = []
    for table, name in ((cos, _NAMES[0]), (sin, _NAMES[1])):
        if contains_call(table) or any(table is p for p in found[0].products):
            replacements[id(table)] = ast.Name(name, ast.Load())
            bindings.append((name, table))
    r1, r2 = (replacements.get(id(t), t) for t in (cos, sin))
    xs = []  # the tensors the guard checks: each rotated tensor, or its binding
    fused: dict[int, ast.AST] = {}
    for site in found:
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
        fused[id(site.node)] = _kernel_call(x, r1, r2, mode)
    rewritten = replace_nodes(result, {**replacements, **fused})
    evaluated = [value for _, value in bindings]
    if evaluates_twice(ast.Tuple([*evaluated, rewritten], ast.Load())):
        return Outcome(ROTARY, "rotary embedding not fused: the branch would evaluate a call of the original twice")
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
        return Outcome(ROTARY, "rotary embedding not fused: the rotated tensor is not computed from a parameter")
    if not set(fn.fast_path_tensors) <= {x_param}:
        return Outcome(ROTARY, "rotary embedding not fused: its CUDA fast path tests another tensor than it rotates")
    # Tables passed in as arguments may be Python numbers or lists: the kernel needs tensors.
    tensors = [f"isinstance({source(t)}, torch.Tensor)" for t in _unique(list(found[0].source_tables)) if is_pure(t)]
    # One check per rotated tensor, in the order the original computes them.
    products = [name for name, value in bindings if any(value is p for p in found[0].products)]
    checks = [f"isinstance({name}, torch.Tensor)" for name in products] + [
        source(
            ast.Call(
                ast.Name("_npu_rotary_fits", ast.Load()),
                [r1, r2, x],
                [ast.keyword("mode", ast.Constant(mode))],
            )
        )
        for x in _unique(xs)
    ]
    what = "interleaved rotary embedding" if mode == "interleave" else "rotary embedding"
    context = {
        "x": x_param,
        "guards": tensors if bindings else [*tensors, *checks],
        "bindings": [(name, source(value)) for name, value in bindings],
        "checks": checks if bindings else [],
        "result": source(rewritten),
    }
    return Outcome(ROTARY, f"{what} gets a fused `torch_npu.npu_rotary_mul` branch", TEMPLATE, context, (HELPER,))


def _kernel_call(x: ast.expr, r1: ast.expr, r2: ast.expr, mode: str) -> ast.Call:
    return ast.Call(
        ast.Name("_npu_rotary_mul", ast.Load()),
        [x, r1, r2],
        [ast.keyword("rotary_mode", ast.Constant(mode))],
    )


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
