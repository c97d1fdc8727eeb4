"""Device placement: `.cuda()`, `"cuda"` device strings, `.is_cuda`, device-type comparisons.

`.cuda()` and `"cuda"` are matched only where they place data on a device. Text that merely mentions
CUDA (docstrings, comments, log messages, argparse help, dictionary keys) is never touched.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import replace

import libcst as cst

from npu_migrate.engine.checkers import Checker
from npu_migrate.engine.rule import EVERY_TARGET, Example, FixSafety, Rule
from npu_migrate.findings import Severity
from npu_migrate.program.api import ACCELERATOR_TYPE
from npu_migrate.transforms.common.accelerator import accelerator_type, is_accelerator_type, portable
from npu_migrate.transforms.common.comparisons import LiteralComparisons
from npu_migrate.transforms.common.devices import (
    accelerator_indexed,
    device_literal,
    has_device_literal,
    indexed_device,
    rewrite_device_literal,
)
from npu_migrate.transforms.common.strings import string_value

CUDA_METHOD = Rule(
    id="NPU101",
    name="cuda-method",
    family="device",
    summary="`.cuda(...)` becomes `.npu(...)`",
    what="""
    Rewrites `.cuda(...)` calls to `.npu(...)`, keeping the arguments: `.cuda(i)`, `.cuda(device=...)`
    and `.cuda(non_blocking=True)` become the same `.npu(...)` call. Not rewritten when the file defines
    a function or method called `cuda` itself (the call may be to it): then a finding asks you to check
    the call by hand. Nor in files that use a quantisation library whose parameters convert themselves
    in place on `.cuda()` (bitsandbytes, hqq, auto_gptq, awq) when the result is thrown away
    (`weight.cuda()` as a statement, on something not named like a model): `.npu()` would return a new
    tensor and leave the parameter unquantised, so the call is reported. With `--target portable`: `.cuda()`
    becomes `.to(ACCELERATOR)`, and `.cuda(i)` becomes `.to(f"{ACCELERATOR}:{i}")` where `i` is an int
    literal or a name the file binds once, to `int(...)` or an int; any other argument is reported, since
    `.cuda()` also takes a torch.device.
    """,
    why="""
    `.cuda()` moves tensors and modules to a GPU; on an NPU host there is none, and the call fails.
    `.npu()` is the same move to the NPU.
    """,
    example=Example(
        before="""
            import torch

            model = torch.nn.Linear(4, 2).cuda()
            batch = torch.ones(8, 4).cuda(non_blocking=True)
        """,
        after="""
            import torch
            import torch_npu

            model = torch.nn.Linear(4, 2).npu()
            batch = torch.ones(8, 4).npu(non_blocking=True)
        """,
    ),
    fix_safety=FixSafety.SAFE,
    targets=EVERY_TARGET,
)

DEVICE_STRING = Rule(
    id="NPU102",
    name="device-string",
    family="device",
    summary="`'cuda'` / `'cuda:N'` / `f'cuda:{i}'` device strings become `'npu'` ones",
    what="""
    Rewrites device strings where they select a device: `torch.device(...)`, `.to(...)`, `device=` /
    `map_location=` / `pin_memory_device=` arguments (including `map_location` dicts and
    `{"map_location": "cuda"}` keyword dicts), variables given one value in the file and used there
    (`loc = "cuda:{}".format(gpu)`, then `map_location=loc`), variables,
    attributes, dictionary entries and parameters whose name mentions "device", argparse `--device`
    defaults and choices, and `'cuda' if torch.cuda.is_available() else 'cpu'`. A `device_type="cuda"`
    keyword to a function of the same file is rewritten when that function passes the parameter on to
    autocast or a device position (`torch.autocast(device_type=device_type)`, `.to(device_type)`), and
    reported otherwise. f-strings
    (`f"cuda:{rank}"`), `"cuda:{}".format(i)` and `"cuda:%d" % i` are handled too. Strings that only
    mention CUDA are left alone. With `--target portable`: "cuda" becomes `ACCELERATOR`, and a device with
    an index keeps it on the accelerator's type (`f"{ACCELERATOR}:0"`, `f"{ACCELERATOR}:{rank}"`,
    `f"{ACCELERATOR}:%d" % i`) where the file holds the name `ACCELERATOR`; a `.format` template is reported.
    """,
    why="""
    An NPU host has no "cuda" device: `torch.device("cuda")` and `.to("cuda:0")` fail there.
    """,
    example=Example(
        before="""
            import argparse

            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument("--device", default="cuda")


            def load(path, rank):
                state = torch.load(path, map_location="cuda:0")
                return state, torch.zeros(3, device=f"cuda:{rank}")
        """,
        after="""
            import argparse

            import torch
            import torch_npu

            parser = argparse.ArgumentParser()
            parser.add_argument("--device", default="npu")


            def load(path, rank):
                state = torch.load(path, map_location="npu:0")
                return state, torch.zeros(3, device=f"npu:{rank}")
        """,
    ),
    valid=(
        """
        print("training on cuda")
        """,
    ),
    fix_safety=FixSafety.NEEDS_REVIEW,
    review="""
    Besides device arguments, the rule rewrites values your program exposes: the default and choices
    of its own `--device` option and variables, attributes and parameters named like a device. Launch
    commands and configuration files outside the migrated tree that pass "cuda" must say "npu" too.
    """,
    targets=EVERY_TARGET,
)

IS_CUDA = Rule(
    id="NPU103",
    name="is-cuda",
    family="device",
    summary="`tensor.is_cuda` becomes `tensor.is_npu`",
    what="""
    Rewrites the tensor property `.is_cuda` to `.is_npu`. Not rewritten when the file assigns an
    attribute called `is_cuda` itself (then it is the program's own flag, not the tensor property): a
    finding asks you to check.
    """,
    why="""
    `Tensor.is_cuda` is False for every tensor on an NPU, so code gated on it silently takes its CPU
    path; `is_npu` is the NPU counterpart.
    """,
    example=Example(
        before="""
            import torch


            def to_half(x):
                if x.is_cuda:
                    x = x.half()
                return x
        """,
        after="""
            import torch
            import torch_npu


            def to_half(x):
                if x.is_npu:
                    x = x.half()
                return x
        """,
    ),
    fix_safety=FixSafety.SAFE,
)

DEVICE_COMPARISON = Rule(
    id="NPU104",
    name="device-comparison",
    family="device",
    summary="`x.device.type == 'cuda'`, `'cuda' in device` and `device.startswith('cuda:')` test for `'npu'`",
    what="""
    Comparisons with "cuda" and prefix tests `.startswith("cuda")` / `.startswith("cuda:")` whose
    tested value is visibly a device (`.device`, `.type`, a name containing "device") or a variable
    holding a device string this rule family rewrites (`loc = f"cuda:{rank}"`, then `map_location=loc`)
    are rewritten to test for "npu"; other such tests (`backend == "cuda"`) are reported for review,
    not rewritten.
    """,
    why="""
    After migration tensors live on "npu" devices, so a comparison with "cuda" silently becomes False
    and the code takes its CPU branch.
    """,
    example=Example(
        before="""
            import torch


            def upcast(hidden):
                if hidden.device.type == "cuda":
                    hidden = hidden.float()
                return hidden
        """,
        after="""
            import torch
            import torch_npu


            def upcast(hidden):
                if hidden.device.type == "npu":
                    hidden = hidden.float()
                return hidden
        """,
    ),
    fix_safety=FixSafety.SAFE,
)

ACCELERATOR_STRING = Rule(
    id="NPU105",
    name="framework-accelerator-string",
    family="device",
    summary='a framework\'s accelerator string (`accelerator="cuda"` / `"gpu"`) is reported with its NPU spelling',
    what="""
    Reports `"cuda"` and `"gpu"` assigned to a variable, attribute or keyword argument named like
    `accelerator` (Lightning's `Trainer(accelerator=...)`, DeepSpeed and accelerate configuration code).
    Not rewritten: each framework spells the NPU its own way, or not at all. Lightning has no built-in NPU
    accelerator (register your own `Accelerator` subclass); DeepSpeed selects the NPU with the environment
    variable `DS_ACCELERATOR=npu` (`get_accelerator().device_name()` is then "npu"); Hugging Face
    accelerate and `Trainer` find an NPU on their own when torch_npu is installed, so leave the device
    unset; Ray calls the resource "NPU".
    """,
    why="""
    The framework, not torch, reads the string: "npu" is not a Lightning accelerator name, and a guard
    flipped in front of `accelerator = "cuda"` makes the framework fail where it used to fall back to CPU.
    While such a string is left, the guard in front of it is left too (`npu_migrate.program.guards`).
    """,
    example=Example(
        before="""
            import torch

            accelerator = "gpu" if torch.cuda.is_available() else "cpu"
        """,
        reports="framework accelerator string",
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    severity=Severity.WARNING,
)

_ACCELERATOR_VALUES = frozenset({"cuda", "gpu"})
_ACCELERATOR_ADVICE = (
    'framework accelerator string "{value}" left as is: spell the NPU the way your framework does (Lightning: '
    "no built-in NPU accelerator, register an `Accelerator` subclass; DeepSpeed: `DS_ACCELERATOR=npu`; "
    'Hugging Face accelerate / Trainer: leave the device unset, they find the NPU; Ray: the "NPU" resource)'
)

#: Packages whose parameter classes implement `.cuda()` as an in-place conversion (bitsandbytes `Int8Params` /
#: `Params4bit` quantise their data on the move and return self): `x.cuda()` as a statement works there, while
#: `.npu()` returns a new tensor that is thrown away. In files importing them, such statements are reported.
IN_PLACE_CUDA_PACKAGES = ("bitsandbytes", "hqq", "auto_gptq", "awq")

DEVICE_KEYWORDS = frozenset({"device", "map_location", "pin_memory_device", "output_device"})
OTHER_DEVICES = frozenset({"cpu", "mps", "meta", "xpu"})


def _mentions_device(name: str) -> bool:
    return "device" in name.lower()


def _target_name(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    if isinstance(node, cst.Subscript) and len(node.slice) == 1:
        key = node.slice[0].slice
        if isinstance(key, cst.Index):
            return string_value(key.value) or ""
    return ""


_PORTABLE_DEVICE_ADVICE = (
    f"name the accelerator with `{ACCELERATOR_TYPE}` and add the index yourself "
    '(`f"{device_type}:{rank}"`); this file cannot hold '
    "the module-level `ACCELERATOR` (torch is not imported as `torch` at module level, the name is the "
    "program's own, or NPU001 is not selected), or the torch version cannot spell it (2.7+)"
)
_PORTABLE_TEMPLATE_ADVICE = 'a `.format` template: write `f"{ACCELERATOR}:{index}"`'


class DeviceChecker(Checker):
    rules = (CUDA_METHOD, DEVICE_STRING, IS_CUDA, DEVICE_COMPARISON, ACCELERATOR_STRING)
    markers = ("cuda",)

    @classmethod
    def wants(cls, index) -> bool:
        # `.cuda()` and `.is_cuda` are attributes; every other rule here needs a device literal. A string
        # that only mentions CUDA ("CUDA out of memory", "use_cuda_graph") is neither.
        return index.uses("cuda", "is_cuda") or has_device_literal(index)

    def __init__(self, ctx, enabled) -> None:
        super().__init__(ctx, enabled)
        self._is_cuda_reads: list[cst.Attribute] = []
        self._carried: list[cst.CSTNode] = []  # indexed CUDA devices in tuples and lists (`visit_Element`)
        self._followed: set[int] = set()  # the elements of device lists another rule decides
        self._is_cuda_is_own_attribute = False
        self._comparisons: list[cst.Comparison] = []
        self._npu_tested: set[str] = set()  # code of values compared with "npu" somewhere in the file
        self._elifs: set[int] = set()
        self._discarded: set[int] = set()  # calls whose result is thrown away (expression statements)
        # Device values that travel through a variable (`loc = "cuda:{}".format(gpu)`, then
        # `map_location=loc`): the names used where a device goes, and every value each name is given.
        self._device_names: list[tuple[str, str]] = []
        self._assigned: dict[str, list[cst.BaseExpression | None]] = {}
        self._defs: dict[str, list[cst.FunctionDef]] = {}
        # `run(model, device_type="cuda")` to a function of this file: decided in `finish`, from what the function
        # does with the parameter.
        self._wrapper_calls: list[tuple[str, cst.Arg]] = []
        self._prefix_tests: list[tuple[cst.BaseExpression, cst.SimpleString]] = []  # `x.startswith("cuda:")`
        self._loads: _Loads | None = None  # the reads of each name, counted once, when a value travels
        self._indexed_moves: list[tuple[cst.Call, str]] = []  # `.cuda(rank)` in the portable target
        self._bindings: _Bindings | None = None

    # -- device strings ------------------------------------------------------------------------------

    def _device_value(
        self, node: cst.BaseExpression | None, where: str, *, containers: bool = False, choice: bool = False
    ) -> None:
        """Rewrite `node` if it is a device literal or a conditional choosing between them.

        Only where every element is a device (`map_location={"cuda:1": "cuda:0"}`, argparse `choices`)
        are lists and dicts entered: elsewhere a collection of names (`SUPPORTED_DEVICES = ["cuda",
        "npu"]`, `{"cuda": "CUDAGraph"}`) is data about devices, and rewriting it would change it.
        """
        if node is None or is_accelerator_type(node):
            return
        if isinstance(node, cst.Name):  # decided in `finish`, from the value the name is assigned
            self._device_names.append((node.value, where))
            return
        if isinstance(node, cst.IfExp):
            self._device_value(node.body, where, choice=True)
            self._device_value(node.orelse, where, choice=True)
            return
        if containers and isinstance(node, (cst.List, cst.Tuple, cst.Set)):
            for element in node.elements:
                self._device_value(element.value, where)
            return
        if containers and isinstance(node, cst.Dict):
            for element in node.elements:
                if isinstance(element, cst.DictElement):
                    self._device_value(element.key, where)
                    self._device_value(element.value, where)
            return
        literal = device_literal(node)
        if literal is None:
            return
        if portable(self.ctx) is None:
            self.report(
                DEVICE_STRING,
                literal,
                f"device string in {where} now names the NPU",
                fix=rewrite_device_literal,
                crashes=True,
            )
            return
        accelerator = accelerator_type(self.ctx, self.enabled)
        if string_value(literal) == "cuda":
            spelled = accelerator
        else:  # "cuda:1", f"cuda:{rank}": an f-string around the name (the expression in place has quotes)
            spelled = accelerator_indexed(literal, accelerator) if isinstance(accelerator, cst.Name) else None
        if isinstance(spelled, cst.IfExp) and choice:  # the accelerator's type in place, as one side of a choice
            spelled = spelled.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        if spelled is None:
            why = _PORTABLE_TEMPLATE_ADVICE if isinstance(accelerator, cst.Name) else _PORTABLE_DEVICE_ADVICE
            self.report(
                DEVICE_STRING,
                literal,
                f"device string in {where} left as is: {why}",
                severity=Severity.WARNING,
                crashes=True,
            )
            return
        self.report(
            DEVICE_STRING,
            literal,
            f"device string in {where} now names the current accelerator",
            fix=lambda updated: spelled,
            crashes=True,
        )

    def visit_Expr(self, node: cst.Expr) -> None:
        if isinstance(node.value, cst.Call):
            self._discarded.add(id(node.value))

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        qualname = self.ctx.qualname(func)
        if (qualname or "").endswith("DataParallel") or any(
            a.keyword is not None and a.keyword.value in ("device_ids", "output_device") for a in node.args
        ):
            # DDP's device lists are NPU306's (`distributed`), decided after this checker's `finish`.
            for arg in node.args:
                if isinstance(arg.value, (cst.List, cst.Tuple)):
                    self._followed.update(id(e.value) for e in arg.value.elements)
        # Any receiver, imported names included (`from app import net; net.cuda()`); only the module
        # `torch.cuda` itself is not a tensor or module.
        if isinstance(func, cst.Attribute) and func.attr.value == "cuda" and qualname != "torch.cuda":
            self._cuda_method(node, func)
        positional = [arg for arg in node.args if arg.keyword is None and arg.star == ""]
        if qualname in ("torch.device", "torch.set_default_device") and positional:
            self._device_value(positional[0].value, f"`{qualname}(...)`")
        elif isinstance(func, cst.Attribute) and func.attr.value in ("to", "to_empty"):
            for arg in positional:
                self._device_value(arg.value, f"`.{func.attr.value}(...)`")
        elif isinstance(func, cst.Attribute) and func.attr.value == "add_argument":
            self._argparse_device(node, positional)
        elif isinstance(func, cst.Attribute) and func.attr.value == "startswith" and len(node.args) == 1:
            self._prefix_test(func.value, node.args[0])
        callee = _target_name(func) if isinstance(func, (cst.Name, cst.Attribute)) else ""
        for arg in node.args:
            if (
                arg.keyword is not None
                and arg.keyword.value == "device_type"
                and not (qualname or "").startswith("torch.")
            ):
                if device_literal(arg.value) is not None:
                    self._wrapper_calls.append((callee, arg))
            if arg.keyword is not None and arg.keyword.value == "accelerator":
                self._accelerator_value(arg.value)
            if arg.keyword is not None and arg.keyword.value in DEVICE_KEYWORDS:
                self._device_value(arg.value, f"`{arg.keyword.value}=`", containers=arg.keyword.value == "map_location")
            elif arg.keyword is not None and arg.keyword.value == "type" and qualname == "torch.device":
                self._device_value(arg.value, "`torch.device(type=...)`")

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._defs.setdefault(node.name.value, []).append(node)

    def _check_wrapper_call(self, callee: str, arg: cst.Arg) -> None:
        defs = self._defs.get(callee, [])
        if len(defs) == 1 and _passes_on_device(self.ctx, defs[0], "device_type"):
            self._device_value(arg.value, f"`device_type=` of `{callee}` (it passes it on as a device)")
            return
        self.report(
            DEVICE_STRING,
            arg.value,
            f'`device_type="cuda"` passed to `{callee or "a callable"}` left as is: it is not visibly passed on to '
            'autocast or a device in this file; if it selects the device there, pass "npu"',
            severity=Severity.WARNING,
        )

    def _prefix_test(self, tested: cst.BaseExpression, arg: cst.Arg) -> None:
        prefix = string_value(arg.value) if arg.keyword is None and arg.star == "" else None
        if prefix is not None and _NPU_PREFIX.fullmatch(prefix):
            self._npu_tested.add(self.ctx.code(tested))
        elif prefix is not None and _CUDA_PREFIX.fullmatch(prefix) and isinstance(arg.value, cst.SimpleString):
            self._prefix_tests.append((tested, arg.value))

    def _argparse_device(self, node: cst.Call, positional: list[cst.Arg]) -> None:
        flags = [string_value(arg.value) or "" for arg in positional]
        if not any(_mentions_device(flag) for flag in flags):
            return
        for arg in node.args:
            if arg.keyword is not None and arg.keyword.value in ("default", "choices"):
                self._device_value(arg.value, f"the `{flags[0]}` option's {arg.keyword.value}", containers=True)

    def _accelerator_value(self, node: cst.BaseExpression | None) -> None:
        if isinstance(node, cst.IfExp):
            self._accelerator_value(node.body)
            self._accelerator_value(node.orelse)
            return
        value = string_value(node) if node is not None else None
        if value in _ACCELERATOR_VALUES:
            self.report(ACCELERATOR_STRING, node, _ACCELERATOR_ADVICE.format(value=value), crashes=True)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            if isinstance(target.target, cst.Name):
                self._assigned.setdefault(target.target.value, []).append(node.value)
            if "accelerator" in _target_name(target.target).lower():
                self._accelerator_value(node.value)
            if _mentions_device(_target_name(target.target)):
                self._device_value(node.value, f"`{_target_name(target.target)}`")
            if isinstance(target.target, cst.Attribute) and target.target.attr.value == "is_cuda":
                self._is_cuda_is_own_attribute = True

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if _mentions_device(_target_name(node.target)):
            self._device_value(node.value, f"`{_target_name(node.target)}`")
        if isinstance(node.target, cst.Attribute) and node.target.attr.value == "is_cuda":
            self._is_cuda_is_own_attribute = True

    def visit_Param(self, node: cst.Param) -> None:
        self._assigned.setdefault(node.name.value, []).append(None)  # a parameter: its value is unknown
        if _mentions_device(node.name.value):
            self._device_value(node.default, f"the default of `{node.name.value}`")

    def visit_DictElement(self, node: cst.DictElement) -> None:
        key = string_value(node.key)
        if key is not None and (_mentions_device(key) or key in DEVICE_KEYWORDS):
            self._device_value(node.value, f'the "{key}" entry')

    def visit_IfExp(self, node: cst.IfExp) -> None:
        # `"cuda" if torch.cuda.is_available() else "cpu"`: a device choice wherever it is assigned.
        other = [string_value(node.body), string_value(node.orelse)]
        if "cuda" in self.ctx.code(node.test) or any(v in OTHER_DEVICES for v in other if v):
            self._device_value(node.body, "a device choice", choice=True)
            self._device_value(node.orelse, "a device choice", choice=True)

    # -- .cuda() --------------------------------------------------------------------------------------

    def _cuda_method(self, node: cst.Call, func: cst.Attribute) -> None:
        if "cuda" in self.ctx.imports.functions:
            self.report(
                CUDA_METHOD,
                func,
                "`.cuda()` not rewritten: this file defines its own `cuda` function or method, and the call "
                "may be to it; use `.npu()` where it moves a tensor or module",
                severity=Severity.WARNING,
                crashes=True,
            )
            return
        quantising = self._in_place_cuda_package()
        if id(node) in self._discarded and quantising is not None and not _plainly_module(func.value):
            self.report(
                CUDA_METHOD,
                func,
                f"`.cuda()` not rewritten: its result is thrown away and this file uses {quantising}, whose "
                "parameters quantise themselves in place on `.cuda()`; `.npu()` returns a new tensor instead. "
                "Move the module that owns the parameter (`model.npu()`) or assign the result",
                severity=Severity.WARNING,
                crashes=True,
            )
            return
        if portable(self.ctx) is not None:
            self._portable_cuda_method(node, func)
            return
        self.report(
            CUDA_METHOD,
            func,
            "`.cuda()` now moves to the NPU: `.npu()`",
            fix=lambda updated: updated.with_changes(attr=cst.Name("npu")),
            crashes=True,
        )

    def _portable_cuda_method(self, node: cst.Call, func: cst.Attribute) -> None:
        """`.cuda()` -> `.to(ACCELERATOR)` (the current accelerator's type), keeping `non_blocking=`; a device
        index (`.cuda(1)`, `.cuda(device=d)`) is reported: it names a CUDA device the accelerator's may not be."""
        device = accelerator_type(self.ctx, self.enabled)
        indexes = [arg for arg in node.args if arg.keyword is None or arg.keyword.value != "non_blocking"]
        if device is not None and not indexes:
            self._move(node, device, "`.cuda()` now moves to the current accelerator")
            return
        first = indexes[0] if len(indexes) == 1 else None
        positional = first is not None and first.keyword is None and not first.star
        by_keyword = first is not None and first.keyword is not None and first.keyword.value == "device"
        index = first.value if first is not None and (positional or by_keyword) else None
        if isinstance(device, cst.Name) and isinstance(index, cst.Integer):
            self._move(node, indexed_device(device, index), "`.cuda(i)` now moves to the current accelerator's i")
        elif isinstance(device, cst.Name) and isinstance(index, cst.Name):
            self._indexed_moves.append((node, index.value))  # an int or a torch.device: decided in `finish`
        else:
            self.report(
                CUDA_METHOD,
                node,
                "`.cuda(...)` left as is: move it to the current accelerator, `.to(torch.device(ACCELERATOR, index))` "
                f"for a given device index, `ACCELERATOR` being `{ACCELERATOR_TYPE}`"
                + ("" if device is not None else "; this file does not import torch, or the torch version lacks it"),
                severity=Severity.WARNING,
                crashes=True,
            )

    def _move(self, node: cst.Call, device: cst.BaseExpression, message: str) -> None:
        """`x.cuda(..., non_blocking=b)` -> `x.to(device, non_blocking=b)`."""

        def fix(updated: cst.Call) -> cst.Call:
            to = updated.func.with_changes(attr=cst.Name("to"))
            kept = [arg for arg in updated.args if arg.keyword is not None and arg.keyword.value == "non_blocking"]
            return updated.with_changes(func=to, args=[cst.Arg(device), *kept])

        self.report(CUDA_METHOD, node, message, fix=fix, crashes=True)

    def _indexed_move(self, node: cst.Call, index: str) -> None:
        """`.cuda(rank)`: an int index or a torch.device (`.cuda()` takes both); rewritten where the file gives
        `rank` one value, an int, and binds it nowhere else."""
        if self._bindings is None:
            self._bindings = _Bindings()
            self.ctx.module.visit(self._bindings)
        value = self._single_value(index)
        proven = (
            not self._bindings.star
            and self._bindings.count[index] == 1
            and (
                isinstance(value, cst.Integer)
                or (
                    isinstance(value, cst.Call)
                    and isinstance(value.func, cst.Name)
                    and value.func.value == "int"
                    and not self._bindings.count["int"]
                )
            )
        )
        device = accelerator_type(self.ctx, self.enabled)
        if proven and isinstance(device, cst.Name):
            self._move(
                node,
                indexed_device(device, cst.Name(index)),
                f"`.cuda({index})` now moves to the current accelerator's device `{index}` (an int here)",
            )
            return
        self.report(
            CUDA_METHOD,
            node,
            f"`.cuda({index})` left as is: `{index}` is not proven an int here, and `.cuda()` also takes a "
            f'torch.device; for a device index write `.to(f"{{ACCELERATOR}}:{{{index}}}")`, for a torch.device '
            f"`.to({index})`",
            severity=Severity.WARNING,
            crashes=True,
        )

    def _in_place_cuda_package(self) -> str | None:
        modules = self.ctx.imports.modules
        return next((p for p in IN_PLACE_CUDA_PACKAGES if any(m == p or m.startswith(p + ".") for m in modules)), None)

    # -- .is_cuda ------------------------------------------------------------------------------------

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value == "is_cuda":
            self._is_cuda_reads.append(node)

    def visit_Element(self, node: cst.Element) -> None:
        # `args=("cuda:0",) + args` into `rpc.remote`, `devices = ["cuda:0", "cuda:1"]`: an indexed CUDA
        # device (no other string reads "cuda:1") in a container the rules do not follow.
        literal = device_literal(node.value)
        if literal is not None and _INDEXED_CUDA.match(self.ctx.code(literal).strip("\"'fFrR")):
            self._carried.append(literal)

    def finish(self) -> None:
        for node, index in self._indexed_moves:
            self._indexed_move(node, index)
        for node in self._is_cuda_reads:
            if self._is_cuda_is_own_attribute:
                self.report(
                    IS_CUDA,
                    node,
                    "`.is_cuda` not rewritten: this file assigns its own `is_cuda` attribute; use `.is_npu` "
                    "where it asks whether a tensor is on the device",
                    severity=Severity.WARNING,
                )
            else:
                self.report(
                    IS_CUDA,
                    node,
                    "`.is_cuda` is False on NPU: `.is_npu`",
                    fix=lambda updated: updated.with_changes(attr=cst.Name("is_npu")),
                    guard=True,
                )
        comparisons = replace(_COMPARISONS, visibly=lambda code: _visibly_device(code) or self._travelling(code))
        for node in self._comparisons:
            if not self._keep_npu_aware(node):
                comparisons.check(self, node, self._already_tells_npu)
        for callee, arg in self._wrapper_calls:
            self._check_wrapper_call(callee, arg)
        for tested, literal in self._prefix_tests:
            self._check_prefix_test(self.ctx.code(tested), literal)
        reported: set[str] = set()
        for name, where in self._device_names:
            value = self._single_value(name)
            if value is None or _mentions_device(name):
                continue
            if self._read_only_as_a_device(name):
                self._device_value(value, f"`{name}`, used as {where}", containers=True)
            elif device_literal(value) is not None and name not in reported:
                reported.add(name)
                self.report(
                    DEVICE_STRING,
                    value,
                    f"`{name}` is used as {where} and elsewhere: left as is; pass an NPU device where it selects one",
                    severity=Severity.WARNING,
                )
        self._carried_devices()  # last: after the rules above had their say on each literal

    def _carried_devices(self) -> None:
        """The indexed CUDA devices in tuples and lists that no rule rewrote or reported: said, not left silent."""
        reported = {id(r.node) for r in self.ctx.reports}
        for literal in self._carried:
            if id(literal) in reported or id(literal) in self._followed:
                continue
            self.report(
                DEVICE_STRING,
                literal,
                f"`{self.ctx.code(literal)}` in a tuple or list left as is: where it goes is not followed (an argument "
                'list handed on, such as `rpc.remote(..., args=...)`); if it selects a device, name the NPU ("npu:N")',
                severity=Severity.WARNING,
            )

    def _read_only_as_a_device(self, name: str) -> bool:
        """Whether every read of `name` selects a device or tests one: `acc = "cuda"` also passed to
        `Trainer(accelerator=acc)` or printed must keep its value there."""
        if self._loads is None:
            self._loads = _Loads()
            self.ctx.module.visit(self._loads)
        device_reads = sum(n == name for n, _ in self._device_names)
        device_reads += sum(self.ctx.code(tested) == name for tested, _ in self._prefix_tests)
        device_reads += sum(
            self.ctx.code(operand) == name
            for node in self._comparisons
            for operand in (node.left, *(target.comparator for target in node.comparisons))
        )
        return self._loads.count[name] <= device_reads

    def _single_value(self, name: str) -> cst.BaseExpression | None:
        """The value of a name given exactly one in the whole file: anything else needs scope analysis."""
        values = self._assigned.get(name, [])
        return values[0] if len(values) == 1 else None

    def _travelling(self, code: str) -> bool:
        """Whether `code` is a variable whose one device-string value `finish` rewrites (used as a device)."""
        value = self._single_value(code)
        return (
            DEVICE_STRING.id in self.enabled
            and value is not None
            and any(name == code for name, _ in self._device_names)
            and _holds_device(value)
            and self._read_only_as_a_device(code)
        )

    def _check_prefix_test(self, tested: str, literal: cst.SimpleString) -> None:
        reason = self._already_tells_npu(tested)
        if reason is not None:
            self.report(DEVICE_COMPARISON, literal, reason, severity=Severity.INFO)
        elif _visibly_device(tested) or self._travelling(tested):
            self.report(
                DEVICE_COMPARISON,
                literal,
                "prefix test of a device string now tests for the NPU",
                fix=rewrite_device_literal,
                guard=True,
            )
        else:
            self.report(
                DEVICE_COMPARISON,
                literal,
                f'`{tested}.startswith(...)` tests for a CUDA device string: if `{tested}` is a device, test for "npu"',
                severity=Severity.WARNING,
            )

    # -- comparisons -----------------------------------------------------------------------------------

    # Code that already supports the NPU (`if device.type == "npu": ... elif device.type == "cuda": ...`,
    # `self.is_npu = device.type == "npu"` next to `self.is_cuda = device.type == "cuda"`) keeps its CUDA
    # side: the comparisons of a value also compared with "npu" are decided in `finish`, and the CUDA
    # branches of an if-chain that tests for the NPU are left whole (`FileContext.keep_cuda`).

    def visit_Comparison(self, node: cst.Comparison) -> None:
        self._comparisons.append(node)
        operands = [node.left, *(target.comparator for target in node.comparisons)]
        for left, right in zip(operands, operands[1:]):
            for literal_side, other in ((left, right), (right, left)):
                if _names_npu(literal_side):
                    self._npu_tested.add(self.ctx.code(other))

    def visit_If(self, node: cst.If) -> bool:
        if id(node) in self._elifs:
            return True
        chain = [node]
        while isinstance(chain[-1].orelse, cst.If):
            self._elifs.add(id(chain[-1].orelse))
            chain.append(chain[-1].orelse)
        tests = [self.ctx.code(branch.test) for branch in chain]
        npu = next((i for i, test in enumerate(tests) if _NPU_TEST.search(test)), None)
        if npu is None:
            return True
        for branch, test in zip(chain, tests):
            if _CUDA_TEST.search(test) and not _NPU_TEST.search(test):
                self.ctx.keep_cuda(branch.test)
                self.ctx.keep_cuda(branch.body)
                self.report(
                    DEVICE_COMPARISON,
                    branch.test,
                    f"`{test}` left as is: this if-chain already has an NPU branch (`{tests[npu]}`)",
                    severity=Severity.INFO,
                )
        return True

    def _keep_npu_aware(self, node: cst.Comparison) -> bool:
        """`device.type == "cuda"` where `device.type` is also compared with "npu": the CUDA side of code that
        already supports the NPU. The test stays, and so does all it guards (`self.is_cuda = device.type ==
        "cuda" and torch.cuda.is_available()`, then `torch.cuda.Stream()` under `if self.is_cuda:`), whole:
        a half-migrated CUDA branch would neither run as before nor take the code's own NPU branch."""
        operands = [node.left, *(target.comparator for target in node.comparisons)]
        for index, target in enumerate(node.comparisons):
            if not isinstance(target.operator, cst.Equal):
                continue
            for literal_side, other in ((operands[index], operands[index + 1]), (operands[index + 1], operands[index])):
                code = self.ctx.code(other)
                if _device_literals(literal_side) and code in self._npu_tested:
                    self.ctx.keep_cuda(node)
                    self.report(
                        DEVICE_COMPARISON,
                        node,
                        f'`{self.ctx.code(node)}` left as is: `{code}` is also compared with "npu" here, the code '
                        "already supports it; the CUDA code this test guards is left as it is too",
                        severity=Severity.INFO,
                    )
                    return True
        return False

    def _already_tells_npu(self, other: str) -> str | None:
        if other in self._npu_tested:
            return f'comparison left as is: `{other}` is also compared with "npu" here, the code already supports it'
        return None


_INDEXED_CUDA = re.compile(r"cuda:(\d|\{)")


def _plainly_module(receiver: cst.BaseExpression) -> bool:
    """`model.cuda()` / `self.model.cuda()`: a module moves its parameters in place on `.npu()` as well."""
    name = _target_name(receiver).lower()
    return name in ("model", "module", "net", "self") or name.endswith(("model", "_net", "module"))


_NPU_TEST = re.compile(r"""["']npu(:\d*)?["']|\bis_npu\b""")
_CUDA_TEST = re.compile(r"""["']cuda(:\d*)?["']|\bis_cuda\b|\bcuda\.is_available\b""")
_CUDA_PREFIX = re.compile(r"cuda(:\d*)?")
_NPU_PREFIX = re.compile(r"npu(:\d*)?")


def _visibly_device(code: str) -> bool:
    return _mentions_device(code) or code.endswith(".type")


_DEVICE_POSITIONS = frozenset({"torch.autocast", "torch.amp.autocast", "torch.device", "torch.set_default_device"})


def _passes_on_device(ctx, function: cst.FunctionDef, param: str) -> bool:
    """Whether `function` has a parameter `param` that it hands, unchanged, to autocast or a device position:
    a `device_type=` / device keyword, the first argument of `torch.autocast` / `torch.device`, `.to(...)`."""
    params = function.params
    named = [*params.posonly_params, *params.params, *params.kwonly_params]
    if not any(p.name.value == param for p in named):
        return False
    found = False

    class _Uses(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            nonlocal found
            positional = [a for a in node.args if a.keyword is None and a.star == ""]
            to = isinstance(node.func, cst.Attribute) and node.func.attr.value in ("to", "to_empty")
            for arg in node.args:
                if not (isinstance(arg.value, cst.Name) and arg.value.value == param):
                    continue
                if arg.keyword is not None:
                    found |= arg.keyword.value in DEVICE_KEYWORDS or arg.keyword.value == "device_type"
                elif to or (positional and arg is positional[0] and ctx.qualname(node.func) in _DEVICE_POSITIONS):
                    found = True

    function.body.visit(_Uses())
    return found


def _holds_device(value: cst.BaseExpression) -> bool:
    if isinstance(value, cst.IfExp):
        return _holds_device(value.body) or _holds_device(value.orelse)
    return device_literal(value) is not None


def _names_npu(node: cst.BaseExpression) -> bool:
    value = string_value(node)
    return value is not None and re.fullmatch(r"npu(:\d+)?", value) is not None


_LOGGING = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical", "log"})


class _Loads(cst.CSTVisitor):
    """How often each plain name is read in a module (not assigned, declared, imported, a keyword, nor only
    printed or logged)."""

    def __init__(self) -> None:
        self.count: Counter[str] = Counter()
        self._not_reads: set[int] = set()

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._not_reads.add(id(node.attr))

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self._not_reads.add(id(node.keyword))

    def visit_Param(self, node: cst.Param) -> None:
        self._not_reads.add(id(node.name))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._not_reads.add(id(node.name))

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._not_reads.add(id(node.name))

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._not_reads.add(id(node.target))

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._not_reads.add(id(node.target))

    def visit_Call(self, node: cst.Call) -> None:
        # Printing or logging a device shows the device: that it now says "npu" is what the user wants.
        func = node.func
        shown = (isinstance(func, cst.Name) and func.value == "print") or (
            isinstance(func, cst.Attribute) and func.attr.value in _LOGGING
        )
        if shown:
            self._not_reads.update(id(arg.value) for arg in node.args if isinstance(arg.value, cst.Name))

    def visit_Name(self, node: cst.Name) -> None:
        if id(node) not in self._not_reads:
            self.count[node.value] += 1


class _Bindings(cst.CSTVisitor):
    """How often each plain name is bound in a module, anywhere and in any way (assigned, a loop or `with`
    target, a parameter, imported, declared global...): a name bound once has the one value it is given."""

    def __init__(self) -> None:
        self.count: Counter[str] = Counter()
        self.star = False  # `from m import *` binds names no one can count

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self.star |= isinstance(node.names, cst.ImportStar)

    def _bind(self, target: cst.CSTNode | None) -> None:
        if isinstance(target, cst.Name):
            self.count[target.value] += 1
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._bind(element.value)
        elif isinstance(target, cst.StarredElement):
            self._bind(target.value)
        elif isinstance(target, cst.AsName):
            self._bind(target.name)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._bind(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._bind(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._bind(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._bind(node.target)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._bind(node.target)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        self._bind(node.asname)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._bind(node.target)

    def visit_Param(self, node: cst.Param) -> None:
        self._bind(node.name)

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        self._bind(node.name)

    def visit_Del(self, node: cst.Del) -> None:
        self._bind(node.target)

    def visit_Global(self, node: cst.Global) -> None:
        for item in node.names:
            self._bind(item.name)

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        for item in node.names:
            self._bind(item.name)

    def visit_ImportAlias(self, node: cst.ImportAlias) -> None:
        if node.asname is not None:
            self._bind(node.asname)
        else:
            name = node.name
            while isinstance(name, cst.Attribute):
                name = name.value
            self._bind(name)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._bind(node.name)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._bind(node.name)

    def visit_MatchAs(self, node: cst.MatchAs) -> None:
        self._bind(node.name)

    def visit_MatchStar(self, node: cst.MatchStar) -> None:
        self._bind(node.name)


def _device_literals(node: cst.BaseExpression) -> list[cst.CSTNode]:
    if isinstance(node, (cst.Tuple, cst.List, cst.Set)):
        found = [device_literal(e.value) for e in node.elements]
        return [f for f in found if f is not None]
    found = device_literal(node)
    return [found] if found is not None else []


_COMPARISONS = LiteralComparisons(
    DEVICE_COMPARISON,
    literals=_device_literals,
    visibly=_visibly_device,
    fix=rewrite_device_literal,
    rewritten="comparison with the device type now tests for the NPU",
    unsure='comparison of `{other}` with a CUDA device string: if it is a device, compare with "npu" instead',
    guard=True,
)
