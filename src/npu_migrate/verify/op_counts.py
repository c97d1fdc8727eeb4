"""Operator counts for `npu-migrate verify`: what each side dispatches in one forward pass, by op family.

No Ascend device here, so no timings: the next best evidence that a fused rewrite pays is how many
operators the original dispatches and how many the migrated code does with its fused branches taken.
They are counted at the dispatcher (a `TorchDispatchMode`), not read from the code: what runs is what
counts, after autograd and CompositeImplicit decompositions (`F.linear` is a `t` and an `mm`; on the
CPU `F.rms_norm` is pow, mean, add, rsqrt, mul), which is also what a device launches.

A fused op of the CPU reference (`reference.OPS`) counts as one fused call, not as the CPU operators
that model it: the reference wraps each call in `fused_call(name)`, which counts the call and stops
counting until it returns. On an NPU the real kernels reach the dispatcher as `npu.*` ops and count in
the family "fused (torch_npu)".

Families: views and other metadata-only ops (no kernel on a device) are counted apart, so "kernels"
is every dispatched op but those.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: Family -> op names (`aten.<name>`, the overload packet's) that are not found by their tags.
_NAMED = {
    "matmul": {"mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "linear", "dot", "mv", "addmv", "_int_mm"},
    "attention": {
        "scaled_dot_product_attention",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_attention_math",
        "_scaled_dot_product_fused_attention_overrideable",
        "_flash_attention_forward",
        "_efficient_attention_forward",
    },
    "softmax": {"_softmax", "softmax", "_log_softmax", "log_softmax", "_safe_softmax"},
    "normalization": {
        "native_layer_norm",
        "_fused_rms_norm",
        "rms_norm",
        "layer_norm",
        "native_group_norm",
        "native_batch_norm",
        "_native_batch_norm_legit",
        "_native_batch_norm_legit_no_training",
    },
    "activation": {"silu", "gelu", "relu", "sigmoid", "tanh", "hardswish", "mish", "elu", "leaky_relu", "softplus"},
    "view": {"_unsafe_view", "_reshape_alias", "reshape", "alias", "detach", "lift_fresh", "view_as"},
    "copy / layout": {
        "clone",
        "copy_",
        "_to_copy",
        "contiguous",
        "cat",
        "stack",
        "repeat",
        "expand_copy",
        "tril",
        "triu",
    },
    "creation": {
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "zeros",
        "zeros_like",
        "new_zeros",
        "ones",
        "ones_like",
        "new_ones",
        "full",
        "full_like",
        "new_full",
        "arange",
        "scalar_tensor",
        "randn",
        "rand",
        "randint",
        "fill_",
        "zero_",
    },
    "indexing": {"embedding", "index", "index_select", "gather", "scatter", "index_put_", "masked_select", "take"},
}
_BY_NAME = {name: family for family, names in _NAMED.items() for name in names}
FUSED_FAMILY = "fused (torch_npu)"
#: Families that launch no kernel on a device.
METADATA = frozenset({"view"})


def family(func) -> str:
    """The family of one dispatched op (an `OpOverload`)."""
    if func.namespace == "npu":
        return FUSED_FAMILY
    name = func.overloadpacket.__name__
    if name in _BY_NAME:
        return _BY_NAME[name]
    if getattr(func, "is_view", False):
        return "view"
    tags = set(func.tags)
    if torch.Tag.pointwise in tags:
        return "elementwise"
    if torch.Tag.reduction in tags:
        return "reduction"
    return "other"


class OpCounter(TorchDispatchMode):
    """Counts every op dispatched while it is active, by op name and family; `fused` counts the fused
    calls (`fused_call`), during which nothing else is counted."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()
        self.families: collections.Counter[str] = collections.Counter()
        self.fused: collections.Counter[str] = collections.Counter()
        self._inside_fused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self._inside_fused:
            if func.namespace == "npu":  # a real torch_npu kernel, on a device: a fused call as the reference's
                self.fused[func.overloadpacket.__name__] += 1
            else:
                self.ops[str(func.overloadpacket)] += 1
                self.families[family(func)] += 1
        return func(*args, **(kwargs or {}))

    def to_dict(self) -> dict:
        """What the worker sends back: plain dicts, sorted, and the totals. A fused call is one op (one
        kernel on the device), in the family "fused (torch_npu)", as the real kernels are on an NPU."""
        families = self.families.copy()
        families[FUSED_FAMILY] += sum(self.fused.values())
        families = +families  # without the zero
        ops = sum(families.values())
        return {
            "ops": ops,
            "kernels": ops - sum(n for f, n in families.items() if f in METADATA),
            "families": dict(sorted(families.items())),
            "by_op": dict(sorted(self.ops.items())),
            "fused": dict(sorted(self.fused.items())),
        }


_ACTIVE: list[OpCounter] = []


@contextlib.contextmanager
def counting() -> Iterator[OpCounter]:
    """Count the ops dispatched inside the block."""
    counter = OpCounter()
    _ACTIVE.append(counter)
    try:
        with counter:
            yield counter
    finally:
        _ACTIVE.remove(counter)


def call_fused(name: str, fn, *args, **kwargs):
    """`fn(*args, **kwargs)`, the CPU reference of the fused op `name`, as one fused call; and where autograd
    recorded it, its backward as one fused call `<name>_backward` (the kernels' grad ops on a device), not
    as the CPU operators autograd runs for the reference."""
    counter = _ACTIVE[-1] if _ACTIVE else None
    with fused_call(name):
        out = fn(*args, **kwargs)
    if counter is not None and torch.is_grad_enabled():
        _backward_as_one_call(counter, f"{name}_backward", out, (*args, *kwargs.values()))
    return out


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return []


def _backward_as_one_call(counter: OpCounter, name: str, out, inputs) -> None:
    """Hooks on the autograd nodes the reference created (from its outputs back to its inputs' nodes) that
    pause counting while they run, and count `name` once, when the first of them runs."""
    stop = {t.grad_fn for t in _tensors(inputs) if t.grad_fn is not None}
    nodes, stack = [], [t.grad_fn for t in _tensors(out) if t.grad_fn is not None]
    seen = set()
    while stack:
        node = stack.pop()
        if node is None or node in seen or node in stop or type(node).__name__ == "AccumulateGrad":
            continue
        seen.add(node)
        nodes.append(node)
        stack.extend(next_node for next_node, _ in node.next_functions)
    if not nodes:
        return
    counted = []

    def enter(grad_outputs):
        if not counted:
            counted.append(True)
            counter.fused[name] += 1
        counter._inside_fused += 1

    def leave(grad_inputs, grad_outputs):
        counter._inside_fused -= 1

    for node in nodes:
        node.register_prehook(enter)
        node.register_hook(leave)


@contextlib.contextmanager
def fused_call(name: str) -> Iterator[None]:
    """One call of the fused op `name` (a CPU reference kernel): counted once, its own ops not at all."""
    counter = _ACTIVE[-1] if _ACTIVE else None
    if counter is None:
        yield
        return
    counter.fused[name] += 1
    counter._inside_fused += 1
    try:
        yield
    finally:
        counter._inside_fused -= 1


def table(original: dict, migrated: dict) -> list[str]:
    """The report's lines: per family, what the original and the migrated code dispatch, then the totals
    and the fused calls that replaced the difference."""
    families = sorted(set(original["families"]) | set(migrated["families"]))
    width = max([len("kernels (no views)"), *map(len, families)])
    lines = [f"  {'':<{width}}  {'original':>9}  {'migrated':>9}"]
    for name in families:
        a, b = original["families"].get(name, 0), migrated["families"].get(name, 0)
        lines.append(f"  {name:<{width}}  {a:>9}  {b:>9}{_change(a, b)}")
    for label, key in (("all ops", "ops"), ("kernels (no views)", "kernels")):
        a, b = original[key], migrated[key]
        lines.append(f"  {label:<{width}}  {a:>9}  {b:>9}{_change(a, b)}")
    fused = migrated.get("fused", {})
    total = sum(fused.values())
    calls = "  ".join(f"{op} x{n}" for op, n in fused.items()) or "none"
    lines.append(f"  fused calls in their place: {total} ({calls})")
    return lines


def _change(a: int, b: int) -> str:
    if a == b:
        return ""
    return f"  {b - a:+d}" + (f" ({(b - a) / a:+.0%})" if a else "")
