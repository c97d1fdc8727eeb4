"""What a rotary embedding must compute, and the kernel tables that make `npu_rotary_mul` compute it.

`npu_rotary_mul(x, C, S, mode)` is `x * C + rotate(x) * S`, with `rotate` in mode 'half' the GPT-NeoX
`cat((-x2, x1), -1)` of the halves of the last dim and in mode 'interleave' GPT-J's
`stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)`. A subexpression is a rotary embedding of a tensor
`x` when the abstract run of it (`evaluator`) gives, for every element j of x's last dim, a polynomial
`x[j] * C[j] + x[partner(j)] * sign(j) * S[j]` with C, S products of table entries (signs included:
the rotation by -theta is the kernel's with S negated), and when C and S can be built from the tables
the code reads, by tensor operations, once per call: the table itself, its two halves' worth
(`t.tile((2,))`), one entry per pair (`t.repeat_interleave(2, dim=-1)`), the parts of a complex or a
pair table (`t.real`, `t[..., 0]`), per parity of the element (`stack((a, b), -1).flatten(-2)`).

x is run at two head dims (8 and 12): a spelling that holds only for one size (a literal `x[..., :4]`)
or a table repeated one way at one size and another at the other is not claimed. Anything else is
declined with what differs: an element read from a position neither mode pairs it with, a term
scaled by a constant, a sum of tables, a term that does not read x, a complex table the code computes by
arithmetic (scaled or shifted: not a rotation alone).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from fractions import Fraction

from npu_migrate.transforms.fused.evaluator import CAST_NOT_KNOWN, Evaluation, Structure, Tensor, Unknown, x_tensor

#: x's shapes: 4-D with distinct leading sizes (a transpose or a concatenation on a wrong axis shows),
#: two head dims.
SHAPES = ((2, 3, 1, 8), (2, 3, 1, 12))
_LEAD = 3


@dataclass
class Meaning:
    """`node` computes `npu_rotary_mul(x, cos, sin, mode)` (x upcast first when `upcast`)."""

    mode: str
    cos: ast.expr
    sin: ast.expr
    upcast: bool
    #: the code's tables the kernel tables are built from (to check they are tensors), and the kernel
    #: tables that are products of the code's factors
    sources: list[ast.expr] = field(default_factory=list)
    products: list[ast.expr] = field(default_factory=list)
    #: (table, its trailing sizes as "d", "d // 2" or a number) for each table of more than x's rank: the
    #: shape the evaluator assumed for it (`x * t[..., 0]` reads it at any size the product broadcasts
    #: to), which the branch checks before it reads the table
    shapes: list[tuple[ast.expr, tuple[str, ...]]] = field(default_factory=list)
    #: (base, width) when x is `base[..., :width]` and the computation reads `width` as x's last size (the
    #: rotated width read from a table's shape, `rope_cache.shape[-2] * 2`): it is, where `0 <= width <=
    #: base.shape[-1]`, which the branch checks.
    window: tuple[ast.expr, ast.expr] | None = None


class Declined(Exception):
    """The node is close to a rotary embedding but not one: the message says what differs, `remedy` what
    would let it fuse ("to fuse it, ...") or that nothing in the code can ("nothing in the code can: ..."),
    the clause `Outcome.remedy` joins to the finding."""

    def __init__(self, message: str, remedy: str, *, differs: bool = True) -> None:
        super().__init__(message)
        self.remedy = remedy
        #: False where the message is no difference from the kernel's formula (a shape the kernel does not
        #: take, a size not known): the finding does not add that it computes something else.
        self.differs = differs


#: The remedy of a computation no edit that keeps it would let the kernel do.
_NOT_THE_KERNELS = (
    "nothing in the code can: npu_rotary_mul computes `x * cos + rotate(x) * sin`, element j of x times its own "
    "table entry plus its rotation partner (half or interleaved) times another, and this computes something else"
)


def _partner(mode: str, j: int, d: int) -> tuple[int, int]:
    """(the element `rotate(x)[j]` reads, its sign)."""
    if mode == "half":
        return (j + d // 2, -1) if j < d // 2 else (j - d // 2, 1)
    return (j + 1, -1) if j % 2 == 0 else (j - 1, 1)


def coefficients(out: Tensor, d: int) -> list[dict[int, dict]]:
    """Per output element, x's last-dim index -> the polynomial over table symbols multiplying it."""
    terms: list[dict[int, dict]] = []
    for p, (poly, _) in enumerate(out.data):
        found: dict[int, dict] = {}
        for mono, coef in poly.items():
            xs = [s for s in mono if s[0] == "x"]
            if len(xs) != 1:
                if not xs:
                    raise Declined(
                        "a term does not read x",
                        "to fuse it, add what does not read x (a bias) outside the rotation, in a statement of its own",
                    )
                raise Declined("a term multiplies elements of x with each other", _NOT_THE_KERNELS)
            lead, j = divmod(xs[0][1], d)
            if lead != p // d:
                raise Declined("an element reads x at another position of the leading dims", _NOT_THE_KERNELS)
            rest = tuple(s for s in mono if s[0] != "x")
            found.setdefault(j, {})
            found[j][rest] = found[j].get(rest, 0) + coef
        terms.append(found)
    return terms


def split(terms: list[dict[int, dict]], d: int) -> tuple[str, list[dict], list[dict]] | None:
    """(mode, C, S) per element, None when nothing is both kept and rotated, or Declined with the first
    element that fits neither mode."""
    why = None
    for mode in ("half", "interleave"):
        cos, sin = [], []
        for p, found in enumerate(terms):
            j = p % d
            partner, sign = _partner(mode, j, d)
            stray = sorted(set(found) - {j, partner})
            if stray:
                why = why or (
                    f"element {j} of the last dim reads element {stray[0]}, which neither rotation pairs it with "
                    f"(half: {(j + d // 2) % d}, interleave: {j ^ 1})"
                )
                break
            cos.append(found.get(j, {}))
            sin.append({m: sign * c for m, c in found.get(partner, {}).items()})
        else:
            if not any(sin) or not any(cos):
                return None  # no rotation, or a rotation alone (`rotate_half`): no rotary embedding
            if not all(sin) or not all(cos):
                raise Declined(
                    "some elements are not rotated, or not kept",
                    "to fuse it, rotate a slice of x (`x[..., :r]`) and concatenate the rest as it is "
                    "(`torch.cat((rotated, x[..., r:]), dim=-1)`), if that is what it computes",
                )
            return mode, cos, sin
    raise Declined(why, _NOT_THE_KERNELS)


class _Builder:
    """Kernel tables as expressions over the code's tables: `tables[n]` = (node, symbolic tensor)."""

    def __init__(self, tables: dict[int, tuple[ast.expr, Tensor]], d: int) -> None:
        self.tables, self.d = tables, d
        self.sources: list[ast.expr] = []
        self.shapes: list[tuple[ast.expr, tuple[str, ...]]] = []

    def table(self, entries: list[dict]) -> tuple[ast.expr, bool]:
        """(the expression, whether it is a product) for per-element monomials `entries`."""
        shapes = []
        for p, poly in enumerate(entries):
            if len(poly) != 1:
                raise Declined(
                    "a kernel table would be a sum of the code's tables",
                    "to fuse it, add those tables into one before the rotation (the kernel takes one cos and one sin)",
                )
            ((mono, coef),) = poly.items()
            if coef not in (1, -1):
                raise Declined(
                    f"the rotation is scaled by {Fraction(coef)}",
                    f"to fuse it, multiply the table by {Fraction(coef)} where it is computed (`sin = sin * k`), "
                    "not the rotated term",
                )
            lead = self._lead(p)
            # a table's size-1 leading dim broadcasts (the kernel's tables do too, `_npu_rotary_fits`)
            if any(
                any(i != at and size != 1 for i, at, size in zip(s[3][:_LEAD], lead, self.tables[s[1]][1].shape))
                for s in mono
            ):
                raise Declined(
                    "a table is read at another position of the leading dims",
                    "nothing in the code can: npu_rotary_mul reads cos and sin at x's own position (broadcast)",
                )
            shapes.append((int(coef), tuple((s[1], s[2]) for s in mono), tuple(s[3][_LEAD:] for s in mono)))
        d = self.d
        per_j = [shapes[j] for j in range(d)]
        if any(shapes[p] != per_j[p % d] for p in range(len(shapes))):
            raise Declined(
                "a kernel table differs along the leading dims",
                "nothing in the code can: npu_rotary_mul applies one cos and one sin entry per head-dim element, "
                "broadcast alike over the leading dims",
            )
        uniform = self._part(per_j, list(range(d)))
        if uniform is not None:
            return uniform
        parts = [self._part([per_j[j] for j in range(r, d, 2)], list(range(r, d, 2))) for r in (0, 1)]
        if None in parts:
            raise Declined(
                "a kernel table cannot be built from the code's tables by repeating them",
                "nothing in the code can: the only kernel tables the branch builds are the code's tables, negated or "
                "repeated along the head dim (`cat((t, t), -1)`, `repeat_interleave(2, -1)`), and this rotation "
                "needs others",
            )
        stacked = ast.Call(
            ast.Attribute(ast.Name("torch", ast.Load()), "stack", ast.Load()),
            [ast.Tuple([p[0] for p in parts], ast.Load())],
            [ast.keyword("dim", _int(-1))],
        )
        return ast.Call(ast.Attribute(stacked, "flatten", ast.Load()), [_int(-2)], []), False

    def _lead(self, p: int) -> tuple[int, ...]:
        lead, index = [], p // self.d
        for size in reversed(SHAPES[0][:_LEAD]):
            index, at = divmod(index, size)
            lead.append(at)
        return tuple(reversed(lead))

    def _part(self, shapes: list, js: list[int]) -> tuple[ast.expr, bool] | None:
        """The table over the elements `js` when its entries have one shape there."""
        if any(s[:2] != shapes[0][:2] for s in shapes):
            return None
        sign, factors = shapes[0][:2]
        built = []
        for at, (number, part) in enumerate(factors):
            factor = self._factor(number, part, [s[2][at] for s in shapes], len(js) == self.d)
            if factor is None:
                return None
            node = self.tables[number][0]
            built.append(((getattr(node, "lineno", 0), getattr(node, "col_offset", 0), at), factor))
        built = [factor for _, factor in sorted(built, key=lambda item: item[0])]
        expr = built[0]
        for other in built[1:]:
            expr = ast.BinOp(expr, ast.Mult(), other)
        if sign < 0:
            expr = ast.UnaryOp(ast.USub(), expr)
            # negating a number would pass the guard and fail in the kernel: checked to be a tensor
            for number, _ in factors:
                if not any(s is self.tables[number][0] for s in self.sources):
                    self.sources.append(self.tables[number][0])
        return expr, len(built) > 1

    def _factor(self, number: int, part: str, trails: list[tuple[int, ...]], every: bool) -> ast.expr | None:
        node, tensor = self.tables[number]
        trailing = tensor.shape[_LEAD:]
        if not trailing:
            return None
        expr: ast.expr = node
        if part:
            expr = ast.Attribute(expr, "real" if part == "re" else "imag", ast.Load())
        fixed = [trails[0][k] for k in range(1, len(trailing))]
        if any(t[1:] != tuple(fixed) for t in trails):
            return None
        if fixed:
            expr = ast.Subscript(
                expr, ast.Tuple([ast.Constant(Ellipsis), *(_int(f) for f in fixed)], ast.Load()), ast.Load()
            )
        index, size, d = [t[0] for t in trails], trailing[0], self.d
        if len(trailing) > 1 and not any(n is node for n, _ in self.shapes):
            names = {d: "d", d // 2: "d // 2"}
            self.shapes.append((node, tuple(names.get(t, str(t)) for t in trailing)))
        wrapped = expr is not node
        if every and size == d and index == list(range(d)):
            result = expr
        elif every and size == d // 2 and index == [j % size for j in range(d)]:
            result = ast.Call(ast.Attribute(expr, "tile", ast.Load()), [ast.Tuple([_int(2)], ast.Load())], [])
            wrapped = True
        elif every and size == d // 2 and index == [j // 2 for j in range(d)]:
            result = ast.Call(
                ast.Attribute(expr, "repeat_interleave", ast.Load()), [_int(2)], [ast.keyword("dim", _int(-1))]
            )
            wrapped = True
        elif not every and size == d // 2 and index == list(range(d // 2)):
            result, wrapped = expr, True
        else:
            return None
        if wrapped and not any(s is node for s in self.sources):
            self.sources.append(node)
        return result


def _int(value: int) -> ast.expr:
    return ast.UnaryOp(ast.USub(), ast.Constant(-value)) if value < 0 else ast.Constant(value)


def _result(evaluation: Evaluation, node: ast.expr, shape: tuple[int, ...]) -> Tensor:
    out = evaluation.run(node)
    if not isinstance(out, Tensor):
        raise Unknown("not a tensor")
    if out.shape != shape or out.is_complex:
        raise Unknown(f"a result of shape {out.shape}, not x's")
    if evaluation.downcast:
        raise Unknown("casts back inside")
    return out


def _hypotheses(evaluation: Evaluation) -> list[dict]:
    """Other shapes for the tables that met a tensor with size-1 trailing dims: a table can broadcast
    into one (a 2x2 rotation per pair times x's pairs as (..., 1, 2))."""
    grown = {}
    for key, (shape, is_complex) in evaluation.met.items():
        if 1 in shape[_LEAD:]:
            grown[key] = (shape[:_LEAD] + tuple(2 if s == 1 else s for s in shape[_LEAD:]), is_complex)
    # All of them at once: the parts of one table (`rot[..., 0]`, `rot[..., 1]`) have one shape. Which
    # shape holds is checked at run time (`Meaning.shapes`).
    return [grown] if grown else []


def meaning(node: ast.expr, x: ast.expr, qualname, structure: Structure | None = None) -> Meaning | None:
    """What `node` computes with `x` as the rotated tensor, when it is `npu_rotary_mul`'s; None when it is
    not read (an op the evaluator does not know, not x's shape); Declined when it is close but not equal."""
    results = []
    for shape in SHAPES:
        failures: list[str] = []
        found = _at(node, x, shape, qualname, structure, failures)
        if found is None:
            # Read again only where the first run stopped at a shape (every candidate of every function goes
            # through here: an unknown call stops the other runs as early, at their cost)
            if not results and failures and failures[0] in _NOT_4D:
                _three_d(node, x, qualname, structure)
            if not results and failures and failures[0] in _SIZE_NOT_KNOWN:
                _guessed_sizes(node, x, qualname, structure)
            if not results and failures and failures[0] == CAST_NOT_KNOWN:
                _kept_cast(node, x, qualname, structure)
            return None
        results.append(found)
    found = _agree(results)
    if found is not None:
        _arithmetic_complex_table(found)
    return found


#: Methods that give a view of their receiver, in its dtype: a complex table read through them is the
#: table the code computes.
_VIEWS = frozenset({"view", "reshape", "unsqueeze", "squeeze", "expand", "contiguous", "detach", "flatten", "to"})


def _arithmetic_complex_table(found: Meaning) -> None:
    """Declined when a kernel table reads the parts of a complex table the code computes by arithmetic on
    tables (audiocraft's `rotation * decay * scale + (1 - scale)`): the product with it is x rotated and
    scaled, or mixed with x itself, as the evaluator reads it (the table's meaning, whatever its names);
    its parts are not known to be a cos and a sin, and whether it is complex at all (`.imag` of a real
    table raises) cannot be checked before the branch reads it."""
    for table in (found.cos, found.sin):
        for node in ast.walk(table):
            if not (isinstance(node, ast.Attribute) and node.attr in ("real", "imag")):
                continue
            base = node.value
            while isinstance(base, ast.Subscript) or (
                isinstance(base, ast.Call) and isinstance(base.func, ast.Attribute) and base.func.attr in _VIEWS
            ):
                base = base.value if isinstance(base, ast.Subscript) else base.func.value
            if not isinstance(base, ast.BinOp):
                continue
            shifted = isinstance(base.op, (ast.Add, ast.Sub))
            scaled = not shifted or (isinstance(base.left, ast.BinOp) and isinstance(base.left.op, (ast.Mult, ast.Div)))
            kind = " and ".join(k for k, on in (("scaled", scaled), ("shifted", shifted)) if on)
            right = ast.unparse(base.right)
            right = f"({right})" if isinstance(base.right, ast.BinOp) else right
            term = f" (`{'+' if isinstance(base.op, ast.Add) else '-'} {right}`)" if shifted else ""
            raise Declined(
                f"the complex table `{ast.unparse(base)}` is a table {kind}{term} by arithmetic in the code, not a "
                "rotation alone: its real and imaginary parts are not known to be a cos and a sin (npu_rotary_mul "
                "expects its tables in [-1, 1]), and whether it is complex cannot be checked before the branch reads "
                "its imaginary part",
                "to fuse it, multiply by the rotation table alone (one passed in, or a view of one) in a function of "
                "its own, and apply the scale and the shift outside it (`x * (r * s + c)` is `(x * r) * s + x * c`), "
                "if that is what it computes",
                differs=False,
            )


def _kept_cast(node: ast.expr, x: ast.expr, qualname, structure: Structure | None) -> None:
    """Declined when `node` rotates x as the kernel does once a cast to a dtype the code reads from
    elsewhere (audiocraft's `x.to(self.dtype)`) is read as keeping the dtype: what differs first, where
    the run then finds it (a table computed by arithmetic), else the cast the run does not know."""
    results = []
    for shape in SHAPES:
        evaluation = Evaluation(x, x_tensor(shape), qualname, structure=structure)
        evaluation.keep_cast = True
        try:
            found = _solve(evaluation, _result(evaluation, node, shape), shape[-1])
        except Declined:
            raise
        except Exception:  # noqa: BLE001 (not read even so: nothing to say)
            return
        if found is None or not evaluation.kept_casts:
            return
        results.append(found)
    found = _agree(results)
    if found is None:
        return
    _arithmetic_complex_table(found)
    names = ", ".join(f"`{ast.unparse(c)}`" for c in evaluation.kept_casts)
    raise Declined(
        f"x is cast to the dtype {names}, which is not known here (npu_rotary_mul takes fp16, bf16 and fp32, "
        "and the branch must compute in the dtype the original does)",
        "to fuse it, cast with a dtype the code names (`x.float()`, `x.to(torch.float32)`), if that is the dtype",
        differs=False,
    )


#: Why a 4-D run of 3-D activations stops (LTX's `x.unflatten(2, (-1, 2))` on a size-1 dim 2), and of a view
#: of x by a size read from an attribute (torchtune's `self.max_num_tiles` in a shape): the other runs'
#: only triggers.
_NOT_4D = frozenset(
    {"shape does not divide", "view_as_complex needs a real last dim of 2", "einops group does not divide"}
)
_SIZE_NOT_KNOWN = frozenset({"a shape that is not numbers", "arithmetic on values that are not tensors"})


def _guessed_sizes(node: ast.expr, x: ast.expr, qualname, structure: Structure | None) -> None:
    """Declined when `node` rotates x as the kernel does once a size it reads from an attribute (torchtune's
    vision `self.max_num_tiles`, which splits the sequence into tiles of a table's length) is taken to be 1:
    what it computes at the other values, the run cannot say, so it is not claimed; the finding says why."""
    for shape in SHAPES:
        evaluation = Evaluation(x, x_tensor(shape), qualname, structure=structure)
        evaluation.guess = 1
        try:
            found = split(coefficients(_result(evaluation, node, shape), shape[-1]), shape[-1])
        except Exception:  # noqa: BLE001 (not read even so: nothing to say)
            return
        if found is None or not evaluation.guessed:
            return
    names = ", ".join(f"`{ast.unparse(g)}`" for g in evaluation.guessed)
    raise Declined(
        f"x is viewed with sizes read from {names}, which are not known here: it rotates as npu_rotary_mul does "
        "where they are 1, and at other values the view regroups x's dims against the tables",
        "to fuse it, rotate x in a 4-D view whose dims the tables broadcast into (for tiles of the sequence, "
        "`x.reshape(-1, tile_len, heads, head_dim)` with a [1, tile_len, 1, head_dim] table), in a function of its own",
        differs=False,
    )


#: x's shapes as 3-D activations [B, S, D] (LTX's `x.unflatten(2, (-1, 2))`, the heads not split off), read
#: only where the 4-D run does not read the expression, to say why it is not fused.
SHAPES_3D = ((2, 3, 8), (2, 3, 12))


def _three_d(node: ast.expr, x: ast.expr, qualname, structure: Structure | None) -> None:
    """Declined when `node` rotates 3-D x [B, S, D] as one head of all D: the kernel takes 4-D x, with a
    head dim below 896 and, interleaved, tables broadcast over the heads, which a [B, S, D] table spanning
    every head's elements is not known to be (LTX's per-head frequencies are not)."""
    modes = set()
    for shape in SHAPES_3D:
        try:
            found = split(
                coefficients(
                    _result(Evaluation(x, x_tensor(shape), qualname, structure=structure), node, shape), shape[-1]
                ),
                shape[-1],
            )
        except Exception:  # noqa: BLE001 (not read, or not a rotation at 3-D: nothing to say)
            return
        if found is None:
            return
        modes.add(found[0])
    if len(modes) == 1:
        raise Declined(
            "x is 3-D [B, S, D], rotated over its whole last dim as one head",
            "to fuse it, rotate x viewed per head as 4-D [B, S, heads, head_dim] (`x.unflatten(2, (heads, -1))`) "
            "with tables that broadcast over the heads, if every head is rotated alike: npu_rotary_mul takes 4-D "
            "x, a head dim below 896 and, interleaved, one table for every head",
            differs=False,
        )


def _at(
    node: ast.expr, x: ast.expr, shape: tuple[int, ...], qualname, structure=None, failures: list | None = None
) -> Meaning | None:
    """What `node` computes at x's `shape`; why the first run read nothing goes to `failures`."""
    evaluation = Evaluation(x, x_tensor(shape), qualname, structure=structure)
    why = None
    try:
        found = _solve(evaluation, _result(evaluation, node, shape), shape[-1])
        if found is not None:
            return _windowed(found, evaluation, x)
    except Declined as error:
        why = error
    except Exception as error:  # noqa: BLE001 (Unknown, or an operation on values it cannot take: not read)
        if failures is not None:
            failures.append(str(error))
    for shapes in _hypotheses(evaluation):
        again = Evaluation(x, x_tensor(shape), qualname, shapes, evaluation.structure)
        try:
            found = _solve(again, _result(again, node, shape), shape[-1])
        except Exception:  # noqa: BLE001 (as above)
            continue
        if found is not None:
            return _windowed(found, again, x)
    if why is not None:
        raise why
    return None


def _windowed(found: Meaning, evaluation: Evaluation, x: ast.expr) -> Meaning:
    if evaluation.width_read:
        found.window = (x.value, x.slice.elts[1].upper)
    return found


def _agree(results: list[Meaning]) -> Meaning | None:
    if len(results) != len(SHAPES):
        return None
    first = results[0]
    for other in results[1:]:
        if (other.mode, ast.dump(other.cos), ast.dump(other.sin)) != (
            first.mode,
            ast.dump(first.cos),
            ast.dump(first.sin),
        ):
            raise Declined(
                "it computes a different rotation at another head dim (a fixed-width slice or repeat)",
                "to fuse it, write the slices and repeats in terms of the head dim (`x.shape[-1] // 2`), if that is "
                "what they mean",
            )
        first.window = first.window or other.window
    return first


def _solve(evaluation: Evaluation, out: Tensor, d: int) -> Meaning | None:
    found = split(coefficients(out, d), d)
    if found is None:
        return None
    mode, cos, sin = found
    tables = {number: (table_node, tensor) for number, table_node, tensor in evaluation.tables.values()}
    builder = _Builder(tables, d)
    cos_expr, cos_product = builder.table(cos)
    sin_expr, sin_product = builder.table(sin)
    products = [
        e
        for e, product in ((cos_expr, cos_product), (sin_expr, sin_product))
        if product or isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult)
    ]
    return Meaning(mode, cos_expr, sin_expr, out.upcast, builder.sources, products, builder.shapes)


def pure_rotation(node: ast.expr, x: ast.expr, qualname, structure: Structure | None = None) -> str | None:
    """The mode when `node` is `rotate(x)` itself (rotate_half or its interleaved form, +-1 throughout)."""
    found = None
    for shape in SHAPES:
        try:
            out = _result(Evaluation(x, x_tensor(shape), qualname, structure=structure), node, shape)
            terms = coefficients(out, shape[-1])
        except Exception:  # noqa: BLE001 (not read, or not linear: no rotation)
            return None
        modes = []
        for mode in ("half", "interleave"):
            ok = True
            for p, term in enumerate(terms):
                partner, sign = _partner(mode, p % shape[-1], shape[-1])
                if term != {partner: {(): sign}}:
                    ok = False
                    break
            if ok:
                modes.append(mode)
        if not modes or found not in (None, modes[0]):
            return None
        found = modes[0]
    return found
