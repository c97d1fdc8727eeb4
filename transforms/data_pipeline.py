"""Training speed in the data pipeline: pinned memory for the NPU, and host-device syncs in the training loop.

`non_blocking=True` copies need no rule: `.cuda(non_blocking=True)` becomes `.npu(non_blocking=True)`
(NPU101) and `.to(device, non_blocking=True)` keeps its keyword. Facts, read in torch's wheels from PyPI:

* `DataLoader(pin_memory=True)` without `pin_memory_device` pins only where CUDA is available up to torch
  2.6 (`torch/utils/data/dataloader.py`, `_BaseDataLoaderIter.__init__`: 2.4.1 lines 584-597, 2.5.1 line
  651, 2.6.0 line 658: `loader.pin_memory and torch.cuda.is_available()`), so on an NPU host nothing is
  pinned and `non_blocking` copies are synchronous; from torch 2.7 it pins for the current accelerator
  (2.7.1 lines 659-678: `torch.accelerator.current_accelerator()`). torch_npu registers `_pin_memory` and
  `is_pinned` for the NPU (`csrc/aten/npu_native_functions.yaml`, 2.1.0.post8 and 2.14.0).
* Ascend's PyTorch runs operators asynchronously: the host dispatches, the NPU executes, and performance
  is lost where the NPU waits for the host (Huawei Cloud ModelArts best practice "PyTorch migration
  performance tuning: general principles", modelarts_10_2506). `.item()`, `.cpu()`, `.tolist()`,
  `.numpy()` wait for every queued operator first.
"""

from __future__ import annotations

import libcst as cst

from npu_migrate.engine.astindex import name_sets, words_may_name
from npu_migrate.engine.checkers import Checker
from npu_migrate.engine.rule import Example, FixSafety, Rule
from npu_migrate.transforms.common.arguments import keyword

#: The first torch release whose DataLoader pins for the current accelerator by default.
ACCELERATOR_PINNING_SINCE = (2, 7)

PIN_MEMORY_DEVICE = Rule(
    id="NPU106",
    name="pin-memory-device",
    family="data_pipeline",
    summary='`DataLoader(pin_memory=...)` gets `pin_memory_device="npu"` where torch pins only for CUDA (torch < 2.7)',
    what="""
    For a torch_npu built on torch 2.6 or older, adds `pin_memory_device="npu"` to
    `torch.utils.data.DataLoader(...)` calls that pass `pin_memory` (anything but `False`) and no
    `pin_memory_device`. Nothing is added for torch 2.7 and newer, which pins for the current accelerator.
    """,
    why="""
    Up to torch 2.6 the DataLoader pins batches only where CUDA is available (`_BaseDataLoaderIter`:
    `loader.pin_memory and torch.cuda.is_available()`, torch 2.4.1 `dataloader.py:584-597`), so on an NPU
    host nothing is pinned and every `non_blocking=True` copy to the NPU is a synchronous one. With
    `pin_memory_device="npu"` the batches are pinned for the NPU (torch_npu registers `_pin_memory`).
    """,
    example=Example(
        before="""
            from torch.utils.data import DataLoader

            loader = DataLoader(range(8), batch_size=4, pin_memory=True)
        """,
        after="""
            from torch.utils.data import DataLoader
            import torch_npu

            loader = DataLoader(range(8), batch_size=4, pin_memory=True, pin_memory_device="npu")
        """,
        torch_npu_version="2.6.0.post5",
    ),
    valid=(
        """
        from torch.utils.data import DataLoader

        loader = DataLoader(range(8), batch_size=4, pin_memory=False)
        """,
    ),
    fix_safety=FixSafety.SAFE,
    tags=frozenset({"lever"}),
)

STEP_SYNC = Rule(
    id="NPU107",
    name="per-step-sync",
    family="data_pipeline",
    summary="`.item()` / `.cpu()` / `.tolist()` / `.numpy()` every training step is reported (a host-device sync)",
    what="""
    Reports `.item()`, `.cpu()`, `.tolist()` and `.numpy()` calls, and `torch.cuda.synchronize()` /
    `torch.npu.synchronize()`, inside a loop whose body runs a backward pass (`.backward(`), unless they
    are under an `if` that tests a modulo (`if step % 100 == 0:`), which runs them every N steps only.
    Nothing is rewritten.
    """,
    why="""
    On an NPU the host queues operators and the device runs them asynchronously; each of these calls
    waits until everything queued has run, so the host stops dispatching the next step while the NPU
    drains, every step. Keep the value on the device (`total += loss.detach()`) and read it every N
    steps.
    """,
    example=Example(
        before="""
            def train(model, optimizer, batches):
                losses = []
                for x, y in batches:
                    loss = (model(x) - y).square().mean()
                    loss.backward()
                    optimizer.step()
                    losses.append(loss.item())
                return losses
        """,
        reports="waits for the NPU",
    ),
    valid=(
        """
        def train(model, optimizer, batches):
            for step, (x, y) in enumerate(batches):
                loss = (model(x) - y).square().mean()
                loss.backward()
                optimizer.step()
                if step % 100 == 0:
                    print(loss.item())
        """,
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    tags=frozenset({"lever"}),
)

_SYNCS = frozenset({"item", "cpu", "tolist", "numpy"})
_SYNCHRONIZE = frozenset({"torch.cuda.synchronize", "torch.npu.synchronize"})
_DATALOADER = "torch.utils.data.DataLoader"
_NAMES = name_sets([_DATALOADER, "torch.utils.data.dataloader.DataLoader"])


class _Finder(cst.CSTVisitor):
    """Whether a loop body runs a backward pass (nested functions and classes excluded)."""

    def __init__(self) -> None:
        self.found = False

    def visit_FunctionDef(self, node) -> bool:
        return False

    def visit_ClassDef(self, node) -> bool:
        return False

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value == "backward":
            self.found = True


class DataPipelineChecker(Checker):
    rules = (PIN_MEMORY_DEVICE, STEP_SYNC)
    markers = ("pin_memory", "backward")

    @classmethod
    def wants_words(cls, words) -> bool:
        return "backward" in words or words_may_name(words, _NAMES)

    @classmethod
    def wants(cls, index) -> bool:
        # A `.backward` attribute (`_Finder`), not an autograd Function's `def backward` (#26).
        return "backward" in index.attributes or index.may_name(_NAMES)

    def __init__(self, ctx, enabled) -> None:
        super().__init__(ctx, enabled)
        self._loops: list[bool] = []  # per enclosing loop: does it run a backward pass
        self._throttled = 0  # enclosing `if` tests with a modulo
        self._functions: list[int] = []  # loop depth when each enclosing function started
        self._covered: set[int] = set()  # `x.cpu()` of a reported `x.cpu().tolist()`: one finding
        major, minor = ctx.api.version.split(".")[:2]
        self._pins_for_cuda_only = (int(major), int(minor)) < ACCELERATOR_PINNING_SINCE

    # -- the training loop ------------------------------------------------------------------------

    def _enter_loop(self, node) -> None:
        finder = _Finder()
        node.body.visit(finder)
        self._loops.append(finder.found)

    def visit_For(self, node: cst.For) -> None:
        self._enter_loop(node)

    def leave_For(self, original_node: cst.For) -> None:
        self._loops.pop()

    def visit_While(self, node: cst.While) -> None:
        self._enter_loop(node)

    def leave_While(self, original_node: cst.While) -> None:
        self._loops.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._functions.append(len(self._loops))

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._functions.pop()

    def visit_If(self, node: cst.If) -> None:
        if _has_modulo(node.test):
            self._throttled += 1

    def leave_If(self, original_node: cst.If) -> None:
        if _has_modulo(original_node.test):
            self._throttled -= 1

    def _in_training_loop(self) -> bool:
        start = self._functions[-1] if self._functions else 0  # a loop outside the function does not count
        return any(self._loops[start:]) and not self._throttled

    def visit_Call(self, node: cst.Call) -> None:
        qualname = self.ctx.qualname(node.func)
        if qualname in (_DATALOADER, "torch.utils.data.dataloader.DataLoader"):
            self._pin_memory(node)
        if not self._in_training_loop():
            return
        func = node.func
        if id(node) in self._covered:
            return
        if isinstance(func, cst.Attribute) and func.attr.value in _SYNCS and not node.args:
            self._covered.add(id(func.value))
            what = f"`{self.ctx.code(func.value)}.{func.attr.value}()`"
        elif qualname in _SYNCHRONIZE:
            what = f"`{qualname}()`"
        else:
            return
        self.report(
            STEP_SYNC,
            node,
            f"{what} in the training loop waits for the NPU to run everything queued, every step (a host-device "
            "sync): keep the value on the device (`total += loss.detach()`) and read it every N steps",
        )

    def _pin_memory(self, call: cst.Call) -> None:
        pin = keyword(call, "pin_memory")
        if (
            not self._pins_for_cuda_only
            or pin is None
            or keyword(call, "pin_memory_device") is not None
            or any(arg.star for arg in call.args)
            or self.ctx.code(pin.value).strip() == "False"
        ):
            return

        self.report(
            PIN_MEMORY_DEVICE,
            call,
            f"torch_npu {self.ctx.api.version}'s torch pins DataLoader batches only for CUDA without a device: "
            '`pin_memory_device="npu"` pins them for the NPU',
            fix=_with_pin_memory_device,
        )


def _with_pin_memory_device(updated: cst.Call) -> cst.Call:
    """`updated` with `pin_memory_device="npu"` last, in the call's layout (one argument a line stays so)."""
    args = list(updated.args)
    last = args[-1]
    added = cst.Arg(
        keyword=cst.Name("pin_memory_device"),
        value=cst.SimpleString('"npu"'),
        equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
        comma=last.comma,
    )
    between = args[-2].comma if len(args) > 1 and last.comma is not cst.MaybeSentinel.DEFAULT else None
    args[-1] = last.with_changes(comma=between or cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return updated.with_changes(args=[*args, added])


def _has_modulo(test: cst.BaseExpression) -> bool:
    found = []

    class Finder(cst.CSTVisitor):
        def visit_Modulo(self, node) -> None:
            found.append(node)

    test.visit(Finder())
    return bool(found)
