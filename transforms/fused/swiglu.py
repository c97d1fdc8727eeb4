"""NPU702: hand-written SwiGLU gets a `torch_npu.npu_swiglu` branch.

`npu_swiglu(t, dim)` splits `t` in halves A, B along `dim` and returns `silu(A) * B`: SiLU on the
FIRST half. The idiom `act(a) * b` (either operand order: the product commutes exactly) maps to
`npu_swiglu(cat((a, b), -1))`, or to `npu_swiglu(t, dim)` when `a, b = t.chunk(2, dim)` already are the
halves of one tensor. The rest of the function's expression (`down_proj(...)`) is kept as written.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from npu_migrate.engine.rule import EVERY_TARGET, Example, FixSafety, Rule
from npu_migrate.transforms.fused.idiom import Idiom
from npu_migrate.transforms.fused.symbolic import (
    STRAIGHT_LINE,
    Function,
    NotStraightLine,
    Outcome,
    argument,
    body_statements,
    evaluated_nodes,
    evaluates_twice,
    fold,
    is_pure,
    source,
    statement_blocks,
    substitute_children,
    walk_shared,
)

SWIGLU = Rule(
    id="NPU702",
    name="fused-swiglu",
    family="fused",
    summary="hand-written SwiGLU (`silu(gate) * up`) gets a guarded `torch_npu.npu_swiglu` branch",
    what="""
    Recognises `act(gate) * up` where `act` is SiLU: `F.silu`, `nn.SiLU()` or a configurable activation
    attribute (`self.act_fn = ACT2FN[config.hidden_act]`). A configurable activation is checked at run
    time (`_is_silu`, which knows `nn.SiLU` and transformers' `SiLUActivation`), so a model configured
    with GELU keeps its original code. Separate gate and up tensors are concatenated (guarded by equal
    shapes: `torch.cat` would silently accept a broadcast operand); `gate, up = x.chunk(2, -1)` passes
    `x` itself. The branch runs only on an NPU; otherwise the original code runs.

    A function with control flow (a flag after the MLP, a loop over experts, a logging call) gets a
    branch in place of each statement that gates, `if _is_npu(x): <the statement, fused> else: <the
    statement>` (a `return` needs no `else:`), so everything around it runs as written; a linter's
    comment on the statement (noqa, type: ignore) is carried to its fused copy.

    Where the branch in front of the body would evaluate a projection twice (a name read twice once
    folded: `(act(gate.float()) * up.float()).to(gate.dtype)`) or the function gates twice, each gating
    statement gets its branch in place, reading the names as they are. The branch tests a name that
    provably holds a tensor and that the statement computes whatever happens (never a gate in the sides
    of `... if ... else ...`).

    Declined, with a finding: `up, gate = x.chunk(2, -1)` with SiLU on the second half (the kernel
    activates the first half; swapping would copy the whole tensor), a tensor gating itself
    (`silu(h) * h`: the kernel would need it joined to itself), a statement that gates twice or shares
    its line, no tensor to test. GELU gates are not SwiGLU and are left alone.
    """,
    why="""
    `torch_npu.npu_swiglu` computes the activation and the product in one kernel instead of two
    operators, each a kernel launch and a trip through device memory.
    """,
    example=Example(
        before="""
            import torch
            import torch.nn.functional as F
            from torch import nn


            class MLP(nn.Module):
                def __init__(self, dim, hidden):
                    super().__init__()
                    self.gate_proj = nn.Linear(dim, hidden, bias=False)
                    self.up_proj = nn.Linear(dim, hidden, bias=False)
                    self.down_proj = nn.Linear(hidden, dim, bias=False)

                def forward(self, x):
                    return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        """,
        after="""
            import torch
            import torch.nn.functional as F
            from torch import nn


            # ... fused-op helpers npu-migrate adds here: import torch_npu (guarded), _is_npu, _npu_swiglu, _npu_silu_mul


            class MLP(nn.Module):
                def __init__(self, dim, hidden):
                    super().__init__()
                    self.gate_proj = nn.Linear(dim, hidden, bias=False)
                    self.up_proj = nn.Linear(dim, hidden, bias=False)
                    self.down_proj = nn.Linear(hidden, dim, bias=False)

                def forward(self, x):
                    if _is_npu(x):
                        return self.down_proj(
                            _npu_silu_mul(self.gate_proj(x), self.up_proj(x))
                        )
                    return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
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

TEMPLATE = "fused/swiglu.py.j2"
#: The branch in place of one statement of a function with control flow (`_in_place_outcome`).
IN_PLACE_TEMPLATE = "fused/swiglu_in_place.py.j2"
#: `_is_silu(act)`: whether a configurable activation is SiLU, checked at run time.
IS_SILU = "fused/is_silu.py.j2"
#: `_npu_silu_mul(gate, up)`: the kernel on two operands concatenated, where their shapes allow.
SILU_MUL = "fused/silu_mul.py.j2"
SWIGLU_HALVES = "fused/swiglu_halves.py.j2"
_ACTIVATION_FACTORIES = ("ACT2FN", "get_activation", "ACT2CLS")


def _activation(call: ast.expr, fn: Function) -> tuple[ast.expr, str | None] | None:
    """(the activated tensor, the runtime check needed or None) if `call` applies SiLU."""
    if not (isinstance(call, ast.Call) and len(call.args) == 1 and not call.keywords):
        return None
    func = call.func
    if fn.qualname(func) == "torch.nn.functional.silu":
        return call.args[0], None
    if isinstance(func, ast.Call) and fn.qualname(func.func) == "torch.nn.SiLU":
        return call.args[0], None
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == fn.self_name:
        origin = fn.attribute_source(func.attr)
        configured = origin is not None and any(
            isinstance(n, ast.Name) and n.id in _ACTIVATION_FACTORIES for n in ast.walk(origin)
        )
        fixed = (
            origin is not None
            and isinstance(origin, ast.Call)
            and fn.qualname(origin.func) in ("torch.nn.SiLU", "torch.nn.modules.activation.SiLU")
        )
        # A name bound to one (`self.act = activation`, a constructor's argument) is what it is at run
        # time: `_is_silu` asks then.
        named = (origin is None or isinstance(origin, ast.Name)) and "act" in func.attr.lower()
        if configured or fixed or named:
            return call.args[0], f"_is_silu({source(func)})"
    return None


def _self_gated(gate: ast.expr) -> Outcome:
    return Outcome(
        SWIGLU,
        f"SwiGLU not fused: `{source(gate)}` gates itself; npu_swiglu would take it joined to itself, a copy the"
        " two operators it replaces do not make",
        remedy="nothing in the code can: the fused kernel would not be faster here",
    )


def _second_chunk(check: str | None) -> Outcome:
    """The decline of a gate on the second half of a split: where the activation is configurable, only
    when it is SiLU is this a SwiGLU at all."""
    activation = re.fullmatch(r"_is_silu\((.*)\)", check or "")
    where = f" (where `{activation.group(1)}` is SiLU)" if activation else ""
    return Outcome(
        SWIGLU,
        f"SwiGLU not fused{where}: SiLU is applied to the second chunk, npu_swiglu activates the first",
        remedy="to fuse it, swap the halves of the projection's weight and apply SiLU to the first chunk",
    )


def _tensor_first(name: str) -> bool:
    """Whether the torch function `name` takes a tensor first (not `torch.cat`'s list, `torch.full`'s size)."""
    return name.startswith("torch.nn.functional.") or name in ("torch.matmul", "torch.mm", "torch.bmm")


#: Methods of a tensor that nothing else a gate could be has: `x.float()` proves `x` a tensor.
_TENSOR_METHODS = frozenset(("float", "half", "bfloat16", "double", "type_as"))
#: Annotations of a parameter that is no tensor.
_SCALARS = ("int", "float", "bool", "complex", "str")


def _annotation(name: str, fn: Function) -> str | None:
    """The annotation of parameter `name`, as written, if it has one."""
    args = fn.tree.args
    arg = next((a for a in (*args.posonlyargs, *args.args, *args.kwonlyargs) if a.arg == name), None)
    return source(arg.annotation) if arg is not None and arg.annotation is not None else None


def _scalar(node: ast.expr, fn: Function) -> bool:
    """Whether `node` is a number rather than a tensor: `silu(h) * 0.5` scales, it does not gate. A constant,
    an attribute of constants (`self.scale`), a parameter annotated as a number."""
    if isinstance(node, ast.UnaryOp):
        node = node.operand
    if isinstance(node, ast.Constant) or (isinstance(node, ast.Attribute) and is_pure(node)):
        return True
    return isinstance(node, ast.Name) and _annotation(node.id, fn) in _SCALARS


def _chunk_half(node: ast.expr) -> tuple[ast.Call, int] | None:
    """(the shared `t.chunk(2, dim)` call, which half) for a name bound by tuple-unpacking a chunk."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.value, ast.Call):
        return node.value, node.slice.value
    return None


def _chunked_tensor(call: ast.Call, fn: Function) -> tuple[ast.expr, ast.expr]:
    """(tensor, dim) of `t.chunk(2, dim)` / `torch.chunk(t, 2, dim)`; dim defaults to 0."""
    if fn.qualname(call.func) == "torch.chunk":
        tensor, dim = call.args[0], argument(call, 2, "dim")
    else:
        tensor, dim = call.func.value, argument(call, 1, "dim")
    return tensor, dim if dim is not None else ast.Constant(0)


def match(fn: Function) -> Outcome | None:
    try:
        result = fold(fn)
    except NotStraightLine as why:
        if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "_is_npu" for n in fn.nodes):
            # A branch of ours is there (a second run): a `return` fused in place stays after its branch,
            # where it would be fused again.
            return None
        in_place = _in_place_outcome(fn)
        if in_place is not None:
            return in_place
        # The activation bound to a name first counts too (`h = F.silu(h)` then `h = h * up`: llama-models'
        # multimodal FeedForward, torchtitan's GroupedExperts): a SwiGLU that deserves a finding.
        activated = {
            target.id
            for n in fn.nodes
            if isinstance(n, ast.Assign) and _activation(n.value, fn)
            for target in n.targets
            if isinstance(target, ast.Name)
        }
        has_silu = any(
            isinstance(n, ast.BinOp)
            and isinstance(n.op, ast.Mult)
            and any(
                _activation(side, fn) or (isinstance(side, ast.Name) and side.id in activated)
                for side in (n.left, n.right)
            )
            for n in fn.nodes
        )
        return Outcome(SWIGLU, f"SwiGLU not fused: {why}", remedy=STRAIGHT_LINE) if has_silu else None
    gates = {}  # by identity: a product used twice in the expression is computed once
    for node in walk_shared(result):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and id(node) not in gates:
            for act, other in ((node.left, node.right), (node.right, node.left)):
                found = _activation(act, fn)
                # `silu(h) * self.scale`: an activation scaled by a parameter, not gated by a tensor.
                if found is not None and not _scalar(other, fn):
                    gates[id(node)] = (node, found[0], other, found[1])
                    break
    gates = list(gates.values())
    if not gates:
        return None
    if len(gates) > 1:
        return _in_place_or(
            fn,
            Outcome(
                SWIGLU,
                "SwiGLU not fused: the function gates more than once",
                remedy="to fuse it, give each gate a statement of its own",
            ),
        )
    product, gate, up, check = gates[0]
    if source(gate) == source(up):
        return _self_gated(gate)
    x = next((p for p in fn.params if any(isinstance(n, ast.Name) and n.id == p for n in walk_shared(result))), None)
    if x is None:
        return Outcome(
            SWIGLU,
            "SwiGLU not fused: no tensor parameter to test for the NPU",
            remedy="to fuse it, pass the input tensor as a parameter",
        )
    if not set(fn.fast_path_tensors) <= {x}:
        return Outcome(
            SWIGLU,
            "SwiGLU not fused: its CUDA fast path tests another tensor than the branch would",
            remedy="to fuse it, test the input's device in the fast path",
        )
    guards = [check] if check else []
    helpers = (IS_SILU,) if check else ()
    gate_half, up_half = _chunk_half(gate), _chunk_half(up)
    if gate_half and up_half and gate_half[0] is up_half[0]:
        if (gate_half[1], up_half[1]) != (0, 1):
            return _second_chunk(check)
        tensor, dim = _chunked_tensor(gate_half[0], fn)
        # The chunked tensor is computed in the branch: the helper checks it against the kernel's limits.
        fused = ast.Call(ast.Name("_npu_swiglu_halves", ast.Load()), [tensor, dim], [])
        helpers += (SWIGLU_HALVES,)
    else:
        if _chunk_half(gate) or _chunk_half(up):
            return Outcome(
                SWIGLU,
                "SwiGLU not fused: only one operand is a chunk",
                remedy="to fuse it, gate two chunks of one tensor, or two tensors",
            )
        # Two operands of one shape and dtype concatenate for the kernel; `_npu_silu_mul` checks that at
        # run time, and computes the original product otherwise.
        fused = ast.Call(ast.Name("_npu_silu_mul", ast.Load()), [gate, up], [])
        helpers += (SILU_MUL,)

    def replace(node: ast.AST) -> ast.AST:
        return fused if node is product else substitute_children(node, replace)

    rewritten = replace(result)
    if evaluates_twice(rewritten):
        # Folded, a name read twice is its projection twice (`(act(gate.float()) * up.float()).to(gate.dtype)`):
        # in place of its statement, the branch reads the names as they are.
        return _in_place_or(
            fn,
            Outcome(
                SWIGLU,
                "SwiGLU not fused: the branch would evaluate a projection twice",
                remedy="to fuse it, give the projection's result a name used once",
            ),
        )
    context = {"x": x, "guards": guards, "result": source(rewritten)}
    return Outcome(SWIGLU, "SwiGLU gets a fused `torch_npu.npu_swiglu` branch", TEMPLATE, context, helpers)


def _gates(expr: ast.expr, fn: Function) -> list[tuple[ast.BinOp, ast.expr, ast.expr, str | None]]:
    """(product, gate, up, runtime check) for each `act(gate) * up` of `expr` outside lambdas and
    comprehensions."""
    found = []
    for node in evaluated_nodes(expr):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for act, other in ((node.left, node.right), (node.right, node.left)):
                activation = _activation(act, fn)
                if activation is not None and not _scalar(other, fn):
                    found.append((node, activation[0], other, activation[1]))
                    break
    return found


def _binds(stmt: ast.stmt, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in ast.walk(stmt))


@dataclass
class _Chunked:
    """`g, u = t.chunk(2, dim)`, the statement of the block that binds a gate and its up."""

    at: int  # its index in the block
    tensor: ast.expr
    dim: ast.expr
    gate_first: bool


def _chunked(gate: ast.expr, up: ast.expr, block: list[ast.stmt], at: int, fn: Function) -> _Chunked | None:
    """How `gate, up` were bound, where together by the closest statement of this block that binds either:
    `g, u = t.chunk(2, dim)` (or `torch.chunk`); else None."""
    if not (isinstance(gate, ast.Name) and isinstance(up, ast.Name)) or gate.id == up.id:
        return None
    back = next((b for b in range(at - 1, -1, -1) if _binds(block[b], gate.id) or _binds(block[b], up.id)), None)
    stmt = block[back] if back is not None else None
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Tuple)):
        return None
    names = [e.id if isinstance(e, ast.Name) else None for e in stmt.targets[0].elts]
    call = stmt.value
    if not (isinstance(call, ast.Call) and sorted(names, key=str) == sorted((gate.id, up.id))):
        return None
    function = fn.qualname(call.func) == "torch.chunk"
    method = isinstance(call.func, ast.Attribute) and call.func.attr == "chunk"
    chunks = argument(call, 1 if function else 0, "chunks")
    if not ((function or method) and isinstance(chunks, ast.Constant) and chunks.value == 2):
        return None
    tensor, dim = _chunked_tensor(call, fn)
    return _Chunked(back, tensor, dim, names[0] == gate.id)


def _activated_gate(stmt: ast.stmt, before: ast.stmt, fn: Function):
    """(product, gate, up, runtime check) where the statement in front activates (`h = F.silu(g)`) and this
    one gates with it (`h = h * up`: torchtitan's grouped experts), the activated value read nowhere else:
    one branch over both computes the product from `g` and `up`. Why not, where it is read elsewhere;
    else None."""
    if not (isinstance(before, ast.Assign) and len(before.targets) == 1 and isinstance(before.targets[0], ast.Name)):
        return None
    activation = _activation(before.value, fn)
    name = before.targets[0].id
    if activation is None:
        return None
    product = next(
        (
            (node, up)
            # not in a lambda or comprehension: a name there may be another, and the branch's test is
            # evaluated outside it
            for node in evaluated_nodes(stmt.value)
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)
            for act, up in ((node.left, node.right), (node.right, node.left))
            if isinstance(act, ast.Name) and act.id == name and not _scalar(up, fn)
        ),
        None,
    )
    if product is None:
        return None
    declared = [n for n in fn.nodes if isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names]
    if declared:
        kind = type(declared[0]).__name__.lower()
        return f"`{name}`, the activated value, is declared `{kind}`: code elsewhere may read it"
    if _reads_locals(fn):
        return f"`{name}`, the activated value, may be read through `locals()` or `vars()`"
    if _binds(stmt, name):
        # `h = h * up`: after it `h` holds the product on both ways, so only this statement reads the
        # activated value, and must do so once.
        reads = [n for n in ast.walk(stmt) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)]
        if len(reads) != 1 or not isinstance(stmt, ast.Assign):
            return f"`{name}`, the activated value, is read besides the gate at line {stmt.lineno}"
    elif not _read_once(fn, (name,), stmt, before):
        # the fused way never binds it: nothing else may read it
        return f"`{name}`, the activated value, is read besides the gate at line {stmt.lineno}"
    return product[0], activation[0], product[1], activation[1]


def _reads_locals(fn: Function) -> bool:
    """Whether the function reads its names by `locals()` or `vars()` (a log line's `%(gate)s`): a branch
    that skips binding one changes what they see."""
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("locals", "vars") and not n.args
        for n in fn.nodes
    )


def _read_once(fn: Function, names: tuple[str, ...], stmt: ast.stmt, before: ast.stmt | None = None) -> bool:
    """Whether each of `names` is read in the function only by `stmt`, once, besides what `before` reads
    (the statement in front, which a branch over both skips on its fused way, reading what it would)."""
    inside = {id(n) for n in ast.walk(stmt)}
    skipped = {id(n) for n in ast.walk(before)} if before is not None else set()
    for name in names:
        reads = [
            n
            for n in fn.nodes
            # `del name` too: on the fused way the name is never bound
            if isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Store) and id(n) not in skipped
        ]
        if len(reads) != 1 or id(reads[0]) not in inside:
            return False
    return not any(isinstance(n, (ast.Nonlocal, ast.Global)) for n in fn.nodes)


def _tested_tensor(gate: ast.expr, up: ast.expr, fn: Function) -> ast.Name | None:
    """A name that provably holds a tensor in front of the statement, for `_is_npu` (TorchScript types
    it a Tensor; on an NPU host it reads `.device`): the activation's own input, or the first argument of
    the torch function, `torch.nn` module or matmul that computes an operand (`F.linear(x, w)`,
    `self.w1(x)` for an `nn.Linear`, `x @ w`); never a parameter annotated as something else, nor the
    list an element is taken from (`xs[i]`). None where there is none."""

    def tensor(node: ast.expr) -> ast.Name | None:
        annotation = _annotation(node.id, fn) if isinstance(node, ast.Name) else ""
        return node if annotation is None or (annotation or "").endswith("Tensor") else None

    if isinstance(gate, ast.Name):
        return tensor(gate)
    for operand in (gate, up):
        if (
            isinstance(operand, ast.Call)
            and isinstance(operand.func, ast.Attribute)
            and operand.func.attr in _TENSOR_METHODS
            and tensor(operand.func.value) is not None
        ):
            return operand.func.value  # `gate.float()`: a method only a tensor has
        if isinstance(operand, ast.BinOp) and isinstance(operand.op, ast.MatMult):  # `x @ w`: both tensors
            found = tensor(operand.left) or tensor(operand.right)
            if found is not None:
                return found
        if not (isinstance(operand, ast.Call) and operand.args):
            continue
        func = operand.func
        torch_function = _tensor_first(fn.qualname(func) or "")
        origin = (
            fn.attribute_source(func.attr)
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == fn.self_name
            else None
        )
        module = isinstance(origin, ast.Call) and (fn.qualname(origin.func) or "").startswith("torch.nn.")
        if (torch_function or module) and tensor(operand.args[0]) is not None:
            return operand.args[0]
    return None


def _in_place_or(fn: Function, declined: Outcome) -> Outcome:
    """The branches in place of the gating statements where they fuse, else `declined`."""
    in_place = _in_place_outcome(fn)
    return in_place if in_place is not None and in_place.template is not None else declined


def _in_place_outcome(fn: Function) -> Outcome | None:
    """A function with control flow (`if self.do_reduce:` after the MLP, an expert loop, a logging call)
    whose SwiGLU is one statement (with the split or the activation in front, where only it reads them):
    each such run of statements gets a branch of its own in its place, `if _is_npu(x): <the statement,
    fused> else: <the statements>`, so everything around it runs as written. None where no statement
    gates; a declined outcome, saying why, where one cannot be fused (then none is)."""
    sites: list[tuple[list[ast.stmt], dict[str, object]]] = []
    helpers: tuple[str, ...] = ()
    for block in statement_blocks(body_statements(fn.tree)):
        lines = [s.lineno for s in block]
        for at, stmt in enumerate(block):
            if (
                not isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Expr))
                or stmt.value is None
            ):
                continue
            gates = _gates(stmt.value, fn)
            activated = None if gates or at == 0 else _activated_gate(stmt, block[at - 1], fn)
            if isinstance(activated, str):
                return Outcome(
                    SWIGLU,
                    f"SwiGLU not fused: {activated}",
                    remedy="to fuse it, read the activation only in the gate",
                )
            if activated is not None:
                gates = [activated]
            if not gates:
                continue
            if len(gates) > 1:
                return Outcome(
                    SWIGLU,
                    f"SwiGLU not fused: the statement at line {stmt.lineno} gates more than once",
                    remedy="to fuse it, give each gate a statement of its own",
                )
            if lines.count(stmt.lineno) > 1:
                return Outcome(
                    SWIGLU,
                    f"SwiGLU not fused: the statement at line {stmt.lineno} shares its line",
                    remedy="to fuse it, put each statement of the body on its own line",
                )
            product, gate, up, check = gates[0]
            if source(gate) == source(up):
                return _self_gated(gate)
            tested = _tested_tensor(gate, up, fn)
            chunked = _chunked(gate, up, block, at, fn)
            if chunked is not None and not chunked.gate_first:
                return _second_chunk(check)
            run = [block[at - 1], stmt] if activated is not None else [stmt]
            if chunked is not None and isinstance(chunked.tensor, ast.Name):
                # what the split read must still be there, or the branch would split another tensor
                read = {
                    n.id for part in (chunked.tensor, chunked.dim) for n in ast.walk(part) if isinstance(n, ast.Name)
                }
                if any(_binds(s, name) for s in block[chunked.at + 1 : at] for name in read):
                    chunked = None
            elif (
                chunked is not None
                and chunked.at == at - 1
                and not _reads_locals(fn)
                and _read_once(fn, (gate.id, up.id), stmt)
            ):
                # `gate, up = proj(x).chunk(2, -1)` right in front, its halves read only here (transformers'
                # MoE experts): one branch over both statements passes the projection itself, no copy.
                run = [block[at - 1], stmt]
                tested = _tested_tensor(chunked.tensor, chunked.tensor, fn)
            else:
                chunked = None
            if tested is None:  # a parameter annotated as a tensor that the statements read
                read = {
                    n.id for s in run for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
                }
                annotated = [p for p in fn.params if p in read and (_annotation(p, fn) or "").endswith("Tensor")]
                tested = ast.Name(annotated[0], ast.Load()) if annotated else None
            walrus = {n.target.id for part in run for n in ast.walk(part) if isinstance(n, ast.NamedExpr)}
            if tested is not None and tested.id in walrus:
                tested = None  # `self.w1(h := x * 2)`: bound by the statement, unbound in front of it
            if tested is None:
                return Outcome(
                    SWIGLU,
                    "SwiGLU not fused: no tensor to test for the NPU in front of the statement",
                    remedy="to fuse it, bind the gate to a name first",
                )
            if chunked is not None:
                fused = ast.Call(ast.Name("_npu_swiglu_halves", ast.Load()), [chunked.tensor, chunked.dim], [])
                helpers += (SWIGLU_HALVES,)
            else:
                fused = ast.Call(ast.Name("_npu_silu_mul", ast.Load()), [gate, up], [])
                helpers += (SILU_MUL,)
            if check:
                helpers += (IS_SILU,)

            def replace(node: ast.AST, product=product, fused=fused) -> ast.AST:
                return fused if node is product else substitute_children(node, replace)

            statement = substitute_children(stmt, lambda node: replace(node))
            context = {
                "x": tested.id,
                "guards": [check] if check else [],
                "statement": source(statement),
                # A `return` needs no `else:` (the original follows the branch), any other statement one.
                "returns": isinstance(stmt, ast.Return),
            }
            sites.append((run, context))
    if not sites:
        return None
    lines = ", ".join(str(run[-1].lineno) for run, _ in sites)
    return Outcome(
        SWIGLU,
        f"SwiGLU gets a fused `torch_npu.npu_swiglu` branch in place of its statement (line {lines}; the"
        " function's control flow runs as written)",
        IN_PLACE_TEMPLATE,
        helpers=tuple(dict.fromkeys(helpers)),
        in_place=sites,
    )


IDIOM = Idiom(
    rule=SWIGLU,
    markers=("silu", "SiLU", "act_fn", "activation_fn", "ACT2FN", "self.act(", "self.activation("),
    identifiers=("silu", "SiLU", "act_fn", "activation_fn", "ACT2FN", "act", "activation"),
    kernels=("npu_swiglu",),
    match=match,
    template=TEMPLATE,
    templates=(IN_PLACE_TEMPLATE,),
    helpers={IS_SILU: "_is_silu", SILU_MUL: "_npu_silu_mul", SWIGLU_HALVES: "_npu_swiglu_halves"},
)
