"""An abstract interpreter for tensor expressions: what a folded expression computes, element by element.

A matcher that must know what code *computes*, not how it is spelled, runs the folded expression
(`symbolic.fold`, helpers inlined) on a tiny symbolic tensor: one chosen subexpression is `x`, a
tensor of a small fixed shape whose entries are the symbols `x[i]`; every maximal subexpression that
does not read `x` is a *table*, an opaque tensor whose entries are symbols of its own, shaped when it
first meets a tensor computed from `x` (the shape that broadcasting it there asks for, or a hypothesis
the caller passes in `shapes`). Each entry of a result is a polynomial over those symbols with exact
rational coefficients, complex entries a pair (real, imaginary) of them, so two spellings of one
computation give equal polynomials and a wrong sign, pairing or repeat gives different ones.

Only the operations the class implements are understood (indexing and slicing, `cat` / `stack` /
`unbind` / `chunk` / `split`, `reshape` / `view` / `flatten` / `unflatten` / `unsqueeze` / `transpose` / `permute`,
`flip`, `view_as_complex` / `view_as_real`, products, sums, negation, casts, einops `rearrange`);
anything else raises `Unknown`, and the matcher declines: a computation it cannot read is never
guessed. The interpreter never imports torch.
"""

from __future__ import annotations

import ast
import itertools
import math
import re
from collections.abc import Callable
from fractions import Fraction

#: A monomial: the sorted tuple of its symbols (with repetition). A symbol: ("x", flat index) or
#: ("t", table number, part, index) with part "re" / "im" (a complex table's) or "" (a real one's).
#: Coefficients are ints, or Fractions once something divides: exact either way.
Poly = dict[tuple, "int | Fraction"]


class Unknown(Exception):
    """The expression uses something the interpreter cannot read: nothing about it is claimed."""


def _add(a: Poly, b: Poly, sign: int = 1) -> Poly:
    out = dict(a)
    for mono, coef in b.items():
        value = out.get(mono, 0) + sign * coef
        if value:
            out[mono] = value
        else:
            out.pop(mono, None)
    return out


def _mul(a: Poly, b: Poly) -> Poly:
    out: Poly = {}
    for (ma, ca), (mb, cb) in itertools.product(a.items(), b.items()):
        mono = tuple(sorted(ma + mb))
        value = out.get(mono, 0) + ca * cb
        if value:
            out[mono] = value
        else:
            out.pop(mono, None)
    return out


def _scale(a: Poly, k: Fraction) -> Poly:
    return {m: c * k for m, c in a.items()} if k else {}


#: An entry: (real part, imaginary part or None for a real tensor).
Entry = tuple[Poly, "Poly | None"]


class Tensor:
    """A symbolic tensor: a shape, its entries in row-major order, whether it is complex, and whether it
    was upcast to float32 on the way (`upcast`: what the rewrite must reproduce)."""

    def __init__(self, shape: tuple[int, ...], data: list[Entry], is_complex: bool = False, upcast: bool = False):
        if math.prod(shape) != len(data):
            raise Unknown("shape and data disagree")
        self.shape, self.data, self.is_complex, self.upcast = tuple(shape), data, is_complex, upcast
        self._strides: list[int] | None = None

    def like(self, shape, data, is_complex=None) -> Tensor:
        return Tensor(shape, data, self.is_complex if is_complex is None else is_complex, self.upcast)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dim(self, d: int) -> int:
        if not -self.ndim <= d < self.ndim:
            raise Unknown(f"dim {d} out of range")
        return d % self.ndim

    def strides(self) -> list[int]:
        if self._strides is None:
            out, step = [], 1
            for size in reversed(self.shape):
                out.append(step)
                step *= size
            self._strides = out[::-1]
        return self._strides

    def at(self, index: tuple[int, ...]) -> Entry:
        return self.data[sum(i * s for i, s in zip(index, self.strides()))]

    # -- shape operations ------------------------------------------------------------------------
    def reshape(self, shape: tuple[int, ...]) -> Tensor:
        shape = list(shape)
        if shape.count(-1) > 1:
            raise Unknown("two -1 in a shape")
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            if not known or len(self.data) % known:
                raise Unknown("shape does not divide")
            shape[shape.index(-1)] = len(self.data) // known
        if math.prod(shape) != len(self.data):
            raise Unknown(f"cannot reshape {self.shape} to {tuple(shape)}")
        return self.like(tuple(shape), self.data)

    def flatten(self, start: int = 0, end: int = -1) -> Tensor:
        if self.ndim == 0:
            return self.reshape((1,))
        start, end = self.dim(start), self.dim(end)
        return self.reshape((*self.shape[:start], -1, *self.shape[end + 1 :]))

    def unflatten(self, d: int, sizes: tuple[int, ...]) -> Tensor:
        """Dim `d` split into `sizes` (one of them may be -1), as `torch.unflatten`."""
        d = self.dim(d)
        return self.reshape((*self.shape[:d], *sizes, *self.shape[d + 1 :]))

    def unsqueeze(self, d: int) -> Tensor:
        d = d if d >= 0 else d + self.ndim + 1
        if not 0 <= d <= self.ndim:
            raise Unknown("unsqueeze out of range")
        return self.reshape((*self.shape[:d], 1, *self.shape[d:]))

    def permute(self, order: tuple[int, ...]) -> Tensor:
        order = tuple(self.dim(d) for d in order)
        if sorted(order) != list(range(self.ndim)):
            raise Unknown("not a permutation")
        shape = tuple(self.shape[d] for d in order)
        data = []
        for index in itertools.product(*(range(s) for s in shape)):
            source = [0] * self.ndim
            for at, d in enumerate(order):
                source[d] = index[at]
            data.append(self.at(tuple(source)))
        return self.like(shape, data)

    def transpose(self, a: int, b: int) -> Tensor:
        order = list(range(self.ndim))
        a, b = self.dim(a), self.dim(b)
        order[a], order[b] = order[b], order[a]
        return self.permute(tuple(order))

    def getitem(self, index) -> Tensor:
        items = list(index) if isinstance(index, tuple) else [index]
        if sum(i is Ellipsis for i in items) > 1:
            raise Unknown("two ellipses")
        used = sum(1 for i in items if i is not None and i is not Ellipsis)
        if Ellipsis in items:
            at = items.index(Ellipsis)
            items[at : at + 1] = [slice(None)] * (self.ndim - used)
        items += [slice(None)] * (self.ndim - sum(1 for i in items if i is not None))
        if sum(1 for i in items if i is not None) != self.ndim:
            raise Unknown("too many indices")
        shape, picks, dim = [], [], 0
        for item in items:
            if item is None:
                shape.append(1)
                picks.append(None)
                continue
            size = self.shape[dim]
            if isinstance(item, bool) or not isinstance(item, (int, slice)):
                raise Unknown("advanced indexing")
            if isinstance(item, int):
                if not -size <= item < size:
                    raise Unknown("index out of range")
                picks.append([item % size])
            else:
                chosen = list(range(size))[item]
                shape.append(len(chosen))
                picks.append(chosen)
            dim += 1
        real = [p for p in picks if p is not None]
        data = [self.at(tuple(source)) for source in itertools.product(*real)]
        return self.like(tuple(shape), data)

    def flip(self, dims) -> Tensor:
        dims = {self.dim(d) for d in dims}
        index = tuple(slice(None, None, -1) if d in dims else slice(None) for d in range(self.ndim))
        return self.getitem(index)

    def unbind(self, d: int) -> tuple[Tensor, ...]:
        d = self.dim(d)
        return tuple(self.getitem((slice(None),) * d + (i,)) for i in range(self.shape[d]))

    def split(self, sizes: list[int], d: int) -> tuple[Tensor, ...]:
        d = self.dim(d)
        if sum(sizes) != self.shape[d] or any(s < 0 for s in sizes):
            raise Unknown("split sizes do not add up")
        parts, start = [], 0
        for size in sizes:
            parts.append(self.getitem((slice(None),) * d + (slice(start, start + size),)))
            start += size
        return tuple(parts)

    def chunk(self, n: int, d: int) -> tuple[Tensor, ...]:
        size = self.shape[self.dim(d)]
        step = -(-size // n)
        sizes = [min(step, size - s) for s in range(0, size, step)]
        return self.split(sizes, d)

    # -- values ------------------------------------------------------------------------------------
    def entrywise(self, fn: Callable[[Entry], Entry]) -> Tensor:
        return self.like(self.shape, [fn(e) for e in self.data])

    def negate(self) -> Tensor:
        return self.entrywise(lambda e: (_scale(e[0], -1), None if e[1] is None else _scale(e[1], -1)))

    def scaled(self, k: Fraction) -> Tensor:
        return self.entrywise(lambda e: (_scale(e[0], k), None if e[1] is None else _scale(e[1], k)))

    def part(self, imaginary: bool) -> Tensor:
        if not self.is_complex:
            raise Unknown("real/imag of a real tensor")
        return Tensor(self.shape, [(e[1] if imaginary else e[0], None) for e in self.data], False, self.upcast)


def broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for x, y in itertools.zip_longest(reversed(a), reversed(b), fillvalue=1):
        if x != y and 1 not in (x, y):
            raise Unknown(f"shapes {a} and {b} do not broadcast")
        out.append(max(x, y))
    return tuple(reversed(out))


def _expand(t: Tensor, shape: tuple[int, ...]) -> list[Entry]:
    if t.shape == shape:
        return t.data
    lead = len(shape) - t.ndim
    # each output dim's stride in t's data: 0 where t broadcasts (a missing or size-1 dim)
    steps = [0] * lead + [0 if size == 1 else step for size, step in zip(t.shape, t.strides())]
    return [t.data[sum(i * s for i, s in zip(index, steps))] for index in itertools.product(*(range(s) for s in shape))]


def _entry_op(op: str, a: Entry, b: Entry) -> Entry:
    (ar, ai), (br, bi) = a, b
    if op in ("+", "-"):
        sign = 1 if op == "+" else -1
        if ai is None and bi is None:
            return _add(ar, br, sign), None
        return _add(ar, br, sign), _add(ai or {}, bi or {}, sign)
    # complex product (a_r + i a_i)(b_r + i b_i)
    if ai is None and bi is None:
        return _mul(ar, br), None
    ai, bi = ai or {}, bi or {}
    return _add(_mul(ar, br), _mul(ai, bi), -1), _add(_mul(ar, bi), _mul(ai, br))


def binary(op: str, a: Tensor, b: Tensor) -> Tensor:
    shape = broadcast_shape(a.shape, b.shape)
    left, right = _expand(a, shape), _expand(b, shape)
    is_complex = a.is_complex or b.is_complex
    data = [_entry_op(op, x, y) for x, y in zip(left, right)]
    return Tensor(shape, data, is_complex, a.upcast or b.upcast)


def cat(tensors: list[Tensor], d: int) -> Tensor:
    if not tensors or any(t.ndim != tensors[0].ndim for t in tensors):
        raise Unknown("cat of tensors of different ranks")
    d = tensors[0].dim(d)
    for t in tensors:
        if t.shape[:d] + t.shape[d + 1 :] != tensors[0].shape[:d] + tensors[0].shape[d + 1 :]:
            raise Unknown("cat of mismatched shapes")
        if t.is_complex != tensors[0].is_complex:
            raise Unknown("cat of real and complex")
    shape = list(tensors[0].shape)
    shape[d] = sum(t.shape[d] for t in tensors)
    data = []
    outer = math.prod(shape[:d])
    for o in range(outer):
        for t in tensors:
            block = math.prod(t.shape[d:])
            data.extend(t.data[o * block : (o + 1) * block])
    return Tensor(tuple(shape), data, tensors[0].is_complex, any(t.upcast for t in tensors))


def stack(tensors: list[Tensor], d: int) -> Tensor:
    if not tensors:
        raise Unknown("stack of nothing")
    d = d if d >= 0 else d + tensors[0].ndim + 1
    return cat([t.unsqueeze(d) for t in tensors], d)


def view_as_complex(t: Tensor) -> Tensor:
    if t.is_complex or not t.shape or t.shape[-1] != 2:
        raise Unknown("view_as_complex needs a real last dim of 2")
    pairs = [(t.data[i][0], t.data[i + 1][0]) for i in range(0, len(t.data), 2)]
    return Tensor(t.shape[:-1], pairs, True, t.upcast)


def view_as_real(t: Tensor) -> Tensor:
    if not t.is_complex:
        raise Unknown("view_as_real of a real tensor")
    data = [part for re_, im in t.data for part in ((re_, None), (im or {}, None))]
    return Tensor((*t.shape, 2), data, False, t.upcast)


# -- einops ------------------------------------------------------------------------------------------
_TOKEN = re.compile(r"\.\.\.|\(|\)|\w+")


def _parse_side(text: str) -> list:
    items, group = [], None
    for token in _TOKEN.findall(text):
        if token == "(":
            if group is not None:
                raise Unknown("nested einops groups")
            group = []
        elif token == ")":
            if group is None:
                raise Unknown("unbalanced einops pattern")
            items.append(tuple(group))
            group = None
        elif group is not None:
            group.append(token)
        else:
            items.append(token)
    if group is not None or re.sub(r"\.\.\.|[()\w\s]", "", text):
        raise Unknown("einops pattern not understood")
    return items


def rearrange(t: Tensor, pattern: str, sizes: dict[str, int]) -> Tensor:
    """einops.rearrange for axis names, `...` and one level of groups (no anonymous or numeric axes)."""
    if "->" not in pattern:
        raise Unknown("einops pattern without ->")
    left, right = (_parse_side(side) for side in pattern.split("->"))
    flat = lambda side: [n for item in side for n in (item if isinstance(item, tuple) else (item,))]  # noqa: E731
    if sorted(flat(left)) != sorted(flat(right)) or len(set(flat(left))) != len(flat(left)):
        raise Unknown("einops axes differ")
    if any(n.isdigit() for n in flat(left)):
        raise Unknown("numeric einops axes")
    named = [i for i in left if i != "..."]
    if len(named) > t.ndim or ("..." not in left and len(named) != t.ndim):
        raise Unknown("einops rank mismatch")
    ellipsis = t.ndim - len(named)
    axes, elementary, dim = dict(sizes), [], 0
    for item in left:
        if item == "...":
            for k in range(ellipsis):
                axes[f"...{k}"] = t.shape[dim]
                elementary.append(f"...{k}")
                dim += 1
            continue
        group = item if isinstance(item, tuple) else (item,)
        unknown = [n for n in group if n not in axes]
        known = math.prod(axes[n] for n in group if n in axes)
        if len(unknown) > 1 or (not unknown and known != t.shape[dim]):
            raise Unknown("einops sizes undetermined")
        if unknown:
            if not known or t.shape[dim] % known:
                raise Unknown("einops group does not divide")
            axes[unknown[0]] = t.shape[dim] // known
        elementary.extend(group)
        dim += 1
    split = t.reshape(tuple(axes[n] for n in elementary))
    order = []
    for item in right:
        if item == "...":
            order.extend(f"...{k}" for k in range(ellipsis))
        else:
            order.extend(item if isinstance(item, tuple) else (item,))
    moved = split.permute(tuple(elementary.index(n) for n in order))
    shape = []
    for item in right:
        if item == "...":
            shape.extend(axes[f"...{k}"] for k in range(ellipsis))
        else:
            shape.append(math.prod(axes[n] for n in (item if isinstance(item, tuple) else (item,))))
    return moved.reshape(tuple(shape))


# -- the interpreter -----------------------------------------------------------------------------------
class DType:
    """A dtype value: float32 (`upcast`), or the dtype of x / of a tensor that was not upcast."""

    def __init__(self, upcast: bool) -> None:
        self.upcast = upcast


_FLOAT32 = ("torch.float32", "torch.float")
_NARROW = ("torch.float16", "torch.half", "torch.bfloat16")
_CASTS = ("float", "double", "half", "bfloat16", "to", "type", "type_as")


class Structure:
    """Structural identity of `ast` nodes: one number per `ast.dump`, each node's computed once from its
    children's (a dump per node would make the runs quadratic in the expression's size). One instance is
    shared by the runs over one expression, whose table keys it numbers."""

    def __init__(self) -> None:
        self._numbers: dict[tuple, int] = {}
        self._memo: dict[int, tuple[int, ast.AST]] = {}  # the node kept alive: its id stays its own

    def of(self, node: ast.AST) -> int:
        found = self._memo.get(id(node))
        if found is not None:
            return found[0]
        parts: list = [type(node).__name__]
        for _, value in ast.iter_fields(node):
            if isinstance(value, ast.AST):
                parts.append(self.of(value))
            elif isinstance(value, list):
                parts.append(tuple(self.of(v) if isinstance(v, ast.AST) else (type(v).__name__, v) for v in value))
            else:
                parts.append((type(value).__name__, value))
        number = self._numbers.setdefault(tuple(parts), len(self._numbers))
        self._memo[id(node)] = (number, node)
        return number


class Sizes:
    """The tensor x is a last-dim window of (`Evaluation.base_key`): only its sizes are known, and of them
    only the leading ones (x's); its last size, which the window may be narrower than, is `Unknown`."""

    def __init__(self, leading: tuple[int, ...]) -> None:
        self.leading = leading
        self.ndim = len(leading) + 1

    @property
    def shape(self) -> tuple:
        return _PartialShape(self.leading)

    def size(self, d: int | None = None):
        if d is None:
            return self.shape
        if not -self.ndim <= d < self.ndim:
            raise Unknown(f"dim {d} out of range")
        if d % self.ndim == self.ndim - 1:
            raise Unknown("the last size of the tensor x is a window of")
        return self.leading[d % self.ndim]


class _PartialShape(tuple):
    """A shape whose last entry is not known: indexing it there, or unpacking it whole, is `Unknown`."""

    def __new__(cls, leading: tuple[int, ...]):
        return super().__new__(cls, leading)

    def __getitem__(self, index):
        if isinstance(index, int) and not isinstance(index, bool):
            if index in (len(self), -1):
                raise Unknown("the last size of the tensor x is a window of")
            if index < -1:
                index += 1  # counted from the end of the full shape
        elif isinstance(index, slice) and index == slice(None, -1, None):
            return tuple.__getitem__(self, slice(None))
        else:
            raise Unknown("a slice of a shape whose last size is not known")
        return tuple.__getitem__(self, index)

    def __iter__(self):
        raise Unknown("the last size of the tensor x is a window of")


def _window(x: ast.expr, key: Callable[[ast.AST], int]) -> tuple[int | None, int | None]:
    """(the key of `base`, of `width`) when `x` is `base[..., :width]`, a window of the last dim from 0."""
    if not (isinstance(x, ast.Subscript) and isinstance(x.slice, ast.Tuple) and len(x.slice.elts) == 2):
        return None, None
    ellipsis, window = x.slice.elts
    if not (isinstance(ellipsis, ast.Constant) and ellipsis.value is Ellipsis and isinstance(window, ast.Slice)):
        return None, None
    if window.lower is not None or window.step is not None or window.upper is None:
        return None, None
    if isinstance(window.upper, ast.Constant):
        return None, None  # a literal width is a number already: nothing to learn from the window
    return key(x.value), key(window.upper)


def _moved(x: ast.expr, ndim: int) -> tuple[int, ...] | None:
    """The order that moves x's dims back where `base` has them, when x is `base.permute(order)` or
    `base.transpose(a, b)` with literal dims (x's rank `ndim`)."""
    if not (isinstance(x, ast.Call) and isinstance(x.func, ast.Attribute) and not x.keywords):
        return None
    try:
        dims = [ast.literal_eval(a) for a in x.args]
    except ValueError:
        return None
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = list(dims[0])
    if not all(isinstance(d, int) and not isinstance(d, bool) and -ndim <= d < ndim for d in dims):
        return None
    dims = [d % ndim for d in dims]
    if x.func.attr == "transpose" and len(dims) == 2:
        order = list(range(ndim))
        order[dims[0]], order[dims[1]] = order[dims[1]], order[dims[0]]
        return tuple(order)
    if x.func.attr == "permute" and sorted(dims) == list(range(ndim)):
        inverse = [0] * ndim
        for at, d in enumerate(dims):
            inverse[d] = at
        return tuple(inverse)
    return None


class Table:
    """A subexpression that does not read x: an opaque tensor, shaped where it first meets one of x."""

    def __init__(self, node: ast.expr, key: int, negated: bool = False) -> None:
        self.node, self.key, self.negated = node, key, negated


def _symbols(number: int, shape: tuple[int, ...], is_complex: bool) -> list[Entry]:
    data: list[Entry] = []
    for index in itertools.product(*(range(s) for s in shape)):
        if is_complex:
            data.append(({(("t", number, "re", index),): 1}, {(("t", number, "im", index),): 1}))
        else:
            data.append(({(("t", number, "", index),): 1}, None))
    return data


def x_tensor(shape: tuple[int, ...]) -> Tensor:
    return Tensor(shape, [({(("x", i),): 1}, None) for i in range(math.prod(shape))])


class Evaluation:
    """One run of `expr` with the subexpressions equal to `x` (structurally) bound to `X`.

    `shapes`: table key -> (shape, complex) hypotheses, overriding the shape a table takes from the
    tensor it first meets. After the run, `tables` holds each table (key -> (number, node, tensor)),
    `met` the shape of the tensor each met first, `downcast` whether an upcast tensor was cast back
    inside the expression."""

    def __init__(
        self,
        x: ast.expr,
        X: Tensor,
        qualname: Callable[[ast.expr], str | None],
        shapes: dict[int, tuple[tuple[int, ...], bool]] | None = None,
        structure: Structure | None = None,
    ) -> None:
        self.structure = Structure() if structure is None else structure
        self.key = self.structure.of
        self.x_key, self.X, self.qualname = self.key(x), X, qualname
        #: When x is a window of the last dim of a tensor, `base[..., :width]` (partial rotary, the width
        #: read from the tables, `rope_cache.shape[-2] * 2`): the base's key, whose leading sizes are x's
        #: (`base.size(0)`, `base.shape[:-1]`), and the width's, which is x's last size. Nothing else of the
        #: base is known: its last size, or any of its elements, raises `Unknown`.
        self.base_key, self.width_key = _window(x, self.key)
        #: When x is a view of a tensor with its dims moved, `base.permute(...)` / `base.transpose(a, b)` (a
        #: rotation of another dim than the base's last, Sana-WM's): the base is x with them moved back.
        self.base_order: tuple[int, ...] | None = None
        if self.base_key is None:
            # `rotary_screen.Runs` builds one without a tensor to ask what could run: x as the main runs' 4-D
            order = _moved(x, 4 if X is None else X.ndim)
            if order is not None:
                self.base_key, self.base_order = self.key(x.func.value), order
        self.shapes = shapes or {}
        self.tables: dict[int, tuple[int, ast.expr, Tensor]] = {}
        self.met: dict[int, tuple[tuple[int, ...], bool]] = {}
        self.downcast = False
        #: A size the code reads from an attribute (`self.max_num_tiles`) is no number the run knows: with
        #: `guess` set, it is taken to be that number where a shape or size arithmetic needs one, and noted in
        #: `guessed`. Only to say what a function computes where that holds, never to fuse it.
        self.guess: int | None = None
        self.guessed: list[ast.expr] = []
        #: A cast to a dtype the code reads from elsewhere (audiocraft's `x.to(self.dtype)`) is to no dtype
        #: the run knows: with `keep_cast` set, it is read as keeping the dtype, and noted in `kept_casts`.
        #: Only to say what a function computes, never to fuse it.
        self.keep_cast = False
        self.kept_casts: list[ast.expr] = []
        #: Whether the run read the window's width as x's last size: true where `0 <= width <= base's
        #: last size`, which the branch then checks.
        self.width_read = False
        self._reads_x: dict[int, bool] = {}

    # -- helpers -----------------------------------------------------------------------------------
    def reads_x(self, node: ast.AST) -> bool:
        if id(node) not in self._reads_x:
            found = self.key(node) in (self.x_key, self.base_key, self.width_key) or any(
                self.reads_x(c) for c in ast.iter_child_nodes(node)
            )
            self._reads_x[id(node)] = found
        return self._reads_x[id(node)]

    def materialize(self, table: Table, partner: Tensor) -> Tensor:
        if table.key not in self.tables:
            shape, is_complex = self.shapes.get(table.key, (partner.shape, partner.is_complex))
            tensor = Tensor(shape, _symbols(len(self.tables), shape, is_complex), is_complex)
            self.tables[table.key] = (len(self.tables), table.node, tensor)
            self.met[table.key] = (partner.shape, partner.is_complex)
        tensor = self.tables[table.key][2]
        return tensor.negate() if table.negated else tensor

    def size(self, value):
        """`value`, or `guess` for an attribute read as a size (`Evaluation.guess`)."""
        if (
            self.guess is not None
            and isinstance(value, Table)
            and not value.negated
            and isinstance(value.node, ast.Attribute)
        ):
            if not any(self.key(g) == value.key for g in self.guessed):
                self.guessed.append(value.node)
            return self.guess
        return value

    def tensor(self, value, partner: Tensor | None = None) -> Tensor:
        if isinstance(value, Tensor):
            return value
        if isinstance(value, Table) and partner is not None:
            return self.materialize(value, partner)
        raise Unknown("a tensor was expected")

    # -- expressions -------------------------------------------------------------------------------
    def run(self, node: ast.expr):
        if not self.reads_x(node):
            return self.constant(node)
        if self.key(node) == self.x_key:
            return self.X
        if self.key(node) == self.base_key:
            if self.base_order is not None:
                return self.X.permute(self.base_order)
            return Sizes(self.X.shape[:-1])
        if self.key(node) == self.width_key:
            self.width_read = True  # an assumption the branch checks at run time (`Meaning.window`)
            return self.X.shape[-1]
        if self._sized_table(node):
            # `cache.view(-1, x.size(1), 1, d)[..., :x.size(-1)].to(x.dtype)`: a table given x's sizes or dtype
            return Table(node, self.key(node))
        method = getattr(self, f"_{type(node).__name__}", None)
        if method is None:
            raise Unknown(f"`{type(node).__name__}` is not understood")
        return method(node)

    def _sized_table(self, node: ast.expr) -> bool:
        """Whether `node` is an operation on a table that reads x only for its sizes, dtype or device."""
        base = chain_base(node)
        if base is node or not isinstance(node, (ast.Subscript, ast.Call)):
            return False
        sizes = isinstance(base, ast.Attribute) and base.attr in ("shape", "dtype", "device", "ndim")
        if sizes or self.key(base) in (self.x_key, self.base_key):  # `x.shape[-1]` is a number, not a table
            return False
        return self._only_sizes(node)

    def _only_sizes(self, node: ast.AST) -> bool:
        if self.key(node) in (self.x_key, self.base_key):
            return False
        if self.key(node) == self.width_key:
            return True
        if not self.reads_x(node):
            return True
        if isinstance(node, ast.Attribute) and node.attr in ("shape", "dtype", "device", "ndim"):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("size", "dim"):
            return all(self._only_sizes(a) for a in node.args)
        return all(self._only_sizes(c) for c in ast.iter_child_nodes(node))

    def constant(self, node: ast.expr):
        """A subexpression that does not read x: a Python constant where it is one, else a table."""
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = self.constant(node.operand)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return -value if isinstance(node.op, ast.USub) else value
            if isinstance(value, Table) and isinstance(node.op, ast.USub):
                # `-sin`: the table `sin` negated, so that `x1 * (-sin)` and `x2 * sin` read one table.
                return Table(value.node, value.key, not value.negated)
        if isinstance(node, (ast.Tuple, ast.List)):
            values = [self.constant(e) for e in node.elts]
            if not any(isinstance(v, Table) for v in values):
                return tuple(values)
        if isinstance(node, (ast.Attribute, ast.Name)):
            name = self.qualname(node)
            if name in _FLOAT32:
                return DType(True)
            if name in _NARROW:
                raise Unknown(f"a cast to `{name}`")
        return Table(node, self.key(node))

    def _Tuple(self, node):
        out = []
        for element in node.elts:
            if isinstance(element, ast.Starred):
                out.extend(self.run(element.value))
            else:
                out.append(self.run(element))
        return tuple(out)

    _List = _Tuple

    def _UnaryOp(self, node):
        value = self.run(node.operand)
        if isinstance(node.op, ast.USub):
            if isinstance(value, Tensor):
                return value.negate()
            if isinstance(value, (int, float)):
                return -value
        if isinstance(node.op, ast.UAdd):
            return value
        raise Unknown("unary operator")

    def _BinOp(self, node):
        inner = node.left
        if (
            isinstance(node.op, ast.Mult)
            and isinstance(inner, ast.BinOp)
            and isinstance(inner.op, ast.Mult)
            and not self.reads_x(inner.right)
            and not self.reads_x(node.right)
        ):
            # `rotate(x) * sin * scale` is `rotate(x)` times the table `sin * scale`: one table, as written.
            table = ast.BinOp(inner.right, ast.Mult(), node.right)
            ast.copy_location(table, inner.right)
            self._reads_x[id(table)] = False
            node = ast.BinOp(inner.left, ast.Mult(), table)
            self._reads_x[id(node)] = True
        left, right = self.run(node.left), self.run(node.right)
        if isinstance(left, int) != isinstance(right, int):
            left, right = self.size(left), self.size(right)  # `self.tiles * n`, a size (`Evaluation.guess`)
        if isinstance(left, int) and isinstance(right, int) and not isinstance(left, bool):
            ops = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__, ast.FloorDiv: int.__floordiv__}
            if type(node.op) in ops:
                return ops[type(node.op)](left, right)
        if isinstance(left, tuple) and isinstance(right, tuple) and isinstance(node.op, ast.Add):
            return left + right
        symbol = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*"}.get(type(node.op))
        if isinstance(node.op, ast.Div) and isinstance(left, Tensor) and _number(right):
            return left.scaled(1 / Fraction(str(right)))
        if symbol is None:
            raise Unknown("binary operator")
        if isinstance(left, Tensor) or isinstance(right, Tensor):
            if _number(left) or _number(right):
                tensor, number = (left, right) if isinstance(left, Tensor) else (right, left)
                k = number if isinstance(number, int) else Fraction(str(number))
                if symbol == "*":
                    return tensor.scaled(k)
                constant = tensor.like(tensor.shape, [({(): k}, None) for _ in tensor.data], False)
                first, second = (tensor, constant) if tensor is left else (constant, tensor)
                return binary(symbol, first, second)
            partner = left if isinstance(left, Tensor) else right
            return binary(symbol, self.tensor(left, partner), self.tensor(right, partner))
        raise Unknown("arithmetic on values that are not tensors")

    def _Slice(self, node):
        parts = [None if p is None else self.run(p) for p in (node.lower, node.upper, node.step)]
        if any(p is not None and not isinstance(p, int) for p in parts):
            raise Unknown("a slice bound that is not a number")
        return slice(*parts)

    def index(self, node):
        if isinstance(node, ast.Slice):
            return self._Slice(node)
        if isinstance(node, ast.Tuple):
            return tuple(self.index(e) for e in node.elts)
        value = self.run(node)
        if isinstance(value, Table):
            raise Unknown("an index that is not a number")
        return value

    def _Subscript(self, node):
        value = self.run(node.value)
        index = self.index(node.slice)
        if isinstance(value, (tuple, list)):
            if isinstance(index, (int, slice)) and not isinstance(index, bool):
                return value[index]
            raise Unknown("indexing a sequence")
        if isinstance(value, Tensor):
            return value.getitem(index)
        raise Unknown("indexing a table")

    def _Attribute(self, node):
        value = self.run(node.value)
        if isinstance(value, Sizes) and node.attr in ("shape", "ndim"):
            return value.shape if node.attr == "shape" else len(value.shape)
        if not isinstance(value, Tensor):
            raise Unknown(f"attribute `{node.attr}`")
        if node.attr == "shape":
            return value.shape
        if node.attr == "ndim":
            return value.ndim
        if node.attr == "dtype":
            return DType(value.upcast)
        if node.attr in ("real", "imag"):
            return value.part(node.attr == "imag")
        if node.attr == "device":
            return "device"
        raise Unknown(f"attribute `{node.attr}`")

    def _Call(self, node):
        args, keywords = [], {}
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                value = self.run(arg.value)
                if not isinstance(value, tuple):
                    raise Unknown("a starred argument that is not a shape")
                args.extend(value)
            else:
                args.append(self.run(arg))
        for keyword in node.keywords:
            if keyword.arg is None:
                raise Unknown("** arguments")
            keywords[keyword.arg] = self.run(keyword.value)
        func = node.func
        if isinstance(func, ast.Attribute) and self.reads_x(func.value):
            receiver = self.run(func.value)
            if isinstance(receiver, Sizes) and func.attr in ("size", "dim"):
                return receiver.size(*_bind(args, keywords, [("dim", None)])) if func.attr == "size" else receiver.ndim
            if not isinstance(receiver, Tensor):
                raise Unknown(f"`.{func.attr}` of something that is not a tensor")
            return self.method(receiver, func.attr, args, keywords)
        if isinstance(func, ast.Attribute) and func.attr in ("view", "reshape"):
            table = self.constant(func.value)
            if isinstance(table, Table) and not table.negated:
                # a table given x's sizes (`rope.view(-1, xs.size(1), 1, xs.size(3), 2)`): that shape, with
                # a size-1 dim where it leaves one to the table (-1), broadcast as such a dim is
                shape = tuple(1 if s == -1 else s for s in _shape_args(args, keywords))
                return self.materialize(Table(node, self.key(node)), Tensor(shape, [({}, None)] * math.prod(shape)))
        name = self.qualname(func)
        if name is None or name not in _FUNCTIONS:
            raise Unknown(f"a call of `{ast.unparse(func)}`")
        return _FUNCTIONS[name](self, args, keywords)

    def cast(self, t: Tensor, upcast: bool) -> Tensor:
        if t.upcast and not upcast:
            self.downcast = True
        return Tensor(t.shape, t.data, t.is_complex, upcast)

    def method(self, t: Tensor, name: str, args: list, keywords: dict):
        spec = _METHODS.get(name)
        if spec is None:
            raise Unknown(f"the tensor method `.{name}`")
        return spec(self, t, args, keywords)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _bind(args: list, keywords: dict, names: list[tuple[str, object]]) -> list:
    """The arguments by position or keyword, `...` marking a required one."""
    if len(args) > len(names) or set(keywords) - {n for n, _ in names}:
        raise Unknown("unexpected arguments")
    out = []
    for at, (name, default) in enumerate(names):
        if at < len(args):
            if name in keywords:
                raise Unknown("an argument given twice")
            out.append(args[at])
        elif name in keywords:
            out.append(keywords[name])
        elif default is Ellipsis:
            raise Unknown(f"missing `{name}`")
        else:
            out.append(default)
    return out


def _ints(value) -> tuple[int, ...]:
    values = value if isinstance(value, (tuple, list)) else (value,)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise Unknown("a shape that is not numbers")
    return tuple(values)


def _shape_args(args: list, keywords: dict) -> tuple[int, ...]:
    if keywords:
        raise Unknown("keywords in a shape")
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return _ints(args[0])
    return _ints(tuple(args))


def _to(ev: Evaluation, t: Tensor, args: list, keywords: dict) -> Tensor:
    """`.to(dtype)`, `.to(other)`, `.to(device)`, `.to(dtype=...)`, `.type(dtype)`."""
    values = [*args, *(v for k, v in keywords.items() if k in ("dtype", "device", "non_blocking", "copy"))]
    if len(values) != len(args) + len(keywords):
        raise Unknown("`.to` arguments")
    dtypes = [v for v in values if isinstance(v, DType)] + [DType(v.upcast) for v in values if isinstance(v, Tensor)]
    if any(isinstance(v, Table) for v in values) or len(dtypes) > 1:
        if ev.keep_cast and not dtypes:
            ev.kept_casts.extend(v.node for v in values if isinstance(v, Table))
            return t
        raise Unknown(CAST_NOT_KNOWN)
    return ev.cast(t, dtypes[0].upcast) if dtypes else t


#: Why a run stops at a cast to a dtype read from elsewhere (`Evaluation.keep_cast`).
CAST_NOT_KNOWN = "a cast to a dtype that is not known"


def _type_as(ev: Evaluation, t: Tensor, args: list, keywords: dict) -> Tensor:
    (other,) = _bind(args, keywords, [("other", ...)])
    if not isinstance(other, Tensor):
        raise Unknown("`.type_as` of a table")
    return ev.cast(t, other.upcast)


def _split_sizes(t: Tensor, size, d: int) -> list[int]:
    total = t.shape[t.dim(d)]
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return [min(size, total - s) for s in range(0, total, size)]
    return list(_ints(size))


def _flatten_m(ev, t, args, keywords):
    start, end = _bind(args, keywords, [("start_dim", 0), ("end_dim", -1)])
    return t.flatten(start, end)


def _permute_m(ev, t, args, keywords):
    return t.permute(_shape_args(args, keywords))


def _flip_m(ev, t, args, keywords):
    if len(args) > 1:
        return t.flip(_ints(tuple(args)))
    (dims,) = _bind(args, keywords, [("dims", ...)])
    return t.flip(_ints(dims))


def _squeeze_m(ev, t, args, keywords):
    (d,) = _bind(args, keywords, [("dim", ...)])
    d = t.dim(d)
    if t.shape[d] != 1:
        return t
    return t.reshape(t.shape[:d] + t.shape[d + 1 :])


_METHODS: dict[str, Callable] = {
    "float": lambda ev, t, a, k: ev.cast(t, True) if not a and not k else _unknown("`.float` arguments"),
    "double": lambda ev, t, a, k: _unknown("a cast to float64"),
    "half": lambda ev, t, a, k: _unknown("a cast to float16"),
    "bfloat16": lambda ev, t, a, k: _unknown("a cast to bfloat16"),
    "to": _to,
    "type": _to,
    "type_as": _type_as,
    "contiguous": lambda ev, t, a, k: t,
    "clone": lambda ev, t, a, k: t,
    "reshape": lambda ev, t, a, k: t.reshape(_shape_args([ev.size(v) for v in a], k)),
    "view": lambda ev, t, a, k: t.reshape(_shape_args([ev.size(v) for v in a], k)),
    "reshape_as": lambda ev, t, a, k: t.reshape(ev.tensor(_bind(a, k, [("other", ...)])[0]).shape),
    "view_as": lambda ev, t, a, k: t.reshape(ev.tensor(_bind(a, k, [("other", ...)])[0]).shape),
    "flatten": _flatten_m,
    "unsqueeze": lambda ev, t, a, k: t.unsqueeze(*_bind(a, k, [("dim", ...)])),
    "unflatten": lambda ev, t, a, k: (lambda d, sizes: t.unflatten(d, _ints(sizes)))(
        *_bind(a, k, [("dim", ...), ("sizes", ...)])
    ),
    "squeeze": _squeeze_m,
    "transpose": lambda ev, t, a, k: t.transpose(*_bind(a, k, [("dim0", ...), ("dim1", ...)])),
    "permute": _permute_m,
    "flip": _flip_m,
    "unbind": lambda ev, t, a, k: t.unbind(*_bind(a, k, [("dim", 0)])),
    "chunk": lambda ev, t, a, k: (lambda n, d: t.chunk(n, d))(*_bind(a, k, [("chunks", ...), ("dim", 0)])),
    "split": lambda ev, t, a, k: (lambda s, d: t.split(_split_sizes(t, s, d), d))(
        *_bind(a, k, [("split_size", ...), ("dim", 0)])
    ),
    "neg": lambda ev, t, a, k: t.negate(),
    "size": lambda ev, t, a, k: (lambda d: t.shape if d is None else t.shape[t.dim(d)])(*_bind(a, k, [("dim", None)])),
    "dim": lambda ev, t, a, k: t.ndim,
    "mul": lambda ev, t, a, k: binary("*", t, ev.tensor(_bind(a, k, [("other", ...)])[0], t)),
    "add": lambda ev, t, a, k: binary("+", t, ev.tensor(_bind(a, k, [("other", ...)])[0], t)),
    "sub": lambda ev, t, a, k: binary("-", t, ev.tensor(_bind(a, k, [("other", ...)])[0], t)),
}


def _unknown(why: str):
    raise Unknown(why)


def _sequence(ev: Evaluation, value) -> list[Tensor]:
    if not isinstance(value, (tuple, list)) or not all(isinstance(v, Tensor) for v in value):
        raise Unknown("a sequence of tensors was expected")
    return list(value)


def _cat_f(ev, a, k):
    tensors, d = _bind(a, k, [("tensors", ...), ("dim", 0)])
    return cat(_sequence(ev, tensors), d)


def _stack_f(ev, a, k):
    tensors, d = _bind(a, k, [("tensors", ...), ("dim", 0)])
    return stack(_sequence(ev, tensors), d)


def _on_tensor(method: str):
    """`torch.<method>(t, ...)` as `t.<method>(...)`."""

    def call(ev, a, k):
        if not a or not isinstance(a[0], Tensor):
            raise Unknown(f"`torch.{method}` of something that is not a tensor")
        return ev.method(a[0], method, a[1:], k)

    return call


def _rearrange_f(ev, a, k):
    if len(a) != 2 or not isinstance(a[0], Tensor) or not isinstance(a[1], str):
        raise Unknown("einops.rearrange arguments")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in k.values()):
        raise Unknown("einops sizes that are not numbers")
    return rearrange(a[0], a[1], k)


def _binary_f(symbol: str):
    def call(ev, a, k):
        left, right = _bind(a, k, [("input", ...), ("other", ...)])
        partner = left if isinstance(left, Tensor) else right
        if not isinstance(partner, Tensor):
            raise Unknown("arithmetic on tables")
        return binary(symbol, ev.tensor(left, partner), ev.tensor(right, partner))

    return call


_FUNCTIONS: dict[str, Callable] = {
    "torch.cat": _cat_f,
    "torch.concat": _cat_f,
    "torch.concatenate": _cat_f,
    "torch.stack": _stack_f,
    "torch.view_as_complex": lambda ev, a, k: view_as_complex(ev.tensor(_bind(a, k, [("input", ...)])[0])),
    "torch.view_as_real": lambda ev, a, k: view_as_real(ev.tensor(_bind(a, k, [("input", ...)])[0])),
    "torch.mul": _binary_f("*"),
    "torch.add": _binary_f("+"),
    "torch.sub": _binary_f("-"),
    "einops.rearrange": _rearrange_f,
    **{
        f"torch.{name}": _on_tensor(name)
        for name in (
            "flatten",
            "reshape",
            "unbind",
            "chunk",
            "split",
            "flip",
            "neg",
            "unsqueeze",
            "unflatten",
            "squeeze",
            "transpose",
            "permute",
        )
    },
}

#: What the interpreter reads, for a cheap test before an expensive one.
KNOWN_FUNCTIONS = frozenset(_FUNCTIONS)
KNOWN_METHODS = frozenset(_METHODS)


def chain_base(node: ast.expr) -> ast.expr:
    """What a chain of subscripts and method calls starts from: `x` of `x.float()[..., :2].view(-1)`."""
    base = node
    while True:
        if isinstance(base, ast.Subscript):
            base = base.value
        elif isinstance(base, ast.Call) and isinstance(base.func, ast.Attribute):
            base = base.func.value
        else:
            return base
