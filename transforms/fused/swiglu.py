"""NPU702: hand-written SwiGLU gets a `torch_npu.npu_swiglu` branch.

`npu_swiglu(t, dim)` splits `t` in halves A, B along `dim` and returns `silu(A) * B`: SiLU on the
FIRST half. The idiom `act(a) * b` (either operand order: the product commutes exactly) maps to
`npu_swiglu(cat((a, b), -1))`, or to `npu_swiglu(t, dim)` when `a, b = t.chunk(2, dim)` already are the
halves of one tensor. The rest of the function's expression (`down_proj(...)`) is kept as written.
"""

from __future__ import annotations

import ast

from npu_migrate.transforms.fused.idiom import Idiom
from npu_migrate.transforms.fused.swiglu_in_place import in_place_or, in_place_outcome
from npu_migrate.transforms.fused.swiglu_rule import (
    IN_PLACE_TEMPLATE,
    IS_SILU,
    SILU_MUL,
    SWIGLU,
    SWIGLU_HALVES,
    TEMPLATE,
    chunk_half,
    chunked_tensor,
    scalar,
    second_chunk,
    self_gated,
    silu_of,
)
from npu_migrate.transforms.fused.symbolic import (
    STRAIGHT_LINE,
    Function,
    NotStraightLine,
    Outcome,
    evaluates_twice,
    fold,
    source,
    substitute_children,
    walk_shared,
)


def match(fn: Function) -> Outcome | None:
    try:
        result = fold(fn)
    except NotStraightLine as why:
        if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "_is_npu" for n in fn.nodes):
            # A branch of ours is there (a second run): a `return` fused in place stays after its branch,
            # where it would be fused again.
            return None
        in_place = in_place_outcome(fn)
        if in_place is not None:
            return in_place
        # The activation bound to a name first counts too (`h = F.silu(h)` then `h = h * up`: llama-models'
        # multimodal FeedForward, torchtitan's GroupedExperts): a SwiGLU that deserves a finding.
        activated = {
            target.id
            for n in fn.nodes
            if isinstance(n, ast.Assign) and silu_of(n.value, fn)
            for target in n.targets
            if isinstance(target, ast.Name)
        }
        has_silu = any(
            isinstance(n, ast.BinOp)
            and isinstance(n.op, ast.Mult)
            and any(
                silu_of(side, fn) or (isinstance(side, ast.Name) and side.id in activated) for side in (n.left, n.right)
            )
            for n in fn.nodes
        )
        return Outcome(SWIGLU, f"SwiGLU not fused: {why}", remedy=STRAIGHT_LINE) if has_silu else None
    gates = {}  # by identity: a product used twice in the expression is computed once
    for node in walk_shared(result):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and id(node) not in gates:
            for act, other in ((node.left, node.right), (node.right, node.left)):
                found = silu_of(act, fn)
                # `silu(h) * self.scale`: an activation scaled by a parameter, not gated by a tensor.
                if found is not None and not scalar(other, fn):
                    gates[id(node)] = (node, found[0], other, found[1])
                    break
    gates = list(gates.values())
    if not gates:
        return None
    if len(gates) > 1:
        return in_place_or(
            fn,
            Outcome(
                SWIGLU,
                "SwiGLU not fused: the function gates more than once",
                remedy="to fuse it, give each gate a statement of its own",
            ),
        )
    product, gate, up, check = gates[0]
    if source(gate) == source(up):
        return self_gated(gate)
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
    gate_half, up_half = chunk_half(gate), chunk_half(up)
    if gate_half and up_half and gate_half[0] is up_half[0]:
        if (gate_half[1], up_half[1]) != (0, 1):
            return second_chunk(check)
        tensor, dim = chunked_tensor(gate_half[0], fn)
        # The chunked tensor is computed in the branch: the helper checks it against the kernel's limits.
        fused = ast.Call(ast.Name("_npu_swiglu_halves", ast.Load()), [tensor, dim], [])
        helpers += (SWIGLU_HALVES,)
    else:
        if chunk_half(gate) or chunk_half(up):
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
        return in_place_or(
            fn,
            Outcome(
                SWIGLU,
                "SwiGLU not fused: the branch would evaluate a projection twice",
                remedy="to fuse it, give the projection's result a name used once",
            ),
        )
    context = {"x": x, "guards": guards, "result": source(rewritten)}
    return Outcome(SWIGLU, "SwiGLU gets a fused `torch_npu.npu_swiglu` branch", TEMPLATE, context, helpers)


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
