"""NPU703's branch where the rotated width is read from elsewhere (ChatGLM / Kolors' `rope_cache.shape[-2] * 2`).

The folded expression spells the width, its window `x[..., :width]` and the sizes computed from them at
every place the original reads a name bound to them: the guard, the kernel tables, the check and the kernel
call. Written out as is, the branch repeats `cache.shape[-2] * 2` five times and reshapes a copy of x just
to read a size (`x[..., :w].reshape(s, -1, n, w // 2, 2).size(3)`, which is `w // 2`). `bind_windows` binds
each once, first thing in the branch, in the order the original evaluates them (the width, then the
window), and reads a size that a view's arguments state from those arguments (#23, reviewer's defect).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from npu_migrate.transforms.fused.symbolic import replace_nodes, walk_shared

#: Views whose positional arguments are the sizes of their result.
_VIEWS = ("reshape", "view")


def bind_windows(
    found: list[Any],
    bindings: list[tuple[str, ast.expr]],
    roots: list[ast.expr],
    sized: Callable[[ast.AST], bool],
) -> tuple[list[tuple[str, ast.expr]], list[ast.expr]]:
    """(bindings, roots) of a branch whose binding values and other expressions are `bindings` and `roots`,
    with each site's window width (`Site.window`) and its window bound to `_npu_*` names where the branch
    would write them more than once (the guard `0 <= width <= ...` writes the width once more), and the
    sizes of views stated by their arguments (`sized`: an argument that computes nothing) read from them."""
    names = [name for name, _ in bindings]
    everything = _stated_sizes([*(value for _, value in bindings), *roots], sized)
    added: list[tuple[str, ast.expr]] = []
    replacements: dict[int, ast.AST] = {}
    widths: list[ast.expr] = []
    for site in found:
        if site.window is None:
            continue
        width = site.window[1]
        if isinstance(width, (ast.Name, ast.Constant)) or any(width is w for w in widths):
            continue  # a name is already bound once; q and k of one width bind it once
        widths.append(width)
        wname = "_npu_w" if len(widths) == 1 else f"_npu_w{len(widths) - 1}"
        width_name = ast.Name(wname, ast.Load())
        # The windows `base[..., :width]`, grouped by what they read (q's and k's apart); one written twice
        # (the check and the kernel) is bound.
        groups: dict[str, list[ast.expr]] = {}
        uses = 0
        for root in everything:
            for node in walk_shared(root):
                if node is width:
                    uses += 1
                elif _window_of(node, width):
                    groups.setdefault(ast.dump(node), []).append(node)
        windows = []
        for group in groups.values():
            if len(group) > 1:
                uses -= len(group) - 1  # written once, in its binding
                windows.append(group)
        if uses < 2 and not windows:
            continue
        bind_width = uses >= 2  # with the guard's, written more than twice
        if bind_width:
            added.append((wname, width))
            replacements[id(width)] = width_name
        for group in windows:
            value = replace_nodes(group[0], {id(width): width_name}) if bind_width else group[0]
            xname = f"_npu_x{sum(n.startswith('_npu_x') for n in [*names, *(a for a, _ in added)])}"
            added.append((xname, value))
            for node in group:
                replacements[id(node)] = ast.Name(xname, ast.Load())
    if replacements:
        everything = list(replace_nodes(ast.Tuple(everything, ast.Load()), replacements).elts)
    values, roots = everything[: len(bindings)], everything[len(bindings) :]
    kept = list(zip(names, values))
    # First thing in the branch, as the original reads the width first; a window of a bound upcast
    # (`_npu_x0[..., :_npu_w]`) after that binding.
    result: list[tuple[str, ast.expr]] = []
    late: list[tuple[str, ast.expr]] = []
    for name, value in added:
        reads = {n.id for n in walk_shared(value) if isinstance(n, ast.Name)}
        (late if reads & set(names) else result).append((name, value))
    for name, value in kept:
        result.append((name, value))
        for pending in [p for p in late if name in {n.id for n in walk_shared(p[1]) if isinstance(n, ast.Name)}]:
            late.remove(pending)
            result.append(pending)
    return result + late, roots


def _window_of(node: ast.AST, width: ast.expr) -> bool:
    """`node` is `base[..., :width]` (`width` by identity)."""
    if not (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Tuple) and len(node.slice.elts) == 2):
        return False
    ellipsis, window = node.slice.elts
    return (
        isinstance(ellipsis, ast.Constant)
        and ellipsis.value is Ellipsis
        and isinstance(window, ast.Slice)
        and window.lower is None
        and window.step is None
        and window.upper is width
    )


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
    """`bindings` with those named in `first` (the width and windows `bind_windows` bound) moved before the `_npu_t*` bindings that `_rewrite`'s later rounds put in
    front, which may read them; from the first that reads another binding on, they stay where they are."""
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
