"""NPU702 in place of a statement: a SwiGLU among control flow (a flag after the MLP, a loop over experts, a
logging call), or one whose folded branch would evaluate a projection twice, gets a branch of its own in
place of the gating statement (with the split or the activation in front where only it reads them), the
statements around it untouched. `Outcome.in_place` carries the runs; the checker replaces them."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from npu_migrate.transforms.fused.swiglu_rule import (
    IN_PLACE_TEMPLATE,
    IS_SILU,
    SILU_MUL,
    SWIGLU,
    SWIGLU_HALVES,
    TENSOR_METHODS,
    annotation_of,
    chunked_tensor,
    scalar,
    second_chunk,
    self_gated,
    silu_of,
    tensor_first,
)
from npu_migrate.transforms.fused.symbolic import (
    Function,
    Outcome,
    argument,
    body_statements,
    evaluated_nodes,
    source,
    statement_blocks,
    substitute_children,
)


def _gates(expr: ast.expr, fn: Function) -> list[tuple[ast.BinOp, ast.expr, ast.expr, str | None]]:
    """(product, gate, up, runtime check) for each `act(gate) * up` of `expr` outside lambdas and
    comprehensions."""
    found = []
    for node in evaluated_nodes(expr):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for act, other in ((node.left, node.right), (node.right, node.left)):
                activation = silu_of(act, fn)
                if activation is not None and not scalar(other, fn):
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
    tensor, dim = chunked_tensor(call, fn)
    return _Chunked(back, tensor, dim, names[0] == gate.id)


def _activated_gate(stmt: ast.stmt, before: ast.stmt, fn: Function):
    """(product, gate, up, runtime check) where the statement in front activates (`h = F.silu(g)`) and this
    one gates with it (`h = h * up`: torchtitan's grouped experts), the activated value read nowhere else:
    one branch over both computes the product from `g` and `up`. Why not, where it is read elsewhere;
    else None."""
    if not (isinstance(before, ast.Assign) and len(before.targets) == 1 and isinstance(before.targets[0], ast.Name)):
        return None
    activation = silu_of(before.value, fn)
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
            if isinstance(act, ast.Name) and act.id == name and not scalar(up, fn)
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
        annotation = annotation_of(node.id, fn) if isinstance(node, ast.Name) else ""
        return node if annotation is None or (annotation or "").endswith("Tensor") else None

    if isinstance(gate, ast.Name):
        return tensor(gate)
    for operand in (gate, up):
        if (
            isinstance(operand, ast.Call)
            and isinstance(operand.func, ast.Attribute)
            and operand.func.attr in TENSOR_METHODS
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
        torch_function = tensor_first(fn.qualname(func) or "")
        origin = (
            fn.attribute_source(func.attr)
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == fn.self_name
            else None
        )
        module = isinstance(origin, ast.Call) and (fn.qualname(origin.func) or "").startswith("torch.nn.")
        if (torch_function or module) and tensor(operand.args[0]) is not None:
            return operand.args[0]
    return None


def in_place_or(fn: Function, declined: Outcome) -> Outcome:
    """The branches in place of the gating statements where they fuse, else `declined`."""
    in_place = in_place_outcome(fn)
    return in_place if in_place is not None and in_place.template is not None else declined


def in_place_outcome(fn: Function) -> Outcome | None:
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
                return self_gated(gate)
            tested = _tested_tensor(gate, up, fn)
            chunked = _chunked(gate, up, block, at, fn)
            if chunked is not None and not chunked.gate_first:
                return second_chunk(check)
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
                annotated = [p for p in fn.params if p in read and (annotation_of(p, fn) or "").endswith("Tensor")]
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
