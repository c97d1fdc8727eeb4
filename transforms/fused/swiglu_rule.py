"""NPU702's rule, its templates and what the matchers agree on about a gate: which call is SiLU, which
operand is a number rather than a tensor, which name provably holds a tensor, and the declines they share.
The matchers are `swiglu.py` (a branch in front of the body) and `swiglu_in_place.py` (in place of a
statement); this module imports neither."""

from __future__ import annotations

import ast
import re

from npu_migrate.engine.rule import EVERY_TARGET, Example, FixSafety, Rule
from npu_migrate.transforms.fused.symbolic import (
    Function,
    Outcome,
    argument,
    is_pure,
    source,
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
#: The branch in place of one statement of a function with control flow (`in_place_outcome`).
IN_PLACE_TEMPLATE = "fused/swiglu_in_place.py.j2"
#: `_is_silu(act)`: whether a configurable activation is SiLU, checked at run time.
IS_SILU = "fused/is_silu.py.j2"
#: `_npu_silu_mul(gate, up)`: the kernel on two operands concatenated, where their shapes allow.
SILU_MUL = "fused/silu_mul.py.j2"
SWIGLU_HALVES = "fused/swiglu_halves.py.j2"
_ACTIVATION_FACTORIES = ("ACT2FN", "get_activation", "ACT2CLS")


def silu_of(call: ast.expr, fn: Function) -> tuple[ast.expr, str | None] | None:
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


def self_gated(gate: ast.expr) -> Outcome:
    return Outcome(
        SWIGLU,
        f"SwiGLU not fused: `{source(gate)}` gates itself; npu_swiglu would take it joined to itself, a copy the"
        " two operators it replaces do not make",
        remedy="nothing in the code can: the fused kernel would not be faster here",
    )


def second_chunk(check: str | None) -> Outcome:
    """The decline of a gate on the second half of a split: where the activation is configurable, only
    when it is SiLU is this a SwiGLU at all."""
    activation = re.fullmatch(r"_is_silu\((.*)\)", check or "")
    where = f" (where `{activation.group(1)}` is SiLU)" if activation else ""
    return Outcome(
        SWIGLU,
        f"SwiGLU not fused{where}: SiLU is applied to the second chunk, npu_swiglu activates the first",
        remedy="to fuse it, swap the halves of the projection's weight and apply SiLU to the first chunk",
    )


def tensor_first(name: str) -> bool:
    """Whether the torch function `name` takes a tensor first (not `torch.cat`'s list, `torch.full`'s size)."""
    return name.startswith("torch.nn.functional.") or name in ("torch.matmul", "torch.mm", "torch.bmm")


#: Methods of a tensor that nothing else a gate could be has: `x.float()` proves `x` a tensor.
TENSOR_METHODS = frozenset(("float", "half", "bfloat16", "double", "type_as"))
#: Annotations of a parameter that is no tensor.
SCALARS = ("int", "float", "bool", "complex", "str")


def annotation_of(name: str, fn: Function) -> str | None:
    """The annotation of parameter `name`, as written, if it has one."""
    args = fn.tree.args
    arg = next((a for a in (*args.posonlyargs, *args.args, *args.kwonlyargs) if a.arg == name), None)
    return source(arg.annotation) if arg is not None and arg.annotation is not None else None


def scalar(node: ast.expr, fn: Function) -> bool:
    """Whether `node` is a number rather than a tensor: `silu(h) * 0.5` scales, it does not gate. A constant,
    an attribute of constants (`self.scale`), a parameter annotated as a number."""
    if isinstance(node, ast.UnaryOp):
        node = node.operand
    if isinstance(node, ast.Constant) or (isinstance(node, ast.Attribute) and is_pure(node)):
        return True
    return isinstance(node, ast.Name) and annotation_of(node.id, fn) in SCALARS


def chunk_half(node: ast.expr) -> tuple[ast.Call, int] | None:
    """(the shared `t.chunk(2, dim)` call, which half) for a name bound by tuple-unpacking a chunk."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.value, ast.Call):
        return node.value, node.slice.value
    return None


def chunked_tensor(call: ast.Call, fn: Function) -> tuple[ast.expr, ast.expr]:
    """(tensor, dim) of `t.chunk(2, dim)` / `torch.chunk(t, 2, dim)`; dim defaults to 0."""
    if fn.qualname(call.func) == "torch.chunk":
        tensor, dim = call.args[0], argument(call, 2, "dim")
    else:
        tensor, dim = call.func.value, argument(call, 1, "dim")
    return tensor, dim if dim is not None else ast.Constant(0)
