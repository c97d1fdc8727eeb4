"""NPU703's branch writer: the guarded `npu_rotary_mul` branch for the sites of one folded expression.

`rewrite` turns the recognised sites (`rotary_sites.Site`) into the template's context: the kernel tables
paired per rotated tensor and bound once, what the original computes once bound once (`rotary_window` for
widths and windows), the checks `_npu_rotary_fits` and the guard make, and the kernel calls in place of the
sites. It declines, with a finding, where the branch would call user code before the guard decides
(`reruns` says which findings a later placement may avoid), repeat what the function does with the
rotation, or read what it cannot check.
"""

from __future__ import annotations

import ast

from npu_migrate.transforms.fused.evaluator import KNOWN_FUNCTIONS, KNOWN_METHODS
from npu_migrate.transforms.fused.imported import unbound_name
from npu_migrate.transforms.fused.rotary_rule import HELPER, ROTARY, TEMPLATE
from npu_migrate.transforms.fused.rotary_sites import Site
from npu_migrate.transforms.fused.rotary_window import bind_windows, in_order, unify_copies
from npu_migrate.transforms.fused.symbolic import (
    Function,
    Outcome,
    contains_call,
    evaluates_twice,
    is_pure,
    replace_nodes,
    same,
    source,
    walk_shared,
)

_NAMES = ("_npu_cos", "_npu_sin")


def rewrite(fn: Function, result: ast.expr, found: list[Site], mode: str) -> Outcome:
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


#: What the finding of a branch declined for calling user code twice says (`reruns`): a later placement,
#: after the statement that makes the call, may do.
_RERUN = " before knowing whether the kernel applies"


def reruns(outcome: Outcome | None) -> bool:
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
