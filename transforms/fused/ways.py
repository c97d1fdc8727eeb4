"""The ways through a function's `if`s, fused one by one: what a test may read, and the loop over the ways.

`symbolic.parameter_paths` splits a function at its `if`s into straight-line functions, one per way, where a
branch in front of the body may evaluate each `if`'s test again and get the same answer, with no side
effect. Parameters the body never rebinds are such reads; so are, with `stable_reads`, the module's own
configuration (stable-audio-tools' `if not self.force_fp32:`, diffusers' `if self.weight is not None:`,
HuggingFace T5's `if self.weight.dtype in [torch.float16, torch.bfloat16]:`): an attribute of `self` that
the class binds only in `__init__`, to plain data (a constant, a name, a parameter tensor), and defines no
method, property or class attribute of, and of a tensor attribute only `.dtype` / `.shape` / `.ndim`. An
attribute bound anywhere else (a `forward` that flips the flag) or computed on each read (a property) is
refused, with the reason (`attribute_problem`) for the finding.

`split_ways` is the loop an idiom runs over the ways: each is matched as a straight-line function; the
ways whose outcome is a branch in front of the body are fused, each guarded by its way's tests
(`conditions`), and the first way that declines is named in the finding (`where`).
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from npu_migrate.transforms.fused.symbolic import (
    Function,
    NotStraightLine,
    Outcome,
    Path,
    _bindings,
    _subclasses,
    body_statements,
    cuda_only_tensor,
    is_pure,
    nodes_of,
    source,
)

#: The reads of a tensor attribute a test may make again: metadata, no computation.
TENSOR_READS = frozenset(("dtype", "shape", "ndim"))

#: Calls whose value is a fresh tensor (the attribute then holds a tensor, and its `.dtype` is data).
TENSOR_MAKERS = frozenset(
    (
        "torch.nn.Parameter",
        "torch.nn.parameter.Parameter",
        "torch.ones",
        "torch.zeros",
        "torch.empty",
        "torch.full",
        "torch.randn",
        "torch.rand",
        "torch.tensor",
    )
)

#: The dtypes a test may compare with (`torch.float16`): module constants.
DTYPES = frozenset(
    f"torch.{name}"
    for name in (
        "float16",
        "half",
        "bfloat16",
        "float32",
        "float",
        "float64",
        "double",
        "int8",
        "int16",
        "int32",
        "int64",
        "long",
        "uint8",
        "bool",
    )
)

_REGISTER = ("register_buffer", "register_parameter")


def stable_reads(fn: Function) -> Callable[[ast.expr], bool]:
    """The `reads` of `parameter_paths`: the attribute reads of a test that `attribute_problem` accepts."""
    return lambda node: attribute_problem(fn, node) is None


def attribute_problem(fn: Function, node: ast.Attribute) -> str | None:
    """None when a test may read `node` again with the same result and no side effect: a torch dtype, an
    attribute of `self` the class binds only in `__init__` to plain data, or `.dtype` / `.shape` / `.ndim`
    of one bound only to tensors. Otherwise why not, for the finding."""
    if fn.qualname(node) in DTYPES:
        return None
    self_name = fn.self_name
    chain = node
    tensor = False
    if isinstance(chain.value, ast.Attribute) and chain.attr in TENSOR_READS:
        chain, tensor = chain.value, True
    if not (isinstance(chain.value, ast.Name) and self_name is not None and chain.value.id == self_name):
        return f"`{source(node)}` is not an attribute of the module, nor a tensor attribute's dtype or shape"
    return _data_attribute(fn, chain.attr, tensor)


def _data_attribute(fn: Function, attr: str, tensor: bool) -> str | None:
    owner = fn.owner
    if owner is None or "__init__" not in fn.siblings:
        return f"`self.{attr}` is not bound in this class's `__init__`"
    subclasses = _subclasses(fn.module, owner)
    for cls in (owner, *subclasses, *_bases(fn.module, owner)):
        for stmt in cls.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == attr:
                return f"`{cls.name}` defines `{attr}` as a method or property: reading it may compute something"
            # `weight: Tensor` alone annotates the instance attribute: no class attribute
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
            if isinstance(stmt, ast.AnnAssign) and stmt.value is None:
                continue
            if any(isinstance(t, ast.Name) and t.id == attr for t in targets):
                return f"`{cls.name}` has a class attribute `{attr}`"
    values: list[ast.expr] = []
    for cls in (owner, *subclasses):
        init = next((s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
        in_init = {id(n) for n in nodes_of(init)} if init is not None else set()
        for binding in _bindings(cls, attr):
            if id(binding) not in in_init:
                return f"`self.{attr}` is bound outside `__init__` (line {binding.lineno})"
        for node in nodes_of(cls):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _REGISTER:
                first = node.args[0] if node.args else None
                if isinstance(first, ast.Constant) and first.value == attr:
                    if id(node) not in in_init:
                        return f"`self.{attr}` is registered outside `__init__` (line {node.lineno})"
                    values.append(node)
        for node in nodes_of(init) if init is not None else ():
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Attribute) and t.attr == attr for t in targets):
                    values.append(node.value)
    if not values:
        return f"`self.{attr}` is not bound in this class's `__init__`"
    for value in values:
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _REGISTER:
            held = value.args[1] if len(value.args) > 1 else None
            made = held is not None and not (isinstance(held, ast.Constant) and held.value is None)
        else:
            made = isinstance(value, ast.Call) and fn.qualname(value.func) in TENSOR_MAKERS
        if tensor and not made:
            return f"`self.{attr}` is not always a tensor (line {value.lineno}: `{source(value)}`)"
        if not made and not _plain(value):
            return f"`self.{attr}` holds a computed object (line {value.lineno}: `{source(value)}`)"
    return None


def _plain(value: ast.expr) -> bool:
    """Constants, names, attributes and what compares or combines them: data, whose truth costs nothing."""
    if is_pure(value):
        return True
    if isinstance(value, ast.UnaryOp):
        return _plain(value.operand)
    if isinstance(value, ast.BoolOp):
        return all(_plain(v) for v in value.values)
    if isinstance(value, ast.Compare):
        return all(_plain(p) for p in (value.left, *value.comparators))
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in ("bool", "int", "float"):
        return len(value.args) == 1 and not value.keywords and _plain(value.args[0])
    return False


def _bases(module: ast.Module | None, cls: ast.ClassDef) -> list[ast.ClassDef]:
    """The classes of the file `cls` derives from, directly or through one another."""
    if module is None:
        return []
    classes = {n.name: n for n in nodes_of(module) if isinstance(n, ast.ClassDef) and n is not cls}
    found: list[ast.ClassDef] = []
    todo = [cls]
    while todo:
        for base in todo.pop().bases:
            name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
            if name in classes and classes[name] not in found:
                found.append(classes[name])
                todo.append(classes[name])
    return found


def refused_read(fn: Function) -> str | None:
    """Why the body's first statement that is not an assignment, when it is an `if` (past a CUDA-only fast
    path, which `fold` reads through), cannot be split at: its test calls something, or the reason
    `attribute_problem` gives for its first refused read (for the finding). None otherwise: the body stops
    being straight-line code somewhere else (OLMo's `with torch.autocast(...)`)."""
    for stmt in body_statements(fn.tree):
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            continue
        if not isinstance(stmt, ast.If):
            return None
        if cuda_only_tensor(stmt.test, fn) is not None:
            continue
        calls = [n for n in ast.walk(stmt.test) if isinstance(n, ast.Call)]
        if calls:
            return f"its test calls `{source(calls[0].func)}`, which may compute something else when called again"
        for node in ast.walk(stmt.test):
            if isinstance(node, ast.Attribute):
                problem = attribute_problem(fn, node)
                if problem is not None:
                    return problem
        return None
    return None


def conditions(path: Path) -> list[str]:
    """The path's tests as guards, to be joined by `and`: an `or` keeps its parentheses."""
    return [
        f"({source(c)})" if isinstance(c, ast.BoolOp) and isinstance(c.op, ast.Or) else source(c)
        for c in path.conditions
    ]


def where(path: Path) -> str:
    return " and ".join(f"`{source(c)}`" for c in path.conditions) or "no test holds"


def split_ways(
    paths: list[Path], outcome_of: Callable[[Function], Outcome | None]
) -> tuple[list[tuple[Path, Outcome]], list[tuple[Path, Outcome]]]:
    """The ways whose outcome is a branch in front of the body, on one tensor (the first fused way's `x`),
    and the ways that declined, in order. A way that is not straight-line code (`NotStraightLine`) or is
    not the idiom (None) is neither: the original runs there."""
    fused: list[tuple[Path, Outcome]] = []
    declined: list[tuple[Path, Outcome]] = []
    for path in paths:
        try:
            outcome = outcome_of(path.function)
        except NotStraightLine:
            continue
        if outcome is None:
            continue
        if outcome.template is not None and outcome.before is None and path.function.autocast_off is None:
            if not fused or outcome.context["x"] == fused[0][1].context["x"]:
                fused.append((path, outcome))
                continue
        declined.append((path, outcome))
    return fused, declined


def first_decline(declined: list[tuple[Path, Outcome]]) -> Outcome | None:
    """Where no way fused: the first way's decline, saying where it holds; None when no way is the idiom."""
    if not declined:
        return None
    path, outcome = declined[0]
    outcome.message = f"{outcome.message} (where {where(path)})"
    return outcome
