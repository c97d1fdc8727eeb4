"""NPU704 on hand-written attention: `softmax(q @ k.transpose(-2, -1) * scale + mask) @ v`.

Hand-written attention sits among other code (`repeat_kv` before it, a transpose and a projection after),
and whether its mask is one the kernel can take (0 to keep, -inf or the dtype's lowest to drop) is mostly
known only at run time. So the branch goes in front of the statement that computes the scores, where
everything the attention reads is computed (the repeated kv heads included: no grouping to prove), and
calls `_npu_eager_attention`, which checks the mask and returns None where the kernel would compute
something else; then the original code runs, untouched:

    key_states = repeat_kv(key, groups)
    if _is_npu(query):
        fused_attention = _npu_eager_attention(query, key_states, value_states, mask, None, p, scaling)
        if fused_attention is not None:
            attn_output = fused_attention            # the output statement, the matmul replaced
            return attn_output.transpose(1, 2)       # what follows it, copied
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    ...

The kernel does not compute the probabilities: a function that returns them is fused only where they
are provably not needed (a false `output_attentions` / `need_weights` parameter; callers are no proof:
a subclass or another module may keep them); the branch returns None in their place.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field

from npu_migrate.program.names import local_rebinding
from npu_migrate.transforms.fused.symbolic import (
    Function,
    body_statements,
    evaluated_nodes,
    method_call,
    replace_nodes,
    same,
    source,
    substitute,
    walk_shared,
)

_SOFTMAX = ("torch.softmax", "torch.nn.functional.softmax", "torch.special.softmax")
_SOFTMAX_MODULES = ("torch.nn.Softmax", "torch.nn.modules.activation.Softmax")
#: einops' `einsum(q, k, "b h i d, b h j d -> b h i j")` too (lucidrains' packages): not a layout the branch
#: reads, but attention that deserves a finding saying so rather than silence.
_MATMUL = ("torch.matmul", "torch.bmm", "torch.einsum", "einops.einsum")
_DROPOUT = ("torch.nn.functional.dropout", "torch.dropout")
_DROPOUT_MODULES = ("torch.nn.Dropout", "torch.nn.modules.dropout.Dropout")
SDPA = "torch.nn.functional.scaled_dot_product_attention"
SDPA_WRAPPER = "_npu_sdpa"
#: Parameters whose false value says the caller does not want the probabilities.
WEIGHT_FLAGS = ("output_attentions", "need_weights")
#: The branch's name for the kernel's output.
FUSED = "fused_attention"
#: Methods that compute nothing but a view, a cast or a shape: safe to evaluate again in the branch.
_VIEW_METHODS = frozenset(
    "transpose permute contiguous view reshape size dim float half bfloat16 to type_as unsqueeze squeeze "
    "expand bool logical_not".split()
)
#: Functions the branch may call again: their value depends on their arguments alone (einops' `rearrange` is a
#: view or a copy of its input, laid out anew).
_PURE_FUNCTIONS = ("math.sqrt", "torch.finfo", "einops.rearrange")
_PURE_BUILTINS = ("float", "int", "len", "min", "max")
#: Statements with a body: their own expressions are checked apart from their body's statements.
_COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.Match)
_CASTS = frozenset("float half bfloat16 to type type_as".split())


class Declined(Exception):
    """The function is hand-written attention the kernel cannot be proven to compute; the message says why,
    `remedy` what would let it be fused (`Outcome.remedy`)."""

    def __init__(self, why: str, remedy: str = "") -> None:
        super().__init__(why)
        self.remedy = remedy


class _NotProbabilities(Exception):
    """A matmul whose left operand is not softmax probabilities: not the attention's output."""


# -- is it hand-written attention? --------------------------------------------------------------------


def _is_matmul(node: ast.AST, fn: Function) -> bool:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        return True
    return isinstance(node, ast.Call) and fn.qualname(node.func) in _MATMUL


def _softmax_module(node: ast.AST, fn: Function) -> ast.Call | None:
    """The `nn.Softmax(dim=...)` that `__init__` assigns to `self.<attr>`, for a call `self.<attr>(t)`
    (lucidrains' ViTs: `self.attend = nn.Softmax(dim = -1)`, then `attn = self.attend(dots)`)."""
    if not (
        isinstance(node, ast.Call)
        and len(node.args) == 1
        and not node.keywords
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == fn.self_name
    ):
        return None
    origin = fn.attribute_source(node.func.attr)
    if isinstance(origin, ast.Call) and fn.qualname(origin.func) in _SOFTMAX_MODULES:
        return origin
    return None


def _softmax_input(node: ast.AST, fn: Function) -> ast.expr | None:
    if not isinstance(node, ast.Call):
        return None
    if fn.qualname(node.func) in _SOFTMAX and node.args:
        return node.args[0]
    # before `t.softmax(dim)`: `self.softmax(attn)` (mmpretrain's, timm's swin) calls a module, not a method
    if _softmax_module(node, fn) is not None:
        return node.args[0]
    if isinstance(node.func, ast.Attribute) and node.func.attr == "softmax" and fn.qualname(node.func) is None:
        return node.func.value
    return None


def is_hand_written_attention(fn: Function) -> bool:
    """A softmax over matmul scores, multiplied by a matmul again, in a function that does not call SDPA."""
    # Without a softmax and a matmul somewhere in the function nothing below can hold; most functions
    # of a class that mentions softmax have neither, and the search below walks each statement again
    # and again.
    if not any(_softmax_input(n, fn) is not None for n in fn.nodes) or not any(_is_matmul(n, fn) for n in fn.nodes):
        return False
    # The hand-written fallback of a function that also calls SDPA (`if self.fused_attn: ... else: ...`):
    # that call is the site, wrapped or reported; the fallback is not a second one.
    if any(
        fn.qualname(c.func) == SDPA or (isinstance(c.func, ast.Name) and c.func.id == SDPA_WRAPPER) for c in fn.calls
    ):
        return False
    scores: set[str] = set()  # names bound to something computed from a matmul
    probabilities: set[str] = set()  # names bound to a softmax of scores (or computed from one)
    applied = False  # the probabilities reach a matmul

    def from_scores(node: ast.AST) -> bool:
        return any(_is_matmul(n, fn) or (isinstance(n, ast.Name) and n.id in scores) for n in ast.walk(node))

    def is_probabilities(node: ast.AST) -> bool:
        """A softmax of scores, or computed from one elementwise (dropout, a cast, a head mask): a matmul
        with the probabilities (`attn @ v`) is the attention's output, not probabilities."""
        stack = [node]
        while stack:
            n = stack.pop()
            if _is_matmul(n, fn):
                continue
            if (isinstance(n, ast.Name) and n.id in probabilities) or (
                (inner := _softmax_input(n, fn)) is not None and from_scores(inner)
            ):
                return True
            stack.extend(ast.iter_child_nodes(n))
        return False

    # In the order they run (the walk is breadth-first): a name bound after the softmax (`x = x * gate`,
    # late in a squeeze-excite block) must not make an earlier `softmax(conv(x))` look like one of scores.
    statements = sorted(
        (
            stmt
            for stmt in fn.nodes
            if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.Return)) and stmt.value is not None
        ),
        key=lambda stmt: (stmt.lineno, stmt.col_offset),
    )
    for stmt in statements:
        value = stmt.value
        applied = applied or any(
            _is_matmul(n, fn) and any(is_probabilities(child) for child in ast.iter_child_nodes(n))
            for n in ast.walk(value)
        )
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
        names = {n.id for t in targets if t is not None for n in ast.walk(t) if isinstance(n, ast.Name)}
        if is_probabilities(value):
            probabilities |= names
        elif from_scores(value):
            scores |= names
    return applied


# -- expressions the branch may evaluate again -------------------------------------------------------


def _reevaluable(node: ast.AST | None, fn: Function) -> bool:
    """Names, attributes, constants, subscripts, arithmetic, and views, casts and shapes of them: what
    the branch can evaluate in front of the original code, which evaluates it again if the kernel does not
    run, with no effect but the value."""
    if node is None or isinstance(node, (ast.Name, ast.Constant)):
        return True
    if isinstance(node, ast.Attribute):
        return _reevaluable(node.value, fn)
    if isinstance(node, ast.Subscript):
        return _reevaluable(node.value, fn) and _reevaluable(node.slice, fn)
    if isinstance(node, ast.Slice):
        return all(_reevaluable(part, fn) for part in (node.lower, node.upper, node.step))
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_reevaluable(e, fn) for e in node.elts)
    if isinstance(node, ast.UnaryOp):
        return _reevaluable(node.operand, fn)
    if isinstance(node, ast.BinOp):
        # Not a matmul: the branch would compute what the attention computes, to test or pass it.
        return not isinstance(node.op, ast.MatMult) and _reevaluable(node.left, fn) and _reevaluable(node.right, fn)
    if isinstance(node, ast.Compare):
        return all(_reevaluable(part, fn) for part in (node.left, *node.comparators))
    if isinstance(node, ast.BoolOp):
        return all(_reevaluable(v, fn) for v in node.values)
    if isinstance(node, ast.IfExp):
        return all(_reevaluable(part, fn) for part in (node.test, node.body, node.orelse))
    if isinstance(node, ast.Call):
        pure = (
            fn.qualname(node.func) in _PURE_FUNCTIONS
            or _builtin(node.func, fn) in _PURE_BUILTINS
            or (
                isinstance(node.func, ast.Attribute)
                and node.func.attr in _VIEW_METHODS
                and fn.qualname(node.func) is None
                and _reevaluable(node.func.value, fn)
            )
            or _pure_helper(node.func, fn)
        )
        return (
            pure
            and all(_reevaluable(a, fn) and not isinstance(a, ast.Starred) for a in node.args)
            and all(k.arg is not None and _reevaluable(k.value, fn) for k in node.keywords)
        )
    return False


def _module_helper(func: ast.expr, fn: Function) -> ast.FunctionDef | None:
    """The module-level def a call's name reaches, by Python's scoping (`program.names.local_rebinding`):
    not where the function, or one it is nested in, binds the name itself (a parameter `exists=exists`, a
    local `max_neg_value = self.fill`, an `except ... as`, a closure's own helper), nor for a call with no
    place in the file (built by a rule)."""
    if not isinstance(func, ast.Name) or func.id not in fn.functions or fn.module is None:
        return None
    if getattr(func, "lineno", None) is None:
        return None
    # (`fn.functions` holds only a def the module binds once: the module scope's own binding is that def.)
    at = (func.lineno, func.col_offset)
    if any((s[0], s[1]) <= at < (s[2], s[3]) for s in _hidden(fn.module, func.id)):
        return None
    return fn.functions[func.id]


@functools.lru_cache(maxsize=4)
def _hidden(module: ast.Module, name: str) -> tuple[tuple[int, int, int, int], ...]:
    """Where a local binding hides the module's `name` (`local_rebinding`), once per file and name (trees
    hash by identity; the last few are kept)."""
    return tuple(local_rebinding(module, {name})[1].get(name, ()))


def _pure_helper(func: ast.expr, fn: Function) -> bool:
    """Whether `func` names a function of this module whose body is one `return` of what the branch may
    evaluate again, calling nothing: lucidrains' `exists(val)` (`return val is not None`). Only a def the
    module binds once (`Function.functions`), so the name cannot mean another one at run time."""
    helper = _module_helper(func, fn)
    if helper is None or helper.args.vararg or helper.args.kwarg or helper.decorator_list:
        return False
    body = [s for s in helper.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None:
        return False
    value = body[0].value
    return not any(isinstance(n, ast.Call) for n in ast.walk(value)) and _reevaluable(value, fn)


def _builtin(func: ast.expr, fn: Function) -> str | None:
    """`float` for the builtin `float` (a name the file neither imports nor defines)."""
    if isinstance(func, ast.Name) and fn.qualname(func) is None and func.id not in fn.functions:
        return func.id
    return None


def _lowest_value(node: ast.expr, fn: Function) -> bool:
    """-inf (`float("-inf")`, `-math.inf`, `-torch.inf`) or a dtype's lowest (`torch.finfo(t.dtype).min`,
    or `-torch.finfo(t.dtype).max`, the same number: IEEE floats are symmetric), also as what a helper of
    the module returns (lucidrains' `max_neg_value(t)`)."""
    helper = _module_helper(node.func, fn) if isinstance(node, ast.Call) else None
    if helper is not None and not helper.decorator_list:
        body = [s for s in helper.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
            return not isinstance(body[0].value, ast.Call) and _lowest_value(body[0].value, fn)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = node.operand
        if fn.qualname(inner) in ("math.inf", "torch.inf", "numpy.inf"):
            return True
        if _finfo(inner, "max", fn):
            return True
        return (
            isinstance(inner, ast.Call)
            and _builtin(inner.func, fn) == "float"
            and len(inner.args) == 1
            and isinstance(inner.args[0], ast.Constant)
            and str(inner.args[0].value).lower() in ("inf", "infinity")
        )
    if isinstance(node, ast.Call) and _builtin(node.func, fn) == "float" and len(node.args) == 1:
        return isinstance(node.args[0], ast.Constant) and str(node.args[0].value).lower() in ("-inf", "-infinity")
    return _finfo(node, "min", fn)


def _finfo(node: ast.expr, attr: str, fn: Function) -> bool:
    """`torch.finfo(...).<attr>`."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr == attr
        and isinstance(node.value, ast.Call)
        and fn.qualname(node.value.func) == "torch.finfo"
    )


# -- the parts of the attention -----------------------------------------------------------------------


@dataclass
class Attention:
    """What the kernel needs, as source the branch evaluates."""

    query: ast.expr
    key: ast.expr
    value: ast.expr
    scale: list[tuple[ast.operator, ast.expr]] = field(default_factory=list)
    additive_mask: ast.expr | None = None  # added to the scores: converted at run time, if exact
    masked_out: ast.expr | None = None  # a bool, True where `masked_fill` drops the score
    dropout_p: ast.expr | None = None
    guards: list[str] = field(default_factory=list)
    #: Where the branch is skipped as the scores get a learned bias there: (test, the parameter), for the finding.
    skipped: list[tuple[str, str]] = field(default_factory=list)
    #: The heads are folded into the batch: q, k and v are (batch * heads, seq, dim) (`torch.bmm`, a 3-D
    #: einsum). The kernel gets them as one head each, its output squeezed back to 3-D.
    folded: bool = False

    def scale_source(self) -> str:
        """The kernel's scale: the product of the factors (1 / divisor for a division), 1.0 without one."""
        product: ast.expr | None = None
        for op, factor in self.scale:
            term = factor if isinstance(op, ast.Mult) else ast.BinOp(ast.Constant(1.0), ast.Div(), factor)
            product = term if product is None else ast.BinOp(product, ast.Mult(), term)
        return "1.0" if product is None else source(product)


def _matmul_operands(node: ast.AST, fn: Function) -> tuple[ast.expr, ast.expr] | None:
    """(a, b) of `a @ b` / `torch.matmul(a, b)`, or of an einsum that computes it (`_Einsum`)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        return node.left, node.right
    if not isinstance(node, ast.Call):
        return None
    if fn.qualname(node.func) in ("torch.matmul", "torch.bmm") and len(node.args) == 2 and not node.keywords:
        return node.args[0], node.args[1]
    einsum = _Einsum.read(node, fn)
    return None if einsum is None else (einsum.left(), einsum.arranged(1, einsum.summed, einsum.columns))


@dataclass
class _Einsum:
    """An einsum of two operands that is a matmul over their last two axes once each is arranged as
    (batch, heads, ...): `out[P, rows, columns] = sum(a[P, rows, summed] * b[P, summed, columns])`, the
    leading axes P those of the result, in its order: two named axes (4-D tensors), one (heads folded into
    the batch: 3-D) or `...` (any; the kernel's helper takes 4-D alone and runs the original otherwise). Scores and output of lucidrains' and vit-pytorch's
    attention (`"b h i d, b h j d -> b h i j"`, `"b h i j, b h j d -> b h i d"`), a channel-first layout
    (`"b h d i, b h d j -> b h i j"`), a sequence-first one (`"b i h d, b j h d -> b h i j"`), one shared
    kv head (`"b h i d, b j d -> b h i j"`: the second operand gets a heads axis of 1). torch's
    spelling (`"bhid,bhjd->bhij"`, the equation first) and einops' (axis names between spaces, the equation
    last) alike, the operands either way round. A sum over any other axis, or `...` anywhere but in front,
    is not read."""

    operands: tuple[ast.expr, ast.expr]
    axes: tuple[list[str], list[str]]
    leading: list[str]
    rows: str
    summed: str
    columns: str

    @classmethod
    def read(cls, node: ast.Call, fn: Function) -> _Einsum | None:
        name = fn.qualname(node.func)
        if name not in ("torch.einsum", "einops.einsum") or node.keywords:
            return None
        args = node.args
        equation, operands = (args[0], args[1:]) if name == "torch.einsum" else (args[-1], args[:-1])
        text = _constant_text(equation)
        if text is None or len(operands) != 2 or any(isinstance(o, ast.Starred) for o in operands):
            return None
        if text.count("->") != 1 or text.count(",") != 1:
            return None
        inputs, output = text.split("->")

        def axes(part: str) -> list[str]:
            # `...` is one axis here: any leading dims, the same on every operand (the kernel's helper
            # takes 4-D tensors only, and says None otherwise)
            part = part.replace("...", " … ")
            return part.split() if name == "einops.einsum" else [c for c in part if not c.isspace()]

        a, b, out = (axes(part) for part in (*inputs.split(","), output))
        first, second = operands[0], operands[1]
        # Multi-query attention (PaLM's `"b h i d, b j d -> b h i j"`): k and v share one head, which
        # broadcasts over q's heads as the kernel's grouped-query attention does with one kv head.
        if len(out) == 4 and "…" not in out and len(a) == 4 and len(b) == 3 and b[0] == out[0] and out[1] not in b:
            b = [b[0], out[1], *b[1:]]
            second = _method(second, "unsqueeze", [ast.Constant(1)])
        named = (
            "…" not in a and (all(len(x) == 4 for x in (a, b, out)) or all(len(x) == 3 for x in (a, b, out)))
        ) or all(len(x) == 3 and x[0] == "…" for x in (a, b, out))
        if not named or not all(
            len(set(x)) == len(x) and all(n == "…" or n.isidentifier() for n in x) for x in (a, b, out)
        ):
            return None
        leading, rows, columns = out[:-2], out[-2], out[-1]
        if rows in b and columns in a:  # `einsum("b h j d, b h i d -> b h i j", k, q)`: a product commutes
            a, b, first, second = b, a, second, first
        summed = set(a) - set(out)
        if len(summed) != 1 or set(a) != {*leading, rows, *summed} or set(b) != {*leading, columns, *summed}:
            return None
        return cls((first, second), (a, b), leading, rows, summed.pop(), columns)

    def arranged(self, which: int, *last: str) -> ast.expr:
        """Operand `which` as a (batch, heads, *last) tensor: itself, or a view of it."""
        operand, axes = self.operands[which], self.axes[which]
        order = [axes.index(axis) for axis in (*self.leading, *last)]
        n = len(order)
        if order == list(range(n)):
            return operand
        if order == [*range(n - 2), n - 1, n - 2]:  # one swap: `transpose`, as people write it
            return _method(operand, "transpose", [ast.UnaryOp(ast.USub(), ast.Constant(n)) for n in (2, 1)])
        if order == [0, 2, 1, 3]:
            return _method(operand, "transpose", [ast.Constant(1), ast.Constant(2)])
        return _method(operand, "permute", [ast.Constant(i) for i in order])

    def left(self) -> ast.expr:
        return self.arranged(0, self.rows, self.summed)


def _constant_text(node: ast.expr) -> str | None:
    """The text of a string constant, or of an f-string without placeholders (`f"b h i d, ..."`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and all(isinstance(v, ast.Constant) for v in node.values):
        return "".join(v.value for v in node.values)
    return None


def _method(value: ast.expr, name: str, args: list[ast.expr]) -> ast.Call:
    return ast.Call(ast.Attribute(value, name, ast.Load()), args, [])


def _transposed(node: ast.expr, folded: bool = False) -> ast.expr | None:
    """`k` for `k.transpose(-2, -1)` (either order), `k.transpose(2, 3)` (4-D: the helper checks) or `k.mT`;
    `k.transpose(1, 2)` too for `folded` (3-D) tensors."""
    if isinstance(node, ast.Attribute) and node.attr == "mT":
        return node.value
    call = method_call(node, "transpose")
    if call is None or len(call.args) != 2 or call.keywords:
        return None
    dims = set()
    for arg in call.args:
        if isinstance(arg, ast.UnaryOp) and isinstance(arg.op, ast.USub) and isinstance(arg.operand, ast.Constant):
            dims.add(-arg.operand.value)
        elif isinstance(arg, ast.Constant):
            dims.add(arg.value)
    return call.func.value if dims in ({-1, -2}, {1, 2} if folded else {2, 3}) else None


def _folded(node: ast.AST, fn: Function) -> bool:
    """Whether the matmul `node` multiplies (batch * heads, rows, columns) tensors: `torch.bmm`, or an einsum
    over three named axes."""
    if not isinstance(node, ast.Call):
        return False
    if fn.qualname(node.func) == "torch.bmm":
        return True
    einsum = _Einsum.read(node, fn)
    return einsum is not None and len(einsum.leading) == 1 and einsum.leading[0] != "…"


def _scores_matmul(node: ast.AST, fn: Function) -> tuple[ast.expr, ast.expr] | None:
    """(q, k) for `q @ k.transpose(-2, -1)` or `torch.matmul(q, k.transpose(-2, -1))`, or an einsum that
    computes it (q and k arranged as (batch, heads, seq, dim))."""
    einsum = _Einsum.read(node, fn) if isinstance(node, ast.Call) else None
    if einsum is not None:
        return einsum.left(), einsum.arranged(1, einsum.columns, einsum.summed)
    operands = _matmul_operands(node, fn)
    if operands is None:
        return None
    key = _transposed(operands[1], folded=_folded(node, fn))
    return None if key is None else (operands[0], key)


def _contains_scores(node: ast.AST, fn: Function) -> bool:
    return any(_scores_matmul(n, fn) is not None for n in walk_shared(node))


def _negated(test: ast.expr) -> str:
    """The source of `not test`, `x is None` for `x is not None`."""
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Is, ast.IsNot)):
        flipped = ast.Is() if isinstance(test.ops[0], ast.IsNot) else ast.IsNot()
        return source(ast.Compare(test.left, [flipped], test.comparators))
    return source(ast.UnaryOp(ast.Not(), test))


def _conditional_step(node: ast.IfExp) -> tuple[ast.expr, ast.expr, ast.expr] | None:
    """(step, the value it applies to, the test under which it applies) for `step(x) if test else x` or
    `x if test else step(x)` (the test then negated): an `if test: x = step(x)` folded."""
    for step, skipped, test in (
        (node.body, node.orelse, node.test),
        (node.orelse, node.body, ast.UnaryOp(ast.Not(), node.test)),
    ):
        if any(child is skipped or same(child, skipped) for child in ast.walk(step) if child is not step):
            return step, skipped, test
    return None


def _probabilities(node: ast.expr, fn: Function, attention: Attention) -> ast.expr:
    """The scores under `node`, a softmax of them through dropout and casts; fills in `attention`'s dropout
    and guards. Raises `_NotProbabilities` when `node` is no softmax."""
    while True:
        if isinstance(node, ast.IfExp):
            found = _conditional_step(node)
            if found is None or not _reevaluable(node.test, fn):
                raise _NotProbabilities
            step, skipped, test = found
            dropout = _dropout(step, fn)
            if dropout is not None and dropout[0] is skipped:
                if attention.dropout_p is not None:
                    raise Declined(
                        "it applies dropout twice", remedy="to fuse it, apply dropout once, to the probabilities"
                    )
                attention.dropout_p = ast.IfExp(test, dropout[1], ast.Constant(0.0))
            elif _softmax_input(step, fn) is None:
                # `if head_mask is not None: probs = probs * head_mask`: the kernel has no such step, so the
                # branch runs only where the test is false.
                attention.guards.append(_negated(test))
            else:
                raise _NotProbabilities
            node = skipped
            continue
        dropout = _dropout(node, fn)
        if dropout is not None:
            if attention.dropout_p is not None:
                raise Declined(
                    "it applies dropout twice", remedy="to fuse it, apply dropout once, to the probabilities"
                )
            node, attention.dropout_p = dropout
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _CASTS:
            node = node.func.value
            continue
        scores = _softmax_input(node, fn)
        if scores is None:
            if any(_softmax_input(inner, fn) is not None for inner in ast.walk(node)):
                # The product of the probabilities (talking heads' `proj_w(attn)`), not a matmul elsewhere.
                step = node
                while isinstance(step, ast.Call) and isinstance(step.func, ast.Attribute):
                    if not isinstance(step.func.value, ast.Call):
                        break
                    step = step.func.value  # `self.proj_w(...).permute(...)`: name the call it starts from
                step = f"{source(step.func)}(...)" if isinstance(step, ast.Call) else source(node)
                raise Declined(
                    f"the probabilities go through `{step}` before `@ v`, which the kernel does not",
                    remedy="nothing in the code can: the kernel multiplies the softmax by v directly",
                )
            raise _NotProbabilities
        # `F.softmax(s, dim)`, `s.softmax(dim)`, or `self.attend(s)` with the dim in `nn.Softmax(dim)`: an
        # `nn.Softmax()` without one picks a dim by the input's rank (1 for 4-D scores), never the last here
        call = _softmax_module(node, fn) or node
        if call is not node:
            # `self.attend` is read as the `nn.Softmax` only where nothing else can be bound to it: a
            # method, a branch of `__init__` or a subclass that rebinds it (`nn.Sigmoid()`) would make
            # the branch compute a softmax where the original does not.
            _, why = fn.sole_binding(node.func.attr)
            if why:
                raise Declined(
                    f"{why}, so `{source(node.func)}` may not be the `nn.Softmax`",
                    remedy="to fuse it, call torch.softmax(..., dim=-1) in forward",
                )
        at = 1 if fn.qualname(call.func) in _SOFTMAX else 0
        dim = call.args[at] if len(call.args) > at else next((k.value for k in call.keywords if k.arg == "dim"), None)
        if not (isinstance(dim, ast.UnaryOp) and isinstance(dim.op, ast.USub) and _constant(dim.operand) == 1):
            raise Declined(
                f"the softmax is not over the last dim (`{source(node)}`)",
                remedy="nothing in the code can: the kernel takes the softmax over the keys (last dim)",
            )
        return scores


def _constant(node: ast.expr):
    return node.value if isinstance(node, ast.Constant) else None


def _dropout(node: ast.expr, fn: Function) -> tuple[ast.expr, ast.expr] | None:
    """(its input, the drop probability it applies, as source) for a dropout call, else None."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    name = fn.qualname(node.func)
    if name in _DROPOUT:
        p_at, training_at = (1, 2)
        p = node.args[p_at] if len(node.args) > p_at else next((k.value for k in node.keywords if k.arg == "p"), None)
        keyword = "training" if name != "torch.dropout" else "train"
        training = node.args[training_at] if len(node.args) > training_at else None
        training = training or next((k.value for k in node.keywords if k.arg == keyword), None)
        if name != "torch.dropout":
            p = p or ast.Constant(0.5)  # F.dropout's defaults: p=0.5, training=True
            training = training or ast.Constant(True)
        if p is None or training is None or any(k.arg == "inplace" for k in node.keywords):
            return None
        if _constant(training) is True:
            return node.args[0], p
        if _constant(training) is False:
            return node.args[0], ast.Constant(0.0)
        return node.args[0], ast.IfExp(training, p, ast.Constant(0.0))
    # `self.attn_dropout(probs)`, an `nn.Dropout` that `__init__` creates.
    func = node.func
    if (
        len(node.args) == 1
        and not node.keywords
        and isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == fn.self_name
    ):
        created = fn.attribute_source(func.attr)
        if isinstance(created, ast.Call) and fn.qualname(created.func) in _DROPOUT_MODULES:
            # The branch reads `self.<attr>.p`: another module bound to it (`nn.Identity()` in a method, a
            # branch of `__init__` or a subclass) would make it raise, or drop what the original does not.
            _, why = fn.sole_binding(func.attr)
            if why:
                raise Declined(
                    f"{why}, so `{source(func)}` may not be the `nn.Dropout`",
                    remedy="to fuse it, call torch.nn.functional.dropout(..., self.training) in forward",
                )
            p = ast.Attribute(func, "p", ast.Load())
            return node.args[0], ast.IfExp(ast.Attribute(func, "training", ast.Load()), p, ast.Constant(0.0))
    return None


def _scores(node: ast.expr, fn: Function, attention: Attention) -> None:
    """Fill in `attention` from the scores: `q @ k.transpose(-2, -1)`, scaled, then masked."""
    scaled = False  # a scale was seen (outside in): a mask under it is scaled with the scores
    while True:
        base = _scores_matmul(node, fn)
        if base is not None:
            attention.query, attention.key = base
            if _folded(node, fn) != attention.folded:
                raise Declined(
                    "the scores and the output multiply tensors of different ranks (one folds the heads into"
                    " the batch, the other does not)",
                    remedy="to fuse it, use one layout for both",
                )
            return
        if isinstance(node, ast.IfExp):
            found = _conditional_step(node)
            if found is None or not _reevaluable(node.test, fn):
                raise Declined(
                    f"the scores are chosen by `{source(node.test)}`",
                    remedy="to fuse it, choose between the scores outside the function",
                )
            step, skipped, test = found
            before = (attention.additive_mask, attention.masked_out)
            if _mask_step(step, skipped, fn, attention) is None:
                raise Declined(
                    f"the scores go through `{source(step)}` where `{source(test)}`",
                    remedy="nothing in the code can: the kernel applies no step but a mask",
                )
            # A mask applied under a test: the branch passes it under the same test (`if mask is not None`
            # needs none: the mask is None where the test is false).
            learned = attention.additive_mask is not before[0] and _learned(attention.additive_mask, fn)
            if learned:
                # Never 0 / -inf once trained: `_npu_eager_attention` would compute it only to read it back and
                # fall back, every call. The branch runs where the test is false instead, without it.
                attention.skipped.append((source(test), learned))
                attention.additive_mask = before[0]
                attention.guards.append(_negated(test))
            elif attention.additive_mask is not before[0]:
                attention.additive_mask = _under(test, attention.additive_mask)
            else:
                attention.masked_out = _under(test, attention.masked_out)
            if scaled:
                raise Declined(
                    "it scales the scores after masking them", remedy="to fuse it, scale the scores before masking them"
                )
            node = skipped
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _CASTS:
            node = node.func.value  # an upcast for the softmax: the kernel computes in float32
            continue
        inner = _mask_step(node, None, fn, attention)
        if inner is not None:
            if scaled:
                raise Declined(
                    "it scales the scores after masking them", remedy="to fuse it, scale the scores before masking them"
                )
            node = inner
            continue
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div)):
            sides = ((node.left, node.right), (node.right, node.left)) if isinstance(node.op, ast.Mult) else ()
            sides = sides or ((node.left, node.right),)
            for inner, factor in sides:
                if _contains_scores(inner, fn) and not _contains_scores(factor, fn):
                    if not _reevaluable(factor, fn):
                        raise Declined(
                            f"the scale `{source(factor)}` is computed by a call the branch cannot repeat",
                            remedy="to fuse it, compute that value before the attention",
                        )
                    attention.scale.insert(0, (node.op, factor))
                    scaled, node = True, inner
                    break
            else:
                raise Declined(
                    f"the scores go through `{source(node)}`",
                    remedy="nothing in the code can: the kernel scales and masks the scores only",
                )
            continue
        raise Declined(
            f"the scores go through `{source(node)}`, which the kernel does not compute",
            remedy="nothing in the code can: the kernel scales and masks the scores only",
        )


_PARAMETERS = ("torch.nn.Parameter", "torch.nn.parameter.Parameter")


def _learned(term: ast.expr, fn: Function) -> str | None:
    """The parameter an additive term reads, if `__init__` creates it (`self.relative_position_bias_table =
    nn.Parameter(...)`, mmpretrain's and swin's relative position bias): trained, so never a mask of 0 / -inf."""
    for node in walk_shared(term):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == fn.self_name:
            origin = fn.attribute_source(node.attr)
            if origin is not None and any(
                isinstance(n, ast.Call) and fn.qualname(n.func) in _PARAMETERS for n in ast.walk(origin)
            ):
                return source(node)
    return None


def _under(test: ast.expr, mask: ast.expr) -> ast.expr:
    """`mask if test else None`, or `mask` itself where the test is `mask is not None`."""
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.IsNot)
        and _constant(test.comparators[0]) is None
        and isinstance(test.comparators[0], ast.Constant)
        and same(test.left, mask)
    ):
        return mask
    return ast.IfExp(test, mask, ast.Constant(None))


def _mask_step(node: ast.expr, inner: ast.expr | None, fn: Function, attention: Attention) -> ast.expr | None:
    """The scores under a mask step (`s + mask`, `s.masked_fill(drop, -inf)`), recorded in `attention`, or
    None if `node` is no mask step (of `inner`, when given)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        for scores, mask in ((node.left, node.right), (node.right, node.left)):
            if (inner is None or scores is inner) and _contains_scores(scores, fn) and not _contains_scores(mask, fn):
                if not _reevaluable(mask, fn):
                    raise Declined(
                        f"the scores get an additive term computed here (`{source(mask)}`): a bias such as"
                        " ALiBi or a relative position is no mask the kernel can take",
                        remedy="to fuse it, compute the bias outside the function and pass it in as a mask",
                    )
                learned = _learned(mask, fn) if inner is None else None
                if learned:
                    raise Declined(
                        f"the scores get a learned bias (from `{learned}`, an `nn.Parameter`) on every call:"
                        " trained values are not 0 / -inf, so the kernel, which takes only such a mask, would never"
                        " run",
                        remedy="nothing in the code can: the kernel adds no bias but a mask of 0 and -inf",
                    )
                if attention.additive_mask is not None:
                    raise Declined(
                        f"it adds more than one term to the scores (`{source(mask)}`, "
                        f"`{source(attention.additive_mask)}`): only a single mask of 0 and -inf converts",
                        remedy="to fuse it, add the terms into one mask before the attention",
                    )
                attention.additive_mask = mask
                return scores
        return None
    call = method_call(node, "masked_fill")
    if call is not None and fn.qualname(call.func) is None and len(call.args) == 2 and not call.keywords:
        scores, (dropped, value) = call.func.value, call.args
    elif isinstance(node, ast.Call) and fn.qualname(node.func) == "torch.masked_fill" and len(node.args) == 3:
        scores, dropped, value = node.args
    else:
        return None
    if inner is not None and scores is not inner:
        return None
    if not _lowest_value(value, fn):
        raise Declined(
            f"masked scores are set to `{source(value)}`, not -inf or the dtype's lowest: not the kernel's masking",
            remedy='to fuse it, fill with float("-inf") or torch.finfo(dtype).min',
        )
    if not _reevaluable(dropped, fn):
        raise Declined(
            f"the mask `{source(dropped)}` is computed by a call the branch cannot repeat",
            remedy="to fuse it, compute the mask before the attention",
        )
    if attention.masked_out is not None:
        raise Declined(
            "it masks the scores twice with `masked_fill`", remedy="to fuse it, combine the masks and fill once"
        )
    attention.masked_out = dropped
    return scores


# -- the function around it ---------------------------------------------------------------------------


def _fold_if(stmt: ast.If, env: dict[str, ast.expr], fn: Function) -> None:
    """`if test: a = ...` (an `else` of assignments too) folded into `env` as `a = ... if test else a`."""
    test = substitute(stmt.test, env)
    if not _reevaluable(test, fn):
        raise Declined(
            f"a step of the attention runs under `if {source(stmt.test)}`, which the branch cannot test first",
            remedy="to fuse it, test that condition outside the attention",
        )
    arms = []
    for block in (stmt.body, stmt.orelse):
        arm = dict(env)
        for inner in block:
            _fold_assignment(inner, arm, fn)
        arms.append(arm)
    for name in set(arms[0]) | set(arms[1]):
        if arms[0].get(name) is not arms[1].get(name):
            body, orelse = (arm.get(name, ast.Name(name, ast.Load())) for arm in arms)
            env[name] = ast.IfExp(test, body, orelse)


def _fold_assignment(stmt: ast.stmt, env: dict[str, ast.expr], fn: Function) -> None:
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        env[stmt.targets[0].id] = substitute(stmt.value, env)
    elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
        env[stmt.target.id] = substitute(stmt.value, env)
    elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
        # `scores += bias`, which is `scores = scores + bias` for the tensors here (in place or not).
        target = ast.Name(stmt.target.id, ast.Load())
        env[stmt.target.id] = substitute(ast.BinOp(target, stmt.op, stmt.value), env)
    elif (
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Tuple)
        and isinstance(stmt.value, ast.Tuple)
        and len(stmt.targets[0].elts) == len(stmt.value.elts)
        and all(isinstance(e, ast.Name) for e in stmt.targets[0].elts)
        and not any(isinstance(e, ast.Starred) for e in stmt.value.elts)
    ):
        # `a, b = x, y`: every value is computed before any name is bound.
        values = [substitute(value, env) for value in stmt.value.elts]
        env.update((target.id, value) for target, value in zip(stmt.targets[0].elts, values))
    elif isinstance(stmt, ast.If):
        _fold_if(stmt, env, fn)
    else:
        first_line = ast.unparse(stmt).splitlines()[0]
        raise Declined(
            f"the attention is interleaved with other code (`{first_line}`)",
            remedy="to fuse it, move that code before or after the attention",
        )


def _output(stmt: ast.stmt, env: dict[str, ast.expr], fn: Function) -> tuple[ast.AST, Attention] | None:
    """(the matmul of `stmt` that is the attention's output, the attention) if `stmt` computes it."""
    value = getattr(stmt, "value", None)
    if value is None or not isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.Return, ast.Expr)):
        return None
    for node in ast.walk(value):
        operands = _matmul_operands(node, fn)
        if operands is None:
            continue
        attention = Attention(query=None, key=None, value=substitute(operands[1], env), folded=_folded(node, fn))
        try:
            scores = _probabilities(substitute(operands[0], env), fn, attention)
        except _NotProbabilities:
            continue
        _scores(scores, fn, attention)
        return node, attention
    return None


#: A mask argument longer than this would pass PEP 8's 79 columns on its own line of the call in a method's
#: branch (16 columns in, a comma after): the branch binds it to a name first.
ARGUMENT_WIDTH = 62
#: What the branch names a mask argument it binds first.
BOUND_ARGUMENTS = {"additive_mask": "fused_mask", "masked_out": "fused_masked_out"}
#: Sub-expressions the branch may bind to a name: ones that compute something (a name, an attribute or a
#: constant reads as well as its binding would).
_BINDABLE = (ast.Call, ast.Subscript, ast.BinOp, ast.Compare)


def _bindable(node: ast.AST):
    """The sub-expressions of `node` evaluated whenever it is (`evaluated_nodes`) that compute something."""
    return (n for n in evaluated_nodes(node) if isinstance(n, _BINDABLE))


def _replace_same(node: ast.AST, target: str, name: str) -> ast.AST:
    """`node` with every sub-expression whose dump is `target` replaced by the name `name`."""

    class Replace(ast.NodeTransformer):
        def visit(self, n):
            if isinstance(n, ast.expr) and ast.dump(n) == target:
                return ast.Name(name, ast.Load())
            return super().visit(n)

    return Replace().visit(node)


def _bind_argument(argument: ast.expr, name: str, env: dict[str, ast.expr], taken: set[str]) -> list[str] | None:
    """Statements that bind `argument` to `name` in the branch, each sub-expression it repeats computed once,
    in the order it computes them, under the condition it is computed under (`bias if test else None`
    becomes `if test: ... else: name = None`); None where it is short and repeats nothing. Raises `Declined`
    where a repeated sub-expression is evaluated only under a condition inside the argument."""
    text = source(argument)
    test = None
    value = argument
    if (
        isinstance(argument, ast.IfExp)
        and _constant(argument.orelse) is None
        and isinstance(argument.orelse, ast.Constant)
    ):
        test, value = argument.test, argument.body
    value = ast.parse(source(value), mode="eval").body  # its own nodes: the substitution shares them

    def counts(nodes: list[ast.AST], walk) -> dict[str, int]:
        found: dict[str, int] = {}
        for node in nodes:
            for sub in walk(node):
                if isinstance(sub, _BINDABLE):
                    found[ast.dump(sub)] = found.get(ast.dump(sub), 0) + 1
        return found

    if len(text) <= ARGUMENT_WIDTH and max(counts([value], ast.walk).values(), default=0) < 2:
        return None
    bindings: list[tuple[str, ast.expr]] = []
    while True:
        values = [b for _, b in bindings] + [value]
        repeated = {dump for dump, count in counts(values, _bindable).items() if count > 1}
        if not repeated:
            break
        # The largest first: what it repeats inside is bound next, ahead of it.
        target = max(repeated, key=len)
        node = next(sub for v in values for sub in _bindable(v) if ast.dump(sub) == target)
        local = _name_for(node, env, taken)
        bindings = [(n, _replace_same(b, target, local)) for n, b in bindings]
        value = _replace_same(value, target, local)
        first = next((i for i, (_, b) in enumerate(bindings) if local in _loaded(b)), len(bindings))
        bindings.insert(first, (local, node))
    if any(count > 1 for count in counts([b for _, b in bindings] + [value], ast.walk).values()):
        raise Declined(
            f"the mask the branch would pass, `{text}`, repeats a computation evaluated only under a condition"
            " of its own",
            remedy="to fuse it, bind the bias to a name before the attention",
        )
    lines = [f"{local} = {source(b)}" for local, b in bindings] + [f"{name} = {source(value)}"]
    if test is None:
        return lines
    return [f"if {source(test)}:", *(f"    {line}" for line in lines), "else:", f"    {name} = None"]


def _loaded(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _name_for(node: ast.expr, env: dict[str, ast.expr], taken: set[str]) -> str:
    """A name for a bound sub-expression: `fused_<the local that held it>` (`S` in hivit's `S =
    int(math.sqrt(...))`) or `fused_term`, none the function uses or the branch binds already."""
    base = next(
        (
            f"fused_{local}"
            for local, held in env.items()
            if same(held, node) or (isinstance(held, ast.IfExp) and same(held.body, node))
        ),
        "fused_term",
    )
    local, count = base, 1
    while local in taken:
        count += 1
        local = f"{base}_{count}"
    taken.add(local)
    return local


@dataclass
class Fusion:
    """A branch to put in front of `before`."""

    before: ast.stmt
    attention: Attention
    tail: str  # the output statement and what follows it, as the branch runs them
    #: Statements the branch runs before the call, binding a long or repetitive mask argument to a name.
    bindings: list[str] = field(default_factory=list)
    #: The names those bind, by argument (`BOUND_ARGUMENTS`).
    bound: dict[str, str] = field(default_factory=dict)

    def context(self) -> dict[str, object]:
        a = self.attention
        return {
            "tensor": source(_device_tensor(a)),
            # (batch * heads, seq, dim) as (batch * heads, 1, seq, dim): one head each
            **{
                role: source(_method(tensor, "unsqueeze", [ast.Constant(1)]) if a.folded else tensor)
                for role, tensor in (("query", a.query), ("key", a.key), ("value", a.value))
            },
            "additive_mask": self.bound.get("additive_mask")
            or (source(a.additive_mask) if a.additive_mask is not None else "None"),
            "masked_out": self.bound.get("masked_out")
            or (source(a.masked_out) if a.masked_out is not None else "None"),
            "bindings": self.bindings,
            "dropout_p": source(a.dropout_p) if a.dropout_p is not None else "0.0",
            "scale": a.scale_source(),
            "guards": a.guards,
            "output": FUSED,
            "tail": self.tail,
        }


def _device_tensor(attention: Attention) -> ast.expr:
    """What `_is_npu` looks at: the tensor q, k or v is a view or cast of (`q` for `q.transpose(1, 2)`), so
    that the branch's test computes nothing; the query expression itself where each is computed."""
    for operand in (attention.query, attention.key, attention.value):
        tensor = operand
        while (
            isinstance(tensor, ast.Call)
            and isinstance(tensor.func, ast.Attribute)
            and tensor.func.attr in _VIEW_METHODS - {"size", "dim"}
        ):
            tensor = tensor.func.value
        if isinstance(tensor, (ast.Name, ast.Attribute, ast.Subscript)):
            return tensor
    return attention.query


def fuse(fn: Function) -> Fusion | None:
    """The branch for hand-written attention `fn`; None when it already has one. Raises `Declined`."""
    body = body_statements(fn.tree)
    if any(_is_our_branch(stmt) for stmt in body):
        return None
    # The scores come before the softmax: a `v @ attn.transpose(-2, -1)` after it (a transposed layout,
    # `q.transpose(-2, -1) @ k`) only looks like them.
    softmax_at = [i for i, stmt in enumerate(body) if any(_softmax_input(n, fn) is not None for n in ast.walk(stmt))]
    start = next(
        (i for i, stmt in enumerate(body) if softmax_at and i <= softmax_at[-1] and _contains_scores(stmt, fn)), None
    )
    if start is None:
        raise Declined(
            "the scores are not `q @ k.transpose(-2, -1)` of (batch, heads, seq, dim) or (batch * heads, seq, dim)"
            " tensors (an einsum or matmul over other axes, or its operands the other way round)",
            remedy="to fuse it, compute the scores as q @ k.transpose(-2, -1) on (batch, heads, seq, dim)",
        )
    env: dict[str, ast.expr] = {}
    for index in range(start, len(body)):
        stmt = body[index]
        found = _output(stmt, env, fn)
        if found is not None:
            break
        try:
            _fold_assignment(stmt, env, fn)
        except Declined:
            if index == start and isinstance(stmt, ast.If):
                raise Declined(
                    f"the attention is computed inside `if {source(stmt.test)}:`, which the branch cannot fold",
                    remedy="to fuse it, move the attention into a function of its own",
                ) from None
            raise
    else:
        raise Declined(
            "its output is not a statement of the function's body (it is computed under control flow)",
            remedy="to fuse it, compute the output at the top level of the body",
        )
    matmul, attention = found
    if not all(_reevaluable(part, fn) for part in (attention.query, attention.key, attention.value)):
        raise Declined(
            "q, k or v is computed by a call in the attention, which the branch cannot repeat",
            remedy="to fuse it, compute q, k and v before the attention",
        )
    if attention.dropout_p is not None and not _reevaluable(attention.dropout_p, fn):
        raise Declined(
            f"the dropout probability `{source(attention.dropout_p)}` is computed by a call",
            remedy="to fuse it, compute the dropout probability before the attention",
        )
    intermediates = set(env)  # names the attention binds: unbound where the branch runs
    # Of those, the scores and what is computed from them (the probabilities) are what the kernel does not
    # return: only they may become None; any other (a cache built beside them) declines where it is used.
    from_scores = {name for name, value in env.items() if _contains_scores(value, fn)}
    output: ast.expr = ast.Name(FUSED, ast.Load())
    if attention.folded:
        if attention.additive_mask is not None or attention.masked_out is not None:
            raise Declined(
                "the heads are folded into the batch and a mask is applied: its layout is not known here",
                remedy="to fuse it, keep the heads a dim of their own, (batch, heads, seq, dim)",
            )
        output = _method(output, "squeeze", [ast.Constant(1)])  # the kernel's one head, dropped again
    tail = [replace_nodes(stmt, {id(matmul): output}), *body[index + 1 :]]
    if not isinstance(tail[-1], ast.Return):
        raise Declined(
            "the function does not end with a `return` after the attention",
            remedy="to fuse it, return after the attention",
        )
    if FUSED in {n.id for n in fn.nodes if isinstance(n, ast.Name)}:
        raise Declined(
            f"the function already uses the name `{FUSED}`, which the branch would bind",
            remedy=f"to fuse it, rename your `{FUSED}`",
        )
    tail, positions = _without_probabilities(tail, intermediates, from_scores)
    if positions:
        _weights_not_needed(fn, attention)
        # TorchScript compiles the branch unless this test rules it out at compile time, and a None where
        # the original returns a tensor does not compile.
        attention.guards.insert(0, "not torch.jit.is_scripting()")
    fusion = Fusion(body[start], attention, "\n".join(ast.unparse(stmt) for stmt in tail))
    taken = {n.id for n in fn.nodes if isinstance(n, ast.Name)} | set(fn.params)
    for role, name in BOUND_ARGUMENTS.items():
        argument = getattr(attention, role)
        if argument is None:
            continue
        lines = _bind_argument(argument, name, env, taken | {name})
        if lines is not None and name in taken:
            raise Declined(
                f"the function already uses the name `{name}`, which the branch would bind",
                remedy=f"to fuse it, rename your `{name}`",
            )
        if lines is not None:
            fusion.bindings += lines
            fusion.bound[role] = name
            taken |= {line.split(" = ")[0].strip() for line in lines if " = " in line}
    return fusion


def _is_our_branch(stmt: ast.stmt) -> bool:
    if not isinstance(stmt, ast.If):
        return False
    test = stmt.test.values[0] if isinstance(stmt.test, ast.BoolOp) else stmt.test
    return isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "_is_npu"


def _without_probabilities(
    tail: list[ast.stmt], intermediates: set[str], from_scores: set[str]
) -> tuple[list[ast.stmt], set[int]]:
    """The tail with each intermediate computed from the scores (scores, probabilities) that is an element
    of a tuple replaced by None, and those positions. Such a tuple may only be returned, or held by a local that is returned
    (`outputs = (out, probs)`; `outputs = outputs + (cache,)`): any other use of it, or of an
    intermediate, declines."""
    positions: set[int] = set()
    replaced: dict[int, ast.expr] = {}
    for stmt in tail:
        for node in ast.walk(stmt):
            if not isinstance(node, ast.Tuple):
                continue
            for position, element in enumerate(node.elts):
                if isinstance(element, ast.Name) and element.id in from_scores:
                    replaced[id(element)] = ast.Constant(None)
                    positions.add(position)
    holders: set[str] = set()  # locals holding a tuple with a None in place of the probabilities
    for stmt in (s for top in tail for s in ast.walk(top) if isinstance(s, ast.stmt)):
        line = ast.unparse(stmt).splitlines()[0]
        if isinstance(stmt, ast.Return):
            expressions = []
        elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            expressions = []
            if any(id(n) in replaced or isinstance(n, ast.Name) and n.id in holders for n in ast.walk(stmt.value)):
                holders.add(stmt.targets[0].id)
        else:
            expressions = [c for c in ast.iter_child_nodes(stmt) if not isinstance(c, ast.stmt)]
        for node in (n for e in expressions for n in ast.walk(e)):
            if isinstance(node, ast.Name) and node.id in holders:
                raise Declined(
                    f"the tuple holding the probabilities is used, not only returned (`{line}`)",
                    remedy="to fuse it, keep the probabilities out of anything but the return",
                )
        for node in ast.walk(stmt if not isinstance(stmt, _COMPOUND) else ast.Module(expressions, [])):
            if isinstance(node, ast.Name) and node.id in intermediates and id(node) not in replaced:
                raise Declined(
                    f"it uses `{node.id}`, computed by the attention, after its output (`{line}`)",
                    remedy=f"to fuse it, return only the attention output, or compute `{node.id}` apart from it",
                )
            if id(node) in replaced and not isinstance(stmt, (ast.Return, ast.Assign)):
                raise Declined(
                    f"the probabilities are used, not only returned (`{line}`)",
                    remedy="to fuse it, keep the probabilities out of anything but the return",
                )
    return [replace_nodes(stmt, replaced) for stmt in tail], positions


def _weights_not_needed(fn: Function, attention: Attention) -> None:
    """Prove that the returned probabilities are not needed where the branch returns None for them: a
    guard on a parameter that says so. Raises `Declined`."""
    flag = next((p for p in WEIGHT_FLAGS if p in fn.params or p in _keyword_only(fn)), None)
    if flag is not None:
        attention.guards.insert(0, f"not {flag}")
        return
    # No proof from the callers: a subclass or another module may call even a private function and use
    # what it returns, and a None there would fail on the NPU only.
    raise Declined(
        "it returns the attention probabilities, which npu_fusion_attention does not compute, and no "
        f"parameter ({' / '.join(f'`{p}`' for p in WEIGHT_FLAGS)}) says when they are not wanted",
        remedy='to fuse it, add such a parameter, or use SDPA (transformers: `attn_implementation="sdpa"`)',
    )


def _keyword_only(fn: Function) -> list[str]:
    return [a.arg for a in fn.tree.args.kwonlyargs]
