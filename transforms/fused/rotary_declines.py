"""NPU703's findings for rotary embeddings it leaves alone: never silent about one, always saying why.

Each finder answers None, or the finding for one shape of code the branch cannot be proven for: a body
that is one `with` other than an autocast-disabled one (`with_outcome`), a rotation multiplied by a table
but not summed as the kernel sums it (`unmatched_rotation`), a `rotate*` helper whose body cannot be read
or is no rotation (`rotate_helper_outcome`), an imported helper the tool could not follow
(`unfollowed_outcome`), dims named from the front, proven by rotating the same code counted from the end
(`front_dims_outcome`), and a rotation inside a loop (`loop_outcome`). They read the function and the
recognised sites (`rotary_sites`); none writes a branch.
"""

from __future__ import annotations

import ast
import copy

from npu_migrate.transforms.fused.imported import NO_FILE, rebinding, why_not_followed, why_unfollowed_call
from npu_migrate.transforms.fused.rotary_rule import ROTARY
from npu_migrate.transforms.fused.rotary_sites import rotates, sites
from npu_migrate.transforms.fused.symbolic import (
    Function,
    NotStraightLine,
    Outcome,
    body_statements,
    fold,
    inline_functions,
    source,
    substitute_children,
    walk_shared,
)


def with_outcome(fn: Function) -> Outcome | None:
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


def unmatched_rotation(result: ast.expr, fn: Function) -> Outcome | None:
    """The finding for a function that multiplies a rotation (rotate_half or its interleaved form, by what
    it computes) by something but has no `x * cos + rotate(x) * sin`: never silent about a rotary
    embedding it leaves alone."""
    for node in walk_shared(result):
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
            continue
        for factor in (node.left, node.right):
            found = rotates(factor, fn) if isinstance(factor, ast.Call) else None
            if found is not None:
                return Outcome(
                    ROTARY,
                    f"rotary embedding not fused: the rotation of `{source(found[1])}` is multiplied by a table, "
                    "but not summed as `x * cos + rotate(x) * sin` with that same x, which is what "
                    "npu_rotary_mul computes",
                    remedy="to fuse it, rotate the tensor that is multiplied by cos, if that is what it means",
                )
    return None


def rotate_helper_outcome(fn: Function) -> Outcome | None:
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


def unfollowed_outcome(result: ast.expr, fn: Function) -> Outcome | None:
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


#: The dim-taking operations `front_dims_outcome` reads: method or function -> (dim's position, keyword).
_DIM_OPS = {
    "unflatten": (0, "dim"),
    "unbind": (0, "dim"),
    "flatten": (0, "start_dim"),
    "chunk": (1, "dim"),
    "split": (1, "dim"),
}
_DIM_FUNCTIONS = {"torch.stack": (1, "dim"), "torch.cat": (1, "dim"), "torch.concat": (1, "dim")}
_SAME_NDIM = frozenset({"float", "half", "bfloat16", "double", "to", "type_as", "contiguous", "clone", "detach", "neg"})


def front_dims_outcome(result: ast.expr, fn: Function, ndim: int = 3) -> Outcome | None:
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


def loop_outcome(fn: Function) -> Outcome | None:
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
        found = rotates(inline_functions(fn, probe), fn)
    except NotStraightLine:
        return None
    return call.args[0] if found is not None and source(found[1]) == "_npu_probe" else None
