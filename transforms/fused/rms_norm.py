"""NPU701: hand-written RMSNorm gets a `torch_npu.npu_rms_norm` branch.

The idiom is `x * rsqrt(mean(x², -1, keepdim=True) + eps)` (or `x / sqrt(...)`), scaled by a weight,
in whatever statements, names, methods and casts the function spells it. Two weight placements differ
in dtype semantics and get different branches:

* Llama style, weight applied after the cast back (`w * norm(x.float()).to(x.dtype)`): the kernel
  needs gamma in x's dtype, and then returns x's dtype as the original does, so the branch is guarded
  by `w.dtype == x.dtype` (an fp32 weight with bf16 activations would promote the original's output).
* Gemma style, weight applied in fp32 before the cast (`(norm(x.float()) * (1 + w.float())).type_as(x)`):
  the branch runs the kernel on `x.float()` with an fp32 gamma and casts back, which is what the
  original computes, `1 + w` included (npu_gemma_rms_norm is not used: its precision for `1 + w` is
  undocumented).
"""

from __future__ import annotations

import ast

from npu_migrate.engine.rule import EVERY_TARGET, Example, FixSafety, Rule
from npu_migrate.transforms.fused.idiom import Idiom
from npu_migrate.transforms.fused.symbolic import (
    STRAIGHT_LINE,
    Function,
    NotStraightLine,
    Outcome,
    argument,
    fold,
    is_pure,
    method_call,
    parameter_paths,
    same,
    source,
    walk_shared,
)
from npu_migrate.transforms.fused.ways import conditions, first_decline, refused_read, split_ways, stable_reads, where

RMS_NORM = Rule(
    id="NPU701",
    name="fused-rms-norm",
    family="fused",
    summary="hand-written RMSNorm gets a guarded `torch_npu.npu_rms_norm` branch",
    what="""
    Recognises `x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)` scaled by a weight, in any of its
    spellings: `.float()` / `.to(torch.float32)` upcasts, `.to(input_dtype)` / `.type_as(x)` casts back,
    a separate `_norm` method, `torch.mean(x * x, ...)`, `/ torch.sqrt(...)`, the weight before or after
    the cast, Gemma's `(1 + weight)` or `(1 + weight) if self.add_unit_offset else weight`, a reduced
    dim held by an attribute (`mean(x * x, dim=self.dim, ...)`: guarded to be the last), and
    `F.rms_norm(x, shape, weight, eps)` / `torch.rms_norm` (with a gamma of ones when there is no
    weight), and k-diffusion's float32 factor `x * (w.to(dt) * torch.rsqrt(mean(x.to(dt) ** 2, -1,
    keepdim=True) + eps)).to(x.dtype)` (`dt` float32 or promoted with it: the kernel runs in float32). A
    CUDA-only fast path in front (`if fast_kernel is not None and x.is_cuda: return
    fast_kernel(...)`) stays for CUDA: the NPU branch goes before it. A body whose `if`s test parameters
    or the module's own configuration (`if not self.force_fp32:`, `if self.weight is not None:`, T5's `if
    self.weight.dtype in [torch.float16, torch.bfloat16]:`) gets a branch per way through them that is
    RMSNorm, each guarded by its way's tests: an attribute of `self` only where the class binds it in
    `__init__` alone, to plain data (no property, method or class attribute of that name), and of a tensor
    attribute only its dtype, shape or ndim. A branch in front of the untouched
    body runs the fused kernel when the input is on an NPU and the kernel's constraints hold (gamma shape
    and dtype, at least 2 dims); otherwise the original code runs. The file gets, once, a guarded
    `import torch_npu` and `_is_npu`. Code that already calls `npu_rms_norm` gets no second branch.

    Declined, with a finding saying why: a reduction over another dim or without keepdim, mean
    subtraction (LayerNorm), no weight, `F.normalize(x) * sqrt(d)` (eps clamps the norm instead of adding
    to the mean square), other control flow (a test that calls something, or reads an attribute
    bound outside `__init__` or computed by a property). `F.rms_norm` without eps (or eps None) passes its
    default explicitly: float32's machine epsilon, which torch uses for fp16 and bf16 inputs too (it
    computes them in float32), not `torch.finfo(x.dtype).eps`.
    """,
    why="""
    On an NPU the hand-written RMSNorm is five or more operators, each a kernel launch and a trip
    through device memory; `torch_npu.npu_rms_norm` is one kernel.
    """,
    example=Example(
        before="""
            import torch
            from torch import nn


            class RMSNorm(nn.Module):
                def __init__(self, dim, eps=1e-6):
                    super().__init__()
                    self.weight = nn.Parameter(torch.ones(dim))
                    self.eps = eps

                def forward(self, x):
                    variance = x.pow(2).mean(-1, keepdim=True)
                    return self.weight * (x * torch.rsqrt(variance + self.eps))
        """,
        after="""
            import torch
            from torch import nn


            # ... fused-op helpers npu-migrate adds here: import torch_npu (guarded), _is_npu, _npu_rms_norm


            class RMSNorm(nn.Module):
                def __init__(self, dim, eps=1e-6):
                    super().__init__()
                    self.weight = nn.Parameter(torch.ones(dim))
                    self.eps = eps

                def forward(self, x):
                    if (
                        _is_npu(x)
                        and 2 <= x.dim() <= 8
                        and self.weight.shape == x.shape[-1:]
                        and self.weight.dtype == x.dtype
                        and x.dtype in (torch.float16, torch.bfloat16, torch.float32)
                    ):
                        return _npu_rms_norm(x, self.weight, epsilon=self.eps)[0]
                    variance = x.pow(2).mean(-1, keepdim=True)
                    return self.weight * (x * torch.rsqrt(variance + self.eps))
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

TEMPLATE = "fused/rms_norm.py.j2"
KERNEL_DTYPES = "(torch.float16, torch.bfloat16, torch.float32)"


#: Remedies shared by several declines (`Outcome.remedy`).
PARAMETER = "to fuse it, pass the tensor it normalises as a parameter"
EPS_CONSTANT = "to fuse it, make eps a constant or attribute"


def _is_fp32(dtype: ast.expr, fn: Function) -> bool:
    return fn.qualname(dtype) in ("torch.float32", "torch.float")


def upcast_base(node: ast.expr, fn: Function) -> ast.expr | None:
    """`t` for `t.float()`, `t.to(torch.float32)`, `t.type(torch.float32)`."""
    call = method_call(node, "float")
    if call is not None and not call.args and not call.keywords:
        return call.func.value
    call = method_call(node, "to") or method_call(node, "type")
    if call is not None and len(call.args) + len(call.keywords) == 1:
        dtype = argument(call, 0, "dtype")
        if dtype is not None and _is_fp32(dtype, fn):
            return call.func.value
    return None


def downcast_inner(node: ast.expr, x: ast.expr) -> ast.expr | None:
    """`t` for `t.to(x.dtype)`, `t.to(dtype=x.dtype)`, `t.type(x.dtype)`, `t.type_as(x)`."""
    x_dtype = ast.Attribute(value=x, attr="dtype", ctx=ast.Load())
    for name, expected in (("to", x_dtype), ("type", x_dtype), ("type_as", x)):
        call = method_call(node, name)
        if call is not None and len(call.args) + len(call.keywords) == 1:
            given = argument(call, 0, "dtype" if name != "type_as" else "other")
            if same(given, expected):
                return call.func.value
    return None


def _square_base(node: ast.expr, fn: Function) -> ast.expr | None:
    two = lambda e: isinstance(e, ast.Constant) and e.value == 2  # noqa: E731
    call = method_call(node, "pow")
    if call is not None and len(call.args) == 1 and two(call.args[0]) and fn.qualname(call.func) != "torch.pow":
        return call.func.value
    if (
        isinstance(node, ast.Call)
        and fn.qualname(node.func) == "torch.pow"
        and len(node.args) == 2
        and two(node.args[1])
    ):
        return node.args[0]
    if isinstance(node, ast.Call) and fn.qualname(node.func) == "torch.square" and len(node.args) == 1:
        return node.args[0]
    call = method_call(node, "square")
    if call is not None and not call.args and fn.qualname(call.func) != "torch.square":
        return call.func.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and two(node.right):
        return node.left
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and same(node.left, node.right):
        return node.left
    return None


def _is_last_dim(dim: ast.expr | None) -> bool:
    if isinstance(dim, (ast.Tuple, ast.List)) and len(dim.elts) == 1:
        dim = dim.elts[0]
    return (
        isinstance(dim, ast.UnaryOp)
        and isinstance(dim.op, ast.USub)
        and isinstance(dim.operand, ast.Constant)
        and dim.operand.value == 1
    )


def _mean(node: ast.expr, fn: Function) -> tuple[ast.expr, ast.Call, int] | None:
    """(reduced tensor, call, index of the dim argument) for `t.mean(...)` / `torch.mean(t, ...)`."""
    if isinstance(node, ast.Call) and fn.qualname(node.func) == "torch.mean" and node.args:
        return node.args[0], node, 1
    call = method_call(node, "mean")
    if call is not None:
        return call.func.value, call, 0
    return None


class Site:
    """One `rsqrt(mean(s²) + eps)` (or `sqrt`) in the code, and what it normalises."""

    def __init__(self, root: ast.Call, mean: ast.expr, eps: ast.expr, divide: bool) -> None:
        self.root, self.mean, self.eps, self.divide = root, mean, eps, divide
        self.dim: ast.expr | None = None  # the attribute holding the reduced dim, when not a literal -1


def sites(expr: ast.AST, fn: Function) -> list[Site]:
    found = []
    for node in walk_shared(expr):
        if not isinstance(node, ast.Call):
            continue
        name = fn.qualname(node.func)
        if name in ("torch.rsqrt", "torch.sqrt") and len(node.args) == 1:
            inner, divide = node.args[0], name == "torch.sqrt"
        elif method_call(node, "rsqrt") or method_call(node, "sqrt"):
            if node.args or fn.qualname(node.func) is not None:
                continue
            inner, divide = node.func.value, node.func.attr == "sqrt"
        else:
            continue
        if not (isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.Add)):
            continue
        for mean, eps in ((inner.left, inner.right), (inner.right, inner.left)):
            if _mean(mean, fn) is not None:
                found.append(Site(node, mean, eps, divide))
                break
    return found


def _core(node: ast.expr, site: Site) -> ast.expr | None:
    """The normalised tensor, if `node` is `t * rsqrt(...)`, `rsqrt(...) * t` or `t / sqrt(...)`."""
    if not isinstance(node, ast.BinOp):
        return None
    if site.divide:
        return node.left if isinstance(node.op, ast.Div) and node.right is site.root else None
    if isinstance(node.op, ast.Mult):
        if node.right is site.root:
            return node.left
        if node.left is site.root:
            return node.right
    return None


def _check_site(site: Site, fn: Function) -> tuple[ast.expr | None, str, str]:
    """The squared tensor, or None, why this is not RMS normalisation over the last dim and what would let
    it be (an `Outcome.remedy`). A dim held
    by an attribute (`self.dim`) is checked at run time: `site.dim` is then that attribute."""
    reduced, call, dim_at = _mean(site.mean, fn)
    dim = argument(call, dim_at, "dim")
    site.dim = None
    if isinstance(dim, ast.Attribute) and is_pure(dim):
        site.dim = dim
    elif not _is_last_dim(dim):
        where = f"dim {source(dim)}" if dim is not None else "all dims"
        return (
            None,
            f"it reduces over {where}, not the last dim alone",
            "nothing in the code can: npu_rms_norm normalises the last dim",
        )
    keepdim = argument(call, dim_at + 1, "keepdim")
    if not (isinstance(keepdim, ast.Constant) and keepdim.value is True):
        return None, "the mean is taken without keepdim=True", "to fuse it, pass keepdim=True to the mean"
    if any(k.arg not in ("dim", "keepdim") for k in call.keywords) or len(call.args) > dim_at + 2:
        return (
            None,
            "the mean takes arguments the kernel has no counterpart for",
            "to fuse it, give the mean only dim and keepdim",
        )
    squared = _square_base(reduced, fn)
    if squared is None:
        return None, "the mean is not over a square", "nothing in the code can: npu_rms_norm averages squares"
    if isinstance(squared, ast.BinOp) and isinstance(squared.op, ast.Sub):
        return (
            None,
            "it subtracts the mean first (LayerNorm, not RMSNorm)",
            "nothing in the code can: npu_rms_norm does not centre",
        )
    if not is_pure(site.eps):
        return None, "eps is computed, not a constant or attribute", "to fuse it, pass eps as a constant or attribute"
    return squared, "", ""


def _weight_leaf(weight: ast.expr, fn: Function) -> tuple[ast.expr, bool] | None:
    """(the parameter the weight expression reads, whether the expression is visibly fp32)."""
    fp32 = False
    base = upcast_base(weight, fn)
    if base is not None:
        weight, fp32 = base, True
    if isinstance(weight, ast.IfExp):
        # `(1 + w) if self.add_unit_offset else w`: a flag chooses the offset; the branch passes both as written.
        arms = [_weight_leaf(arm, fn) for arm in (weight.body, weight.orelse)]
        if not is_pure(weight.test) or None in arms or not same(arms[0][0], arms[1][0]) or arms[0][1] != arms[1][1]:
            return None
        return arms[0][0], fp32 or arms[0][1]
    if isinstance(weight, ast.BinOp) and isinstance(weight.op, ast.Add):
        for const, rest in ((weight.left, weight.right), (weight.right, weight.left)):
            if isinstance(const, ast.Constant) and isinstance(const.value, (int, float)):
                weight = rest
                break
        else:
            return None
        base = upcast_base(weight, fn)
        if base is not None:
            weight, fp32 = base, True
    if isinstance(weight, (ast.Name, ast.Attribute)) and is_pure(weight):
        return weight, fp32
    return None


def _mentions(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in walk_shared(node))


FUNCTIONAL = ("torch.nn.functional.rms_norm", "torch.rms_norm")
#: `torch.finfo(torch.float32).eps`, rms_norm's eps when none is given (`_match_functional`).
FLOAT32_EPS = repr(float(2**-23))


def _calls_kernel(fn: Function) -> bool:
    """Whether the function already calls npu_rms_norm (an `is_torch_npu_available()` branch of its own)."""
    return any(
        isinstance(node.func, (ast.Attribute, ast.Name))
        and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "npu_rms_norm"
        for node in fn.calls
    )


def _normalize_decline(fn: Function) -> Outcome | None:
    """x-transformers' `F.normalize(x, dim=-1) * dim ** 0.5 * g` is RMS-like but not the kernel's function."""
    if not fn.may_call(("torch.nn.functional.normalize",)):
        return None

    def sqrt_scale(node: ast.expr) -> bool:
        """`d ** 0.5`, `sqrt(d)` or an attribute `__init__` sets to one: the RMS rescaling of a unit norm."""
        for part in ast.walk(node):
            if isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name) and part.value.id == fn.self_name:
                origin = fn.attribute_source(part.attr)
                if origin is not None and origin is not node and sqrt_scale(origin):
                    return True
            if isinstance(part, ast.BinOp) and isinstance(part.op, ast.Pow):
                if isinstance(part.right, ast.Constant) and part.right.value == 0.5:
                    return True
            if isinstance(part, ast.Call) and (fn.qualname(part.func) or "").endswith("sqrt"):
                return True
        return False

    def normalized(operand: ast.expr, seen: frozenset[str] = frozenset()) -> bool:
        """`F.normalize(...)` itself, or a name every assignment in the function gives one (x-transformers'
        `normed = F.normalize(x, dim=-1)` then `normed * self.scale * (gamma + 1.)`)."""
        if isinstance(operand, ast.Name):
            if operand.id in seen:  # `a = b` and `b = a`: no proof either way
                return False
            values = _assigned(fn, operand.id)
            return bool(values) and all(normalized(v, seen | {operand.id}) for v in values)
        if isinstance(operand, ast.Call) and fn.qualname(operand.func) == "torch.nn.functional.normalize":
            calls.append(operand)
            return True
        # cast back after a float32 normalize (diffusers' Wan / Kandinsky norms: `F.normalize(x.float()).to(x.dtype)`)
        call = next(
            (method_call(operand, m) for m in ("to", "float", "type_as", "type") if method_call(operand, m)), None
        )
        return call is not None and normalized(call.func.value, seen)

    calls: list[ast.Call] = []

    def factors(node: ast.expr) -> list[ast.expr]:
        """The factors of a product chain: `F.normalize(x, dim=1) * self.g * self.scale` has three."""
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            return [*factors(node.left), *factors(node.right)]
        return [node]

    for node in fn.nodes:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            parts = factors(node)
            for i, operand in enumerate(parts):
                calls.clear()
                if normalized(operand) and any(sqrt_scale(other) for other in parts[:i] + parts[i + 1 :]):
                    dims = {source(argument(c, 2, "dim") or ast.Constant(1)) for c in calls}
                    # F.normalize's default dim is 1: channels first (denoising-diffusion's `dim = 1`)
                    across = (
                        "" if dims == {"-1"} else f" (and it normalises dim {', '.join(sorted(dims))}, not the last)"
                    )
                    return Outcome(
                        RMS_NORM,
                        "RMS-like normalisation not fused: `F.normalize` divides by max(norm, eps), where"
                        f" npu_rms_norm adds eps to the mean square: the two differ for small inputs{across}",
                        remedy="to fuse it, compute it as x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)"
                        + (" with the normalised dim moved last" if across else ""),
                    )
    return None


def _assigned(fn: Function, name: str) -> list[ast.expr]:
    """The values the function assigns to `name` (plain `name = value` statements, in any branch)."""
    return [
        node.value
        for node in fn.nodes
        if isinstance(node, ast.Assign)
        and any(isinstance(target, ast.Name) and target.id == name for target in node.targets)
    ]


def _unfolded_sites(fn: Function) -> bool:
    """`t * rsqrt(v + eps)` (or `t / sqrt(v + eps)`) where `v` is assigned, in branches, a mean of a square
    (timm's `rms_norm`, whose mean differs under TorchScript): not foldable, so no proof, but an RMSNorm
    that deserves a finding. An RMSD (`sqrt(mean(d²) + eps)` scaling nothing) is none."""

    def root_of_mean_square(call: ast.expr, names: set[str]) -> bool:
        if not isinstance(call, ast.Call) or call.args:
            inner = call.args[0] if isinstance(call, ast.Call) and len(call.args) == 1 else None
        else:
            inner = call.func.value if isinstance(call.func, ast.Attribute) else None
        if not (isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.Add)):
            return False
        return any(is_mean_square(side, names) for side in (inner.left, inner.right))

    def is_mean_square(node: ast.expr, names: set[str]) -> bool:
        if isinstance(node, ast.Name):
            if node.id in names:  # `v = v.mean(...)`: followed once
                return False
            return any(is_mean_square(value, names | {node.id}) for value in _assigned(fn, node.id))
        mean = _mean(node, fn)
        # the square is followed apart: `v = x.pow(2)` then `v = v.mean(...)` reuses the name
        return mean is not None and is_square(mean[0], set())

    def centred(node: ast.expr) -> bool:
        """`x - mean`, directly or through a name: a LayerNorm's variance, not an RMSNorm's mean square."""
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
            return True
        return isinstance(node, ast.Name) and any(centred(v) for v in _assigned(fn, node.id) if v is not node)

    def is_square(node: ast.expr, names: set[str]) -> bool:
        base = _square_base(node, fn)
        if base is not None:
            return not centred(base)
        if isinstance(node, ast.Name) and node.id not in names:
            return any(is_square(value, names | {node.id}) for value in _assigned(fn, node.id))
        return False

    def is_root(node: ast.expr, names: tuple[str, ...]) -> bool:
        return isinstance(node, ast.Call) and (
            fn.qualname(node.func) in tuple(f"torch.{n}" for n in names)
            or (
                isinstance(node.func, ast.Attribute)
                and node.func.attr in names
                and fn.qualname(node.func) is None
                and not node.args
            )
        )

    for node in fn.nodes:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            roots = [side for side in (node.left, node.right) if is_root(side, ("rsqrt",))]
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            roots = [node.right] if is_root(node.right, ("sqrt",)) else []
        else:
            continue
        if any(root_of_mean_square(root, set()) for root in roots):
            return True
    return False


def match(fn: Function) -> Outcome | None:
    if _calls_kernel(fn):
        return None
    try:
        result = fold(fn)
    except NotStraightLine as why:
        if sites(fn.tree, fn) or _functional_calls(fn.tree, fn) or _unfolded_sites(fn):
            ways = _ways_outcome(fn)
            if ways is not None:
                return ways
            refused = refused_read(fn)
            message = f"RMS normalisation not fused: {why}" + (
                f"; a branch in front cannot repeat its `if`'s test: {refused}" if refused else ""
            )
            return Outcome(RMS_NORM, message, remedy=STRAIGHT_LINE)
        return _normalize_decline(fn)
    return _folded_outcome(fn, result)


def _way_outcome(fn: Function) -> Outcome | None:
    """What one way through the function's `if`s (`parameter_paths`) is: matched as straight-line code."""
    try:
        result = fold(fn)
    except NotStraightLine as why:
        return Outcome(RMS_NORM, f"RMS normalisation not fused: {why}", remedy=STRAIGHT_LINE)
    return _folded_outcome(fn, result)


def _ways_outcome(fn: Function) -> Outcome | None:
    """A branch per way through the function's `if`s on parameters and the module's own configuration
    (`not self.force_fp32`, `self.weight is not None`, T5's `self.weight.dtype in [torch.float16,
    torch.bfloat16]`: `ways.stable_reads`) that is RMSNorm, each guarded by its way's tests, under one
    `_is_npu`, in front of the untouched body. The tests are evaluated again where the original evaluates
    them, and get the same answers: at most one way's guards hold, and where its kernel does not apply the
    original runs. When no way fuses, the first way's decline, saying where; None when no way is RMSNorm."""
    paths = parameter_paths(fn, reads=stable_reads(fn))
    if paths is None:
        return None
    fused, declined = split_ways(paths, _way_outcome)
    if not fused:
        return first_decline(declined)
    # Each of the way's tests is an `if` of its own, around the kernel's guards: TorchScript compiles the
    # body of `if self.weight is not None:` only where the attribute is not None, but every operand of an
    # `and` (`self.weight.shape` of a None weight fails to compile).
    branches = [{**outcome.context, "tests": conditions(path)} for path, outcome in fused]
    message = (
        f"RMSNorm gets a fused `torch_npu.npu_rms_norm` branch per way through its `if`s ({len(fused)} of"
        f" {len(paths)} ways)"
    )
    if declined:
        path, outcome = declined[0]
        message += f"; not where {where(path)}: {outcome.message}"
    return Outcome(RMS_NORM, message, TEMPLATE, {"x": fused[0][1].context["x"], "paths": branches})


def _folded_outcome(fn: Function, result: ast.expr) -> Outcome | None:
    """What the function is, given the one expression it folds to."""
    found = sites(result, fn)
    if not found:
        functional = _functional_calls(result, fn)
        if functional:
            return _match_functional(fn, result, functional)
        return _normalize_decline(fn)
    if len(found) > 1:
        return Outcome(
            RMS_NORM,
            "RMS normalisation not fused: the function normalises more than once",
            remedy="to fuse it, give each normalisation its own function",
        )
    site = found[0]
    squared, why, remedy = _check_site(site, fn)
    if squared is None:
        return Outcome(RMS_NORM, f"RMS-like normalisation not fused: {why}", remedy=remedy)
    return _match_output(fn, result, site, squared)


def _match_output(fn: Function, result: ast.expr, site: Site, squared: ast.expr) -> Outcome | None:
    core = next((n for n in walk_shared(result) if _core(n, site) is not None), None)
    # HuggingFace T5's `x * rsqrt(mean(x.float()²) + eps)`: a half x times a float32 root promotes to
    # `x.float() * ...`, exactly (every fp16 / bf16 value is a float32); guarded to those dtypes below.
    promoted = (
        core is not None and upcast_base(squared, fn) is not None and same(_core(core, site), upcast_base(squared, fn))
    )
    if core is None or not (same(_core(core, site), squared) or promoted):
        factor = _match_factor(fn, result, site, squared)
        if factor is not None:
            return factor
        return Outcome(
            RMS_NORM,
            "RMS normalisation not fused: it scales a different tensor than it squares",
            remedy="nothing in the code can: npu_rms_norm scales the tensor it squares",
        )
    upcast = upcast_base(squared, fn)
    x = upcast if upcast is not None else squared
    if not (isinstance(x, ast.Name) and x.id in fn.params):
        return Outcome(
            RMS_NORM,
            "RMS normalisation not fused: the normalised tensor is not a parameter of the function",
            remedy=PARAMETER,
        )
    if _mentions(site.eps, x.id):
        return Outcome(RMS_NORM, "RMS normalisation not fused: eps depends on the input", remedy=EPS_CONSTANT)

    def lift(node: ast.expr) -> ast.expr:
        inner = downcast_inner(node, x)
        return node if inner is None else inner

    weight = None
    cast_back = False
    after_cast = False  # Llama style: the weight multiplies the result of the cast back
    if isinstance(result, ast.BinOp) and isinstance(result.op, ast.Mult):
        for w, normed in ((result.left, result.right), (result.right, result.left)):
            if lift(normed) is core:
                weight, cast_back, after_cast = w, lift(normed) is not normed, True
                break
            if is_pure(w) and downcast_inner(normed, w) is core:
                # T5's `w * norm.to(w.dtype)`: the branch's guard `w.dtype == x.dtype` makes it the cast back
                weight, cast_back, after_cast = w, True, True
                break
    if weight is None:
        inner = lift(result)
        cast_back = inner is not result
        if inner is core:
            if fn.is_method and any(
                isinstance(n, ast.Attribute) and n.attr == fn.tree.name
                for name, sibling in fn.siblings.items()
                if name != fn.tree.name
                for n in ast.walk(sibling)
            ):
                return None  # a helper such as Gemma's `_norm`: its caller is the candidate
            return Outcome(
                RMS_NORM,
                "RMS normalisation not fused: there is no weight to pass as gamma",
                remedy="to fuse it, multiply the result by a weight parameter, or call F.rms_norm",
            )
        if isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.Mult):
            for w, normed in ((inner.left, inner.right), (inner.right, inner.left)):
                if normed is core:
                    weight = w
                    break
    if weight is None:
        return Outcome(
            RMS_NORM,
            "RMS normalisation not fused: the result is combined with more than a weight",
            remedy="to fuse it, return the weighted norm and combine it in the caller",
        )
    if _mentions(weight, x.id):
        return Outcome(
            RMS_NORM,
            "RMS normalisation not fused: the weight depends on the input",
            remedy="nothing in the code can: npu_rms_norm's gamma is a fixed tensor",
        )
    leaf = _weight_leaf(weight, fn)
    if leaf is None:
        return Outcome(
            RMS_NORM,
            f"RMS normalisation not fused: the weight `{source(weight)}` is not a parameter or `1 + parameter`",
            remedy="to fuse it, multiply by a parameter or attribute (or `1 + parameter`)",
        )
    leaf, weight_fp32 = leaf
    # Never cast back (T5 with a float32 weight: `w * (x * rsqrt(mean(x.float()²) + eps))`): the original
    # returns float32 for every input and weight dtype the kernel takes, and so does the kernel on `x.float()`.
    float_result = upcast is not None and not cast_back

    if not set(fn.fast_path_tensors) <= {x.id}:
        return Outcome(
            RMS_NORM,
            "RMS normalisation not fused: its CUDA fast path tests another tensor than it normalises",
            remedy="to fuse it, test the normalised tensor's device in the fast path",
        )

    xs = source(x)
    guards = [f"2 <= {xs}.dim() <= 8", f"{source(leaf)}.shape == {xs}.shape[-1:]"]
    if site.dim is not None:
        guards.append(f"{source(site.dim)} in (-1, {xs}.dim() - 1)")
    if promoted and (float_result or not after_cast):
        # a float64 x would promote the original's product to float64, not float32
        guards.append(f"{xs}.dtype in {KERNEL_DTYPES}")
    if float_result or upcast is not None and not after_cast:
        # The original multiplies in float32 (and casts back): so does the branch, with an fp32 gamma.
        gamma = weight if weight_fp32 else ast.Call(ast.Attribute(weight, "float", ast.Load()), [], [])
        if not weight_fp32:
            guards.append(f"{source(leaf)}.dtype in {KERNEL_DTYPES}")
        cast = "" if float_result else f".to({xs}.dtype)"
        context = {"x_arg": f"{xs}.float()", "gamma": source(gamma), "cast": cast}
    else:
        if weight_fp32:
            return Outcome(
                RMS_NORM,
                "RMS normalisation not fused: a float32 weight on the input-dtype result promotes it",
                remedy="to fuse it, keep the weight in the input's dtype, or multiply before casting back",
            )
        guards += [f"{source(leaf)}.dtype == {xs}.dtype", f"{xs}.dtype in {KERNEL_DTYPES}"]
        context = {"x_arg": xs, "gamma": source(weight), "cast": ""}
    context.update(x=xs, eps=source(site.eps), guards=guards)
    return Outcome(RMS_NORM, "RMSNorm gets a fused `torch_npu.npu_rms_norm` branch", TEMPLATE, context)


def _promoted_fp32(dtype: ast.expr, fn: Function, tensors: set[str]) -> bool:
    """float32, or `torch.promote_types` of float32 with the dtypes of `tensors` (`reduce(promote_types,
    (x.dtype, w.dtype, torch.float32))` too): float32 wherever those are fp16 / bf16 / fp32 (guarded)."""
    if _is_fp32(dtype, fn):
        return True
    if not isinstance(dtype, ast.Call) or dtype.keywords:
        return False
    name = fn.qualname(dtype.func)
    if name == "torch.promote_types" and len(dtype.args) == 2:
        parts = list(dtype.args)
    elif (
        name in ("functools.reduce", "reduce")
        and len(dtype.args) == 2
        and fn.qualname(dtype.args[0]) == "torch.promote_types"
        and isinstance(dtype.args[1], (ast.Tuple, ast.List))
    ):
        parts = list(dtype.args[1].elts)
    else:
        return False

    def known(part: ast.expr) -> bool:
        return (
            isinstance(part, ast.Attribute)
            and part.attr == "dtype"
            and isinstance(part.value, ast.Name)
            and part.value.id in tensors
        ) or _promoted_fp32(part, fn, tensors)

    return all(known(part) for part in parts) and any(_promoted_fp32(part, fn, tensors) for part in parts)


def _match_factor(fn: Function, result: ast.expr, site: Site, squared: ast.expr) -> Outcome | None:
    """Katherine Crowson's `x * (w.to(dtype) * rsqrt(mean(x.to(dtype) ** 2, -1, keepdim=True) + eps)).to(x.dtype)`
    (k-diffusion, stable-audio-tools), `dtype` float32 or promoted with it (`.float()` reads as float32): the factor `w * rsqrt(...)` is
    computed in float32, cast to x's dtype, then scales x. In float32 that is RMSNorm exactly; in fp16 / bf16
    it rounds the factor before the product, where the kernel rounds once: within the kernel's precision.
    None when `result` has another shape (the caller declines)."""
    if site.divide or not isinstance(result, ast.BinOp) or not isinstance(result.op, ast.Mult):
        return None
    for x, scaled in ((result.left, result.right), (result.right, result.left)):
        if not (isinstance(x, ast.Name) and x.id in fn.params):
            continue
        factor = downcast_inner(scaled, x)
        if not (isinstance(factor, ast.BinOp) and isinstance(factor.op, ast.Mult)):
            continue
        for cast_weight, root in ((factor.left, factor.right), (factor.right, factor.left)):
            if root is not site.root:
                continue
            call = method_call(cast_weight, "to")
            weight = cast_weight
            if call is not None and len(call.args) == 1 and not call.keywords:
                weight = call.func.value
            elif (upcast := method_call(cast_weight, "float")) is not None and not upcast.args and not upcast.keywords:
                # `w.float()` is `w.to(torch.float32)`: nothing left to check of the weight's cast
                weight = upcast.func.value
            weight_name = weight.id if isinstance(weight, ast.Name) else None
            leaf = _weight_leaf(weight, fn)
            if leaf is None or leaf[1] or _mentions(weight, x.id) or _mentions(site.eps, x.id):
                return None
            tensors = {x.id} | ({weight_name} if weight_name else set())
            for cast in (call, method_call(squared, "to")):
                if cast is not None and not (len(cast.args) == 1 and _promoted_fp32(cast.args[0], fn, tensors)):
                    return None
            up = upcast_base(squared, fn)
            if up is None:
                to = method_call(squared, "to")
                up = to.func.value if to is not None else None
            if not (isinstance(up, ast.Name) and up.id == x.id):
                return None
            xs, ws = x.id, source(weight)
            guards = [
                f"2 <= {xs}.dim() <= 8",
                f"{source(leaf[0])}.shape == {xs}.shape[-1:]",
                f"{xs}.dtype in {KERNEL_DTYPES}",
                f"{ws}.dtype in {KERNEL_DTYPES}",
            ]
            if site.dim is not None:
                guards.append(f"{source(site.dim)} in (-1, {xs}.dim() - 1)")
            context = {
                "x": xs,
                "guards": guards,
                "x_arg": f"{xs}.float()",
                "gamma": f"{ws}.float()",
                "cast": f".to({xs}.dtype)",
                "eps": source(site.eps),
            }
            return Outcome(
                RMS_NORM,
                "RMSNorm (its weight times the root, cast to the input's dtype, then scaling it) gets a fused"
                " `torch_npu.npu_rms_norm` branch in float32",
                TEMPLATE,
                context,
            )
    return None


def _functional_calls(expr: ast.AST, fn: Function) -> list[ast.Call]:
    if not fn.may_call(FUNCTIONAL):
        return []
    return [n for n in walk_shared(expr) if isinstance(n, ast.Call) and fn.qualname(n.func) in FUNCTIONAL]


def _is_last_dim_shape(shape: ast.expr, x: ast.expr) -> bool:
    """`(x.size(-1),)`, `(x.shape[-1],)`, `[x.shape[-1]]` or `x.shape[-1:]`: the last dim, by construction."""
    minus_one = ast.UnaryOp(ast.USub(), ast.Constant(1))
    last = [
        ast.Call(ast.Attribute(x, "size", ast.Load()), [minus_one], []),
        ast.Subscript(ast.Attribute(x, "shape", ast.Load()), minus_one, ast.Load()),
    ]
    if isinstance(shape, (ast.Tuple, ast.List)) and len(shape.elts) == 1:
        return any(same(shape.elts[0], e) for e in last)
    tail = ast.Subscript(ast.Attribute(x, "shape", ast.Load()), ast.Slice(minus_one, None, None), ast.Load())
    return same(shape, tail)


def _match_functional(fn: Function, result: ast.expr, calls: list[ast.Call]) -> Outcome:
    """`F.rms_norm(x, shape, weight, eps)`, optionally on `x.float()` and cast back: the kernel takes the same
    arguments, with a gamma of ones when there is no weight."""
    if len(calls) > 1:
        return Outcome(
            RMS_NORM,
            "RMS normalisation not fused: the function normalises more than once",
            remedy="to fuse it, give each normalisation its own function",
        )
    call = calls[0]
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return Outcome(
            RMS_NORM,
            "RMS normalisation not fused: `rms_norm` takes unpacked arguments",
            remedy="to fuse it, pass its arguments one by one",
        )
    tensor, shape = argument(call, 0, "input"), argument(call, 1, "normalized_shape")
    weight, eps = argument(call, 2, "weight"), argument(call, 3, "eps")
    if tensor is None or shape is None:
        return Outcome(
            RMS_NORM,
            "RMS normalisation not fused: `rms_norm` is called without its input or shape",
            remedy="to fuse it, pass the input and normalized_shape",
        )
    # eps omitted or None: rms_norm's default is the epsilon of the type it computes in, float32 for every
    # dtype the kernel takes (fp16 / bf16 are computed in float32: not their own finfo().eps, which is
    # 8192x / 65536x larger). The kernel needs it explicitly; TorchScript has no torch.finfo, so a literal.
    default_eps = eps is None or isinstance(eps, ast.Constant) and eps.value is None
    upcast = upcast_base(tensor, fn)
    x = upcast if upcast is not None else tensor
    if upcast is not None and weight is not None and upcast_base(weight, fn) is not None:
        # `rms_norm(x.float(), shape, w.float(), eps)`: the branch's gamma is `w.float()` as it is
        weight = upcast_base(weight, fn)
    if not (isinstance(x, ast.Name) and x.id in fn.params):
        return Outcome(
            RMS_NORM,
            "RMS normalisation not fused: the normalised tensor is not a parameter of the function",
            remedy=PARAMETER,
        )
    if not set(fn.fast_path_tensors) <= {x.id}:
        return Outcome(
            RMS_NORM,
            "RMS normalisation not fused: its CUDA fast path tests another tensor than it normalises",
            remedy="to fuse it, test the normalised tensor's device in the fast path",
        )
    for part, what in ((shape, "the shape"), (weight, "the weight"), (None if default_eps else eps, "eps")):
        if part is not None and not (isinstance(part, ast.Constant) and part.value is None):
            constant_shape = (
                part is shape
                and isinstance(shape, ast.Tuple)
                and all(is_pure(e) and not _mentions(e, x.id) for e in shape.elts)
            )  # `(self.dim,)`: the guards below pin it to the last dim (not a list: TorchScript cannot size
            # `tuple([self.dim])` in the guard)
            if not (is_pure(part) or constant_shape) and not (part is shape and _is_last_dim_shape(shape, x)):
                return Outcome(
                    RMS_NORM,
                    f"RMS normalisation not fused: {what} is computed, not a constant or attribute",
                    remedy=f"to fuse it, pass {what} as a constant or attribute",
                )
            if _mentions(part, x.id) and part is not shape:
                return Outcome(
                    RMS_NORM,
                    f"RMS normalisation not fused: {what} depends on the input",
                    remedy="nothing in the code can: npu_rms_norm takes it as a fixed value",
                )
    has_weight = weight is not None and not (isinstance(weight, ast.Constant) and weight.value is None)
    if has_weight and not isinstance(weight, (ast.Name, ast.Attribute)):
        # `weight=self.weight + 1.0` (Krea 2): the branch reads the weight in its guards and its call, so it
        # would compute it three times, where the original does once.
        return Outcome(
            RMS_NORM,
            f"RMS normalisation not fused: the weight `{source(weight)}` is computed in the call",
            remedy="to fuse it, pass a parameter or attribute as the weight (an offset folded into it at load time)",
        )
    inner = downcast_inner(result, x)
    if result is not call and not (upcast is not None and inner is call):
        return Outcome(
            RMS_NORM,
            "RMS normalisation not fused: the result is combined with more than the norm",
            remedy="to fuse it, return the norm and combine it in the caller",
        )
    xs = source(x)
    guards = [f"2 <= {xs}.dim() <= 8"]
    for part in (weight, eps):
        # A parameter may be None at run time (rms_norm's own default): the kernel needs a tensor and a float.
        if isinstance(part, ast.Name) and part.id in fn.params:
            guards.append(f"{part.id} is not None")
    if has_weight:
        # rms_norm itself requires weight.shape == normalized_shape: this pins the shape to the last dim.
        guards.append(f"{source(weight)}.shape == {xs}.shape[-1:]")
    elif not _is_last_dim_shape(shape, x):
        guards.append(f"tuple({source(shape)}) == {xs}.shape[-1:]")
    if upcast is not None:
        gamma = f"{source(weight)}.float()" if has_weight else f"{xs}.new_ones({xs}.shape[-1:], dtype=torch.float32)"
        if has_weight:
            guards.append(f"{source(weight)}.dtype in {KERNEL_DTYPES}")
        cast = f".to({xs}.dtype)" if result is not call else ""
        context = {"x_arg": f"{xs}.float()", "gamma": gamma, "cast": cast}
    else:
        # The original's result has the promoted dtype of x and the weight: the kernel's is x's.
        if has_weight:
            guards.append(f"{source(weight)}.dtype == {xs}.dtype")
        guards.append(f"{xs}.dtype in {KERNEL_DTYPES}")
        gamma = source(weight) if has_weight else f"{xs}.new_ones({xs}.shape[-1:])"
        context = {"x_arg": xs, "gamma": gamma, "cast": ""}
    context.update(x=xs, eps=FLOAT32_EPS if default_eps else source(eps), guards=guards)
    message = "RMSNorm gets a fused `torch_npu.npu_rms_norm` branch"
    if default_eps:
        # The branch has no room for a comment (the layout drops them): the finding says what the literal is.
        message += (
            f"; eps is not given, so the branch passes rms_norm's default, {FLOAT32_EPS} (float32's machine"
            " epsilon, which torch uses for fp16 / bf16 inputs too: it computes them in float32)"
        )
    return Outcome(RMS_NORM, message, TEMPLATE, context)


IDIOM = Idiom(
    rule=RMS_NORM,
    markers=("rsqrt", "sqrt", "rms_norm", "normalize"),
    # `sqrt` alone: every attention's `sqrt(head_dim)`
    identifiers=("rsqrt", ("sqrt", "mean"), "rms_norm", "normalize"),
    kernels=("npu_rms_norm",),
    match=match,
    template=TEMPLATE,
)
