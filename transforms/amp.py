"""Automatic mixed precision: `torch.cuda.amp` becomes the device-generic `torch.amp` on the NPU.

`torch.cuda.amp.autocast(...)`, `GradScaler(...)`, `custom_fwd` and `custom_bwd` become their `torch.amp`
counterparts with the NPU as device, whether reached through `torch` or through imports of
`torch.cuda.amp` (which are rewritten together with every use, or not at all). Device-type arguments of
`torch.autocast` and friends become "npu". Driven by `data/amp.toml`.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from npu_migrate.engine.astindex import name_sets, words_may_name
from npu_migrate.engine.checkers import NameUseChecker
from npu_migrate.engine.context import FileContext
from npu_migrate.engine.rule import EVERY_TARGET, Example, FixSafety, Rule
from npu_migrate.findings import Severity
from npu_migrate.program.api import ACCELERATOR_TYPE, load_table
from npu_migrate.program.imports import Binding, rebind_import
from npu_migrate.transforms.common.accelerator import accelerator_type, portable
from npu_migrate.transforms.common.arguments import argument
from npu_migrate.transforms.common.devices import device_literal, has_device_literal, rewrite_device_literal
from npu_migrate.transforms.common.qualnames import is_under, with_tail

CUDA_AMP = Rule(
    id="NPU401",
    name="cuda-amp",
    family="amp",
    summary='`torch.cuda.amp.autocast` / `GradScaler` / `custom_fwd` / `custom_bwd` become `torch.amp` ones on "npu"',
    what="""
    Rewrites `torch.cuda.amp.autocast(...)` -> `torch.amp.autocast("npu", ...)` (positional `enabled`,
    `dtype`, `cache_enabled` become keywords; like torch's own replacement the dtype then defaults to
    `torch.get_autocast_dtype("npu")`, float16 unless changed), `torch.cuda.amp.GradScaler(...)` ->
    `torch.amp.GradScaler("npu", ...)`, and the `custom_fwd` / `custom_bwd` decorators ->
    `torch.amp.custom_fwd(..., device_type="npu")`. `amp = partial(torch.cuda.amp.autocast, ...)` becomes
    `partial(torch.amp.autocast, "npu", ...)` when `amp` is a function's local or a private module-level
    name, only ever called with keywords (a positional argument would land one place off). Imports from `torch.cuda.amp` are rebound to
    `torch.amp` and their uses rewritten, only if every use can be. For torch_npu versions whose torch
    lacks the `torch.amp` name, the name moves to `torch.npu.amp`, which keeps the CUDA signature.
    """,
    why="""
    `torch.cuda.amp` autocasts and scales for CUDA devices only: on an NPU host the model runs in
    float32 (autocast disabled, with a warning) and the scaler does nothing.
    """,
    example=Example(
        before="""
            import torch
            from torch.cuda.amp import GradScaler, autocast

            scaler = GradScaler()


            def step(model, x):
                with autocast(dtype=torch.bfloat16):
                    return model(x)
        """,
        after="""
            import torch
            import torch_npu
            from torch.amp import GradScaler, autocast

            scaler = GradScaler("npu")


            def step(model, x):
                with autocast("npu", dtype=torch.bfloat16):
                    return model(x)
        """,
    ),
    fix_safety=FixSafety.SAFE,
    targets=EVERY_TARGET,
)

AMP_DEVICE = Rule(
    id="NPU402",
    name="amp-device-type",
    family="amp",
    summary='`torch.autocast("cuda")`, `torch.amp.GradScaler("cuda")` and other AMP device types become `"npu"`',
    what="""
    Rewrites the device type "cuda" of `torch.autocast`, `torch.amp.autocast`, `torch.amp.GradScaler`,
    `torch.amp.custom_fwd` / `custom_bwd` and the `torch.get/set_autocast_dtype`,
    `is/set_autocast_enabled` functions to "npu". `torch.amp.GradScaler()` and FSDP's
    `ShardedGradScaler()` without a device (both default to "cuda") get "npu".
    """,
    why="""
    The device type selects which device autocasts; "cuda" does nothing on an NPU.
    """,
    example=Example(
        before="""
            import torch


            def forward(model, x):
                with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                    return model(x)
        """,
        after="""
            import torch
            import torch_npu


            def forward(model, x):
                with torch.autocast(device_type="npu", dtype=torch.bfloat16):
                    return model(x)
        """,
    ),
    fix_safety=FixSafety.SAFE,
    targets=EVERY_TARGET,
)

GPU_DTYPE = Rule(
    id="NPU403",
    name="autocast-gpu-dtype",
    family="amp",
    summary="`torch.get_autocast_gpu_dtype()` / `set_autocast_gpu_dtype` become `torch.npu.get/set_autocast_dtype`",
    what="""
    Rewrites `torch.get_autocast_gpu_dtype()` and `torch.set_autocast_gpu_dtype(...)` to torch_npu's
    `torch.npu.get_autocast_dtype()` and `torch.npu.set_autocast_dtype(...)`.
    """,
    why="""
    The GPU accessors read and set CUDA's autocast dtype, which the NPU does not use; torch_npu's
    counterparts do the same for the NPU.
    """,
    example=Example(
        before="""
            import torch

            dtype = torch.get_autocast_gpu_dtype()
        """,
        after="""
            import torch
            import torch_npu

            dtype = torch.npu.get_autocast_dtype()
        """,
    ),
    fix_safety=FixSafety.SAFE,
)

AMP_NOT_MIGRATED = Rule(
    id="NPU404",
    name="cuda-amp-not-migrated",
    family="amp",
    summary="`torch.cuda.amp` uses that cannot be rewritten safely are reported",
    what="""
    Reports the `torch.cuda.amp` uses NPU401 cannot rewrite: a class used other than by calling it
    (`isinstance(s, GradScaler)`, passing `autocast` around, a `partial` of it that may be called with
    positional arguments), `*args` whose position is unknown, private
    helpers, or names the chosen torch_npu version lacks. The code (and its import) is left alone; the
    finding says what to write.
    """,
    why="""
    Left as it is, the code keeps using CUDA's AMP, which does nothing on an NPU (see NPU401).
    """,
    example=Example(
        before="""
            import torch


            def is_scaled(scaler):
                return isinstance(scaler, torch.cuda.amp.GradScaler)
        """,
        reports="use `torch.amp.GradScaler` with the NPU device by hand",
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    severity=Severity.WARNING,
    targets=EVERY_TARGET,
)

_TABLE = load_table("amp.toml")
_CUDA_AMP: dict[str, dict] = _TABLE["cuda_amp"]
_DEVICE_TYPE_ARGS: dict[str, list] = _TABLE["device_type_arguments"]
#: Their device defaults to "cuda" when left out: on an NPU host loss scaling silently turns itself off.
_DEFAULTS_TO_CUDA = frozenset(
    {
        "torch.amp.GradScaler",
        "torch.amp.grad_scaler.GradScaler",
        "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler",
    }
)
_SCALERS = name_sets(sorted(_DEFAULTS_TO_CUDA))
_RENAMED: dict[str, str] = _TABLE["renamed"]
PREFIX = "torch.cuda.amp"
_NAMES = name_sets([PREFIX, *_RENAMED])
_DEVICE_CALLS = name_sets(_DEVICE_TYPE_ARGS)


def _torch_version(ctx: FileContext) -> tuple[int, int]:
    """The torch release the chosen torch_npu version is built for (torch_npu 2.5.1.post1 -> torch 2.5)."""
    major, minor = ctx.api.version.split(".")[:2]
    return int(major), int(minor)


def _npu_string() -> cst.SimpleString:
    return cst.SimpleString('"npu"')


def _keyword_arg(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(
        value=value,
        keyword=cst.Name(name),
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
    )


def _with_device(args: list[cst.Arg], spec: dict, device: cst.BaseExpression) -> list[cst.Arg]:
    """The arguments of the torch.amp call that replaces a torch.cuda.amp call with `args`."""
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    if spec["device"] == "first":
        keywords = spec.get("keywords", [])
        converted = [
            _keyword_arg(keywords[i], arg.value).with_changes(comma=arg.comma)
            if keywords and arg.keyword is None
            else arg
            for i, arg in enumerate(args)
        ]
        # The device takes the first argument's comma, so a call laid out one argument per line stays so.
        lead = converted[0].comma if converted and isinstance(converted[0].comma, cst.Comma) else comma
        first = cst.Arg(value=device, comma=lead if converted else cst.MaybeSentinel.DEFAULT)
        return [first, *converted]
    new = _keyword_arg("device_type", device)
    if not args:
        return [new]
    last = args[-1]
    if isinstance(last.comma, cst.Comma):  # a trailing comma stays trailing
        return [*args, new.with_changes(comma=last.comma)]
    return [*args[:-1], last.with_changes(comma=comma), new]


def _npu_partial(
    partial: cst.Call, func: cst.BaseExpression | None, spec: dict, device: cst.BaseExpression
) -> cst.Call:
    """`partial(torch.cuda.amp.X, ...)` with `func` (if given) for the function and the NPU device added."""
    first, rest = partial.args[0], list(partial.args[1:])
    if func is not None:
        first = first.with_changes(value=func)
    if not isinstance(first.comma, cst.Comma):
        first = first.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return partial.with_changes(args=[first, *_with_device(rest, spec, device)])


def _bound_name(module: cst.Module, value: cst.BaseExpression) -> str | None:
    """The name `value` is assigned to (`amp_ctx = partial(...)`), if that is the name's only assignment and no
    other file can call it: a function's local, or a private (`_`) module-level name. A public module-level
    name may be imported and called elsewhere, and a class attribute is called as `self.amp(...)`."""
    targets: dict[str, int] = {}
    found: list[str] = []
    scopes: list[type] = []

    class _Assignments(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            scopes.append(cst.FunctionDef)

        def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
            scopes.pop()

        def visit_ClassDef(self, node: cst.ClassDef) -> None:
            scopes.append(cst.ClassDef)

        def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
            scopes.pop()

        def visit_Assign(self, node: cst.Assign) -> None:
            for target in node.targets:
                if isinstance(target.target, cst.Name):
                    name = target.target.value
                    targets[name] = targets.get(name, 0) + 1
                    local = scopes[-1:] == [cst.FunctionDef] or (not scopes and name.startswith("_"))
                    if node.value is value and len(node.targets) == 1 and local:
                        found.append(name)

    module.visit(_Assignments())
    return found[0] if found and targets[found[0]] == 1 else None


def _called_with_keywords_only(module: cst.Module, name: str) -> bool:
    """Whether every read of `name` in `module` is a call with keyword arguments only."""
    calls: set[int] = set()
    reads: list[cst.Name] = []

    class _Reads(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if all(a.keyword is not None and a.star == "" for a in node.args):
                calls.add(id(node.func))

        def visit_Assign(self, node: cst.Assign) -> bool:
            node.value.visit(self)
            return False  # the targets are writes

        def visit_Attribute(self, node: cst.Attribute) -> bool:
            node.value.visit(self)
            return False  # `x.name` is no read of `name`

        def visit_Arg(self, node: cst.Arg) -> bool:
            node.value.visit(self)
            return False  # nor is the keyword of `f(name=...)`

        def visit_Name(self, node: cst.Name) -> None:
            if node.value == name:
                reads.append(node)

    module.visit(_Reads())
    return all(id(node) in calls for node in reads)


def _rebind_statements(line: cst.SimpleStatementLine, statements: dict[int, dict[int, str]]):
    # From the last statement backwards, so that a statement split in two does not shift the ones before it.
    for index in sorted(statements, reverse=True):
        line = rebind_import(line, index, statements[index])
    return line


@dataclass(eq=False)
class Use:
    node: cst.Name | cst.Attribute  # the expression that names torch.cuda.amp.<name>
    qualname: str
    binding: Binding
    parent: cst.Call | cst.Decorator | None  # the call it is the function of, or the decorator it is

    @property
    def name(self) -> str | None:
        """`autocast` for `torch.cuda.amp.autocast`; None for the module itself or deeper names."""
        parts = self.qualname.split(".")
        return parts[3] if len(parts) == 4 else None


_NO_PORTABLE_DEVICE = (
    "this file does not import torch, or the chosen --torch-version cannot name the accelerator (2.7+); pass "
    f"`{ACCELERATOR_TYPE}` as the device type"
)


class AmpChecker(NameUseChecker):
    rules = (CUDA_AMP, AMP_DEVICE, GPU_DTYPE, AMP_NOT_MIGRATED)
    # Not "amp", which "example" and "clamp" hold (two thirds of transformers' files): a torch.cuda.amp name
    # has the identifier `cuda` too, and every other key has one of the rest in a part.
    markers = ("cuda", "autocast", "GradScaler", "custom_fwd", "custom_bwd")

    @classmethod
    def wants(cls, index) -> bool:
        # A name under torch.cuda.amp or a GPU-only autocast function; or a call with a device type argument,
        # which is only rewritten when that argument is a "cuda" literal (`torch.autocast(device_type)` and
        # `torch.is_autocast_enabled()` alone are not).
        return (
            index.may_name(_NAMES)
            or (index.may_name(_DEVICE_CALLS) and has_device_literal(index))
            or index.may_name(_SCALERS)
        )

    @classmethod
    def wants_words(cls, words) -> bool:
        # Identifiers only: a "cuda" literal may be spelled with escapes, which its words would not show.
        return words_may_name(words, _NAMES) or words_may_name(words, _DEVICE_CALLS) or words_may_name(words, _SCALERS)

    def __init__(self, ctx, enabled) -> None:
        super().__init__(ctx, enabled)
        self._parents: dict[int, cst.Call | cst.Decorator] = {}
        self._uses: list[Use] = []
        # `partial(torch.cuda.amp.autocast, ...)`: the reference's node -> the partial call.
        self._partials: dict[int, cst.Call] = {}
        self._new_torch = _torch_version(ctx)
        # The device type the migrated calls name: "npu", or in the portable target the current accelerator's
        # (None where this file or torch version cannot spell it: then the uses are reported, not rewritten).
        self._device = _npu_string() if portable(ctx) is None else accelerator_type(ctx, enabled)
        self._where = "the NPU" if portable(ctx) is None else "the current accelerator"

    # -- the walk -----------------------------------------------------------------------------------

    def visit_Decorator(self, node: cst.Decorator) -> None:
        self._parents[id(node.decorator)] = node

    def visit_Call(self, node: cst.Call) -> None:
        self._parents[id(node.func)] = node
        qualname = self.ctx.qualname(node.func)
        if qualname == "functools.partial" and node.args and node.args[0].keyword is None and node.args[0].star == "":
            self._partials[id(node.args[0].value)] = node
        if qualname in _DEVICE_TYPE_ARGS:
            position, name = _DEVICE_TYPE_ARGS[qualname]
            arg = argument(node, position if position >= 0 else 1 << 16, name)
            literal = device_literal(arg.value) if arg is not None else None
            device = self._device
            if literal is not None and literal is arg.value:
                if device is None:
                    self.report(AMP_DEVICE, literal, f"`{qualname}` on CUDA left as is: {_NO_PORTABLE_DEVICE}")
                else:
                    fix = rewrite_device_literal if portable(self.ctx) is None else (lambda updated: device)
                    self.report(AMP_DEVICE, literal, f"`{qualname}` now runs on {self._where}", fix=fix)
            elif arg is None and qualname in _DEFAULTS_TO_CUDA and all(a.star == "" for a in node.args):
                self.report(
                    AMP_DEVICE,
                    node,
                    f'`{qualname}()` without a device scales for "cuda", which is off on {self._where}: '
                    + ("left as is" if device is None else "its device added"),
                    fix=None
                    if device is None
                    else lambda updated: updated.with_changes(args=[cst.Arg(device), *updated.args]),
                )

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._skip.add(id(node.attr))
        if id(node) in self._skip:
            return
        qualname, binding = self.ctx.resolve(node)
        if qualname is None:
            return
        if is_under(qualname, PREFIX):
            self._skip_chain(node.value)
            self._uses.append(Use(node, qualname, binding, self._parents.get(id(node))))
        elif qualname in _RENAMED and binding.qualname != qualname:
            self._skip_chain(node.value)
            self._renamed(node, qualname, binding)

    def visit_Name(self, node: cst.Name) -> None:
        if id(node) in self._skip:
            return
        binding = self.ctx.imports.binding(node.value)
        if binding is not None and is_under(binding.qualname, PREFIX):
            self._uses.append(Use(node, binding.qualname, binding, self._parents.get(id(node))))

    def _renamed(self, node: cst.Attribute, qualname: str, binding: Binding) -> None:
        target = _RENAMED[qualname]
        if not self.ctx.api.has_npu(target.split(".")[2]):
            self.report(AMP_NOT_MIGRATED, node, f"`{qualname}`: torch_npu {self.ctx.api.version} has no `{target}`")
            return
        tail = target.split(".")[len(binding.qualname.split(".")) :]
        if not target.startswith(binding.qualname + "."):
            self.report(AMP_NOT_MIGRATED, node, f"`{qualname}`: use `{target}` on NPU")
            return
        self.report(GPU_DTYPE, node, f"`{qualname}` -> `{target}`", fix=lambda updated: with_tail(updated, tail))

    # -- deciding -----------------------------------------------------------------------------------

    def _plan(self, name: str | None) -> str:
        """How torch.cuda.amp.<name> migrates for the chosen version: "modern", "rename" or "missing"."""
        spec = _CUDA_AMP.get(name)
        if spec is not None and self._new_torch >= tuple(int(p) for p in spec["since_torch"].split(".")):
            return "modern"
        return "rename" if name in self.ctx.api.npu_amp else "missing"

    def _target(self, name: str, plan: str) -> str:
        return _CUDA_AMP[name]["target"] if plan == "modern" else f"torch.npu.amp.{name}"

    def _why_not(self, use: Use) -> str | None:
        """Why `use` cannot be rewritten (None if it can)."""
        name, plan = use.name, self._plan(use.name)
        if plan == "missing":
            if name is None:
                return f"`{use.qualname}` has no direct NPU counterpart"
            return f"torch_npu {self.ctx.api.version} has no `{name}` in torch.npu.amp"
        if plan == "rename":
            return None
        spec = _CUDA_AMP[name]
        if isinstance(use.parent, cst.Decorator) and spec["device"] == "keyword":
            return None
        if id(use.node) in self._partials and spec["device"] == "first":
            return self._why_not_partial(self._partials[id(use.node)], spec)
        if not isinstance(use.parent, cst.Call):
            return (
                f"`{use.qualname}` is used other than by calling it; use `{spec['target']}` with the NPU device by hand"
            )
        if spec.get("keywords") and any(a.star for a in use.parent.args):
            return 'its arguments are unpacked with `*`; pass the device "npu" to torch.amp by hand'
        return None

    def _why_not_partial(self, partial: cst.Call, spec: dict) -> str | None:
        """Why `partial(torch.cuda.amp.X, ...)` cannot become `partial(torch.amp.X, "npu", ...)` (None if it can).

        The device goes first, so positional arguments given later to what the partial returns would land one
        place off (`enabled` -> `dtype`): the partial must be bound to a name that is only ever called with
        keywords.
        """
        device = self._device or cst.parse_expression(ACCELERATOR_TYPE)
        wanted = self.ctx.code(_npu_partial(partial, cst.parse_expression(spec["target"]), spec, device))
        advice = f"write `{wanted}` and call it with keywords only"
        if any(a.star for a in partial.args):
            return f"the partial's arguments are unpacked with `*`; {advice}"
        name = _bound_name(self.ctx.module, partial)
        if name is None or not _called_with_keywords_only(self.ctx.module, name):
            return (
                "a partial of it is not bound to a local or private name called with keywords only in this file; "
                + advice
            )
        return None

    def _fix(self, use: Use, plan: str, new_func: cst.BaseExpression | None) -> None:
        """Report the rewrite of one use: the function becomes `new_func` (if given), the call gains the device."""
        name = use.name
        target = self._target(name, plan)
        if plan == "rename":
            if new_func is not None:
                self.report(CUDA_AMP, use.node, f"`{use.qualname}` -> `{target}`", fix=lambda updated: new_func)
            return
        spec = _CUDA_AMP[name]
        device = self._device
        if device is None:
            self.report(AMP_NOT_MIGRATED, use.node, f"`{use.qualname}` left as is: {_NO_PORTABLE_DEVICE}")
            return
        message = f"`{use.qualname}` -> `{target}` on {self._where}"
        if id(use.node) in self._partials:
            self.report(
                CUDA_AMP,
                self._partials[id(use.node)],
                message + " (in a partial)",
                fix=lambda updated: _npu_partial(updated, new_func, spec, device),
            )
            return
        if isinstance(use.parent, cst.Call):

            def fix(updated: cst.Call) -> cst.Call:
                func = updated.func if new_func is None else new_func
                return updated.with_changes(func=func, args=_with_device(list(updated.args), spec, device))
        else:

            def fix(updated: cst.Decorator) -> cst.Decorator:
                func = updated.decorator if new_func is None else new_func
                return updated.with_changes(decorator=cst.Call(func=func, args=_with_device([], spec, device)))

        self.report(CUDA_AMP, use.parent, message, fix=fix)

    def finish(self) -> None:
        by_binding: dict[int, list[Use]] = {}
        for use in self._uses:
            by_binding.setdefault(id(use.binding), []).append(use)
        for uses in by_binding.values():
            binding = uses[0].binding
            if is_under(binding.qualname, PREFIX):
                continue  # decided with the imports below
            for use in uses:
                why = self._why_not(use)
                target = self._target(use.name, self._plan(use.name)) if why is None else ""
                if why is None and not target.startswith(binding.qualname + "."):
                    why = f"`{binding.local}` cannot reach `{target}`; write `{target}` with the NPU device by hand"
                if why is not None:
                    self.report(AMP_NOT_MIGRATED, use.node, f"`{use.qualname}` not migrated: {why}")
                    continue
                tail = target.split(".")[len(binding.qualname.split(".")) :]
                self._fix(use, self._plan(use.name), with_tail(use.node, tail))
        self._imports(by_binding)

    def _imports(self, by_binding: dict[int, list[Use]]) -> None:
        """Imports of torch.cuda.amp (or names from it) are rewritten with every use, or not at all."""
        # Per import line: statement index -> alias index -> new target. One fix per line covers them all.
        lines: dict[int, tuple[cst.SimpleStatementLine, dict[int, dict[int, str]]]] = {}
        for binding in self.ctx.imports.bindings.values():
            if not is_under(binding.qualname, PREFIX):
                continue
            uses = by_binding.get(id(binding), [])
            names = {use.name for use in uses} if binding.qualname == PREFIX else {binding.qualname.split(".")[3]}
            plans = {self._plan(name) for name in names}
            why = [w for w in (self._why_not(use) for use in uses) if w]
            if len(binding.qualname.split(".")) > 4 or "missing" in plans:
                why.append(f"torch_npu {self.ctx.api.version} has no counterpart")
            if len(plans) > 1:
                why.append("its names migrate to different modules (torch.amp and torch.npu.amp)")
            if self._shares_statement(binding):
                why.append("the same import statement names other torch.cuda APIs; split it first")
            if why:
                for use in uses:
                    self.report(AMP_NOT_MIGRATED, use.node, f"`{use.qualname}` not migrated: " + "; ".join(why))
                self.report(
                    AMP_NOT_MIGRATED,
                    binding.line,
                    f"import of `{binding.local}` left as is: " + "; ".join(dict.fromkeys(why)),
                )
                continue
            if CUDA_AMP.id not in self.enabled:
                continue
            plan = plans.pop() if plans else "modern"
            module_target = "torch.amp" if plan == "modern" else "torch.npu.amp"
            if binding.qualname == PREFIX:
                target = module_target
            else:
                target = self._target(binding.qualname.split(".")[3], plan)
            for use in uses:
                self._fix(use, plan, None)
            statements = lines.setdefault(id(binding.line), (binding.line, {}))[1]
            statements.setdefault(binding.line.body.index(binding.stmt), {})[binding.index] = target
        for line, statements in lines.values():
            self.report(
                CUDA_AMP,
                line,
                "import from torch.cuda.amp rewritten",
                fix=lambda updated, s=statements: _rebind_statements(updated, s),
            )

    def _shares_statement(self, binding: Binding) -> bool:
        """Whether the import statement also binds torch.cuda names another rule family rewrites."""
        for other in self.ctx.imports.bindings.values():
            if (
                other.stmt is binding.stmt
                and is_under(other.qualname, "torch.cuda")
                and not is_under(other.qualname, PREFIX)
            ):
                return True
        return False
