"""NPU703's recognition: the subexpressions of a folded function that compute `npu_rotary_mul`.

`sites` runs each candidate subexpression of a folded expression (helpers inlined) on a symbolic tensor
(`evaluator`) and keeps those whose result is the kernel's `x * cos + rotate(x) * sin`, with the kernel's
tables read off as expressions (`rotation.meaning`); the reason of each close miss goes to the caller's
list. `rotates` recognises a rotation alone (rotate_half or its interleaved form), for the findings that
name one multiplied by something else. Both only find; what the function then gets is decided elsewhere
(`rotary_outcome`).
"""

from __future__ import annotations

import ast

from npu_migrate.transforms.fused.evaluator import Structure, chain_base
from npu_migrate.transforms.fused.rotary_screen import Runs, may_be_rotation
from npu_migrate.transforms.fused.rotation import Declined, meaning, pure_rotation
from npu_migrate.transforms.fused.symbolic import Function

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


def rotates(expr: ast.expr, fn: Function) -> tuple[str, ast.expr] | None:
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
