"""NPU703's branch where a window of the last dim rotates: the width bound once, and each window of it.

The folded expression spells the rotated width, its window `x[..., :width]` and the sizes computed from
them at every place the original reads a name bound to them: the guard, the kernel tables, the check and
the kernel call. Written out as is, ChatGLM / Kolors' branch repeated `cache.shape[-2] * 2` five times and
reshaped a copy of x just to read a size (`x[..., :w].reshape(s, -1, n, w // 2, 2).size(3)`, which is
`w // 2`); Phi-3's partial rotary wrote `_npu_cos.shape[-1]` six times and each window twice (its check
and its kernel). `bind_windows` binds each width once (`_npu_w`), and each window written more than once
(`_npu_x*`), in the order the original evaluates them (the width, then the window), and reads a size that
a view's arguments state from those arguments (#23, reviewer's defect). A width is known by what it
spells, not by identity: a helper inlined once for q and once for k spells it in two copies.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from npu_migrate.transforms.fused.symbolic import replace_nodes, substitute_children, walk_shared

#: Views whose positional arguments are the sizes of their result.
_VIEWS = ("reshape", "view")


def bind_windows(
    found: list[Any],
    bindings: list[tuple[str, ast.expr]],
    roots: list[ast.expr],
    sized: Callable[[ast.AST], bool],
    rotated: list[ast.expr],
) -> tuple[list[tuple[str, ast.expr]], list[ast.expr]]:
    """(bindings, roots) of a branch whose binding values and other expressions are `bindings` and `roots`,
    with each rotated width and the windows sliced by it that the kernel rotates (one of `rotated`) bound to
    `_npu_*` names where the branch would write them more than once, and the sizes of views stated by their arguments (`sized`: an argument that
    computes nothing) read from them. A width is a bound of a window `base[..., lo:hi]` that reads a size
    (Phi-3's `cos.shape[-1]`, `offset + angles.shape[-1]`), or the width the rotation read as x's last size
    (`Site.window`, which the guard `0 <= width <= ...` writes once more); each is known by what it spells,
    since a helper inlined for q and again for k spells the same width in two copies."""
    names = [name for name, _ in bindings]
    everything = _stated_sizes([*(value for _, value in bindings), *roots], sized)
    added: list[tuple[str, ast.expr]] = []
    replacements: dict[int, ast.AST] = {}
    for key in _widths(found, everything, sized):
        wname = "_npu_w" if not added else f"_npu_w{sum(n.startswith('_npu_w') for n, _ in added)}"
        width_name = ast.Name(wname, ast.Load())
        # The windows sliced by the width that the kernel rotates, by what they spell (q's and k's apart);
        # one written twice (the check and the kernel) is bound. Another window is read inside a call the
        # branch binds as a whole (`t[..., :w].float()`, `_repeated_calls`).
        kernel = {ast.dump(x) for x in rotated}
        groups: dict[str, list[ast.expr]] = {}
        widths: list[ast.expr] = []
        for root in everything:
            for node in _unbound(root, replacements):
                if ast.dump(node) == key:
                    widths.append(node)
                elif _window_of(node, key):
                    groups.setdefault(ast.dump(node), []).append(node)
        uses = len(widths)
        windows = []
        for group in groups.values():
            if len(group) > 1 and ast.dump(group[0]) in kernel:
                uses -= len(group) - 1  # written once, in its binding
                windows.append(group)
        if uses < 2 and not windows:
            continue
        bind_width = uses >= 2  # a guard's `0 <= width <= ...` writes it once more
        width_ids = {id(w): width_name for w in widths} if bind_width else {}
        if bind_width:
            added.append((wname, widths[0]))
            replacements.update(width_ids)
        for group in windows:
            xname = f"_npu_x{sum(n.startswith('_npu_x') for n in [*names, *(a for a, _ in added)])}"
            added.append((xname, replace_nodes(group[0], width_ids)))
            for node in group:
                replacements[id(node)] = ast.Name(xname, ast.Load())
    if replacements:
        everything = list(replace_nodes(ast.Tuple(everything, ast.Load()), replacements).elts)
    values, roots = everything[: len(bindings)], everything[len(bindings) :]
    return _placed(list(zip(names, values)), added), roots


def unify_copies(exprs: list[ast.expr], pure: Callable[[ast.expr], bool]) -> list[ast.expr]:
    """`exprs` with each call that is a copy of another (by what it spells) made one node, when `pure` says
    it computes a value and nothing else: a helper inlined once for q and once for k builds its tables in
    two copies (`cache[:q.size(0)].view(...)` for cos and for sin), which the branch binds once
    (`_repeated_calls` reads calls by identity) as it does for a function that spells them once. Inner
    calls first, so that copies of a call are copies of one node all the way down."""
    one: dict[str, ast.AST] = {}
    memo: dict[int, ast.AST] = {}

    def visit(node: ast.AST) -> ast.AST:
        if id(node) not in memo:
            new = substitute_children(node, visit)
            if isinstance(node, ast.Call) and pure(node):
                new = one.setdefault(ast.dump(new), new)
            memo[id(node)] = new
        return memo[id(node)]

    return [visit(expr) for expr in exprs]


def _placed(kept: list[tuple[str, ast.expr]], added: list[tuple[str, ast.expr]]) -> list[tuple[str, ast.expr]]:
    """`kept` with `added` put first, as the original reads a width first, except those that read a binding
    of `kept` (`_npu_cos.shape[-1]`, a window of a bound upcast `_npu_x0[..., :_npu_w]`), or read one that
    does: those go after `kept`, as the original reads them after its tables, or before the first binding
    that reads them, and after what they read."""

    def reads(value: ast.expr) -> set[str]:
        return {n.id for n in walk_shared(value) if isinstance(n, ast.Name)}

    after = {name for name, _ in kept}
    first, late = [], []
    for name, value in added:
        if reads(value) & after:
            late.append((name, value))
            after.add(name)
        else:
            first.append((name, value))
    result = [*first, *kept]
    for name, value in late:
        readers = [at for at, (_, v) in enumerate(result) if name in reads(v)]
        needed = [at for at, (n, _) in enumerate(result) if n in reads(value)]
        at = max(min(readers, default=len(result)), max(needed, default=-1) + 1)
        result.insert(at, (name, value))
    return result


def _unbound(node: ast.AST, bound: dict[int, ast.AST]):
    """`walk_shared(node)` without the subtrees already in `bound` (a window bound for an earlier width)."""
    if id(node) in bound:
        return
    yield node
    for child in ast.iter_child_nodes(node):
        yield from _unbound(child, bound)


def _widths(found: list[Any], roots: list[ast.expr], sized: Callable[[ast.AST], bool]) -> list[str]:
    """The widths of the branch (see `bind_windows`), as `ast.dump`s, in the order it first reads them."""
    keys: list[str] = []
    for site in found:
        if site.window is not None and not isinstance(site.window[1], (ast.Name, ast.Constant)):
            keys.append(ast.dump(site.window[1]))
    for root in roots:
        for node in walk_shared(root):
            for bound in _bounds(node):
                if not isinstance(bound, (ast.Name, ast.Constant)) and sized(bound) and _reads_size(bound):
                    keys.append(ast.dump(bound))
    return list(dict.fromkeys(keys))


def _bounds(node: ast.AST) -> list[ast.expr]:
    """The bounds of `node` when it is a window of the last dim, `base[..., lo:hi]`."""
    if not (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Tuple) and len(node.slice.elts) == 2):
        return []
    ellipsis, window = node.slice.elts
    if not (
        isinstance(ellipsis, ast.Constant)
        and ellipsis.value is Ellipsis
        and isinstance(window, ast.Slice)
        and window.step is None
    ):
        return []
    return [b for b in (window.lower, window.upper) if b is not None]


def _reads_size(node: ast.AST) -> bool:
    """Whether `node` reads a size of a tensor (`t.shape[-1]`, `t.size(-1)`)."""
    return any(
        isinstance(n, ast.Attribute)
        and n.attr == "shape"
        or isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "size"
        for n in walk_shared(node)
    )


def _window_of(node: ast.AST, key: str) -> bool:
    """`node` is a window `base[..., lo:hi]` with a bound that spells the width `key`."""
    return any(ast.dump(b) == key for b in _bounds(node))


def _stated_sizes(roots: list[ast.expr], sized: Callable[[ast.AST], bool]) -> list[ast.expr]:
    """`roots` with each size read of a view whose arguments state it (`t.reshape(s, -1, n, w // 2, 2).size(3)`
    is `w // 2`) replaced by that argument: the branch need not view a copy of x to read it. Where the view
    would succeed it has that size; where it would fail (an empty x, whose -1 cannot be inferred), the
    original raises and the branch may not: a failure removed from the branch, none added."""
    replacements: dict[int, ast.AST] = {}
    for root in roots:
        for node in walk_shared(root):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "size":
                view, at = node.func.value, node.args[0] if len(node.args) == 1 and not node.keywords else None
            elif (
                isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "shape"
            ):
                view, at = node.value.value, node.slice
            else:
                continue
            stated = _stated(view, at, sized)
            if stated is not None:
                replacements[id(node)] = stated
    if not replacements:
        return roots
    return list(replace_nodes(ast.Tuple(roots, ast.Load()), replacements).elts)


def _stated(view: ast.expr, at: ast.AST | None, sized: Callable[[ast.AST], bool]) -> ast.expr | None:
    """The argument of `view` (`t.reshape(a, b, ...)`, sizes spelled one per argument) that is its size at
    `at`, when it is a size given outright (not -1, which the view infers)."""
    if not (
        isinstance(view, ast.Call)
        and isinstance(view.func, ast.Attribute)
        and view.func.attr in _VIEWS
        and not view.keywords
        and len(view.args) >= 2  # `t.view(dtype)` / `t.view(shape)` spell no size per argument
        and not any(isinstance(a, ast.Starred) for a in view.args)
        and isinstance(at, ast.Constant)
        and type(at.value) is int
        and -len(view.args) <= at.value < len(view.args)
    ):
        return None
    arg = view.args[at.value]
    if isinstance(arg, ast.UnaryOp) or (isinstance(arg, ast.Constant) and not isinstance(arg.value, int)):
        return None  # -1 is inferred
    return arg if sized(arg) else None


def in_order(bindings: list[tuple[str, ast.expr]], first: list[str]) -> list[tuple[str, ast.expr]]:
    """`bindings` with those named in `first` (the width and windows `bind_windows` bound) moved before
    the `_npu_t*` bindings that `rotary_branch.rewrite`'s later rounds put in front, which may read them;
    from the first that reads another binding on, they stay where they are."""
    moved: list[tuple[str, ast.expr]] = []
    for name, value in bindings:
        if name not in first:
            continue
        moved_names = {m for m, _ in moved}
        reads = {n.id for n in walk_shared(value) if isinstance(n, ast.Name) and n.id.startswith("_npu_")}
        if not reads <= moved_names:
            break  # it reads a binding before it (`_npu_x0[..., :_npu_w]` of an upcast): kept after that
        moved.append((name, value))
    names = {name for name, _ in moved}
    return moved + [b for b in bindings if b[0] not in names]
