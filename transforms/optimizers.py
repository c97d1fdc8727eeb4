"""Training speed, the optimizer step: torch_npu's fused optimizers (`torch_npu.optim.NpuFused*`).

Ascend's hand ports of training code swap `torch.optim.AdamW` for `torch_npu.optim.NpuFusedAdamW` (and
SGD, Adam, Adadelta, RMSprop likewise): the fused class applies the same update to every parameter of a
dtype at once, over one combined tensor, instead of a few kernel launches per parameter. The class is
picked when the optimizer is built, by the parameters' device and dtype (`_npu_fused_optimizer`, written
once into the file, or imported from the `_npu_fused.py` that the file's fused-op helpers go to: its
package's or its script folder's, `FileContext.helper_module`), so the migrated program builds the original class on a CPU or GPU host and never
builds two optimizers. Facts from the torch_npu wheels on PyPI, read without importing them:

* the fused classes and their signatures: `torch_npu/optim/npu_fused_*.py` (2.1.0.post8, 2.5.1, 2.8.0,
  2.13.0, 2.14.0; the same in all five);
* parameters must be float32 or float16 (`npu_fused_optim_base.py:56-78`, TypeError otherwise), and
  `zero_grad(set_to_none=True)` raises ValueError (`npu_fused_optim_base.py:136-139`);
* the combined tensors are made at the first `step()`: each parameter and gradient becomes a view of them
  (`npu_combine_tensors`), so a parameter or gradient re-allocated afterwards is no longer updated;
* `torch.optim.AdamW(fused=True)` already runs torch_npu's `_fused_adamw_` kernel on an NPU (registered in
  `csrc/aten/npu_native_functions_by_codegen.yaml` of every sampled version: 2.1.0.post8 line 959, 2.5.1
  line 1046, 2.14.0 line 1470); `_fused_adam_` and `_fused_sgd_` appear only in 2.13.0 and 2.14.0 of the
  sampled versions, so `Adam(fused=True)` / `SGD(fused=True)` fail on an older torch_npu (NPU412).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from npu_migrate.engine.astindex import name_sets, words_may_name
from npu_migrate.engine.checkers import Checker
from npu_migrate.engine.layout import line_width
from npu_migrate.engine.rule import Example, FixSafety, Rule
from npu_migrate.engine.templating import render
from npu_migrate.findings import Severity
from npu_migrate.program.api import _version_key
from npu_migrate.transforms.common.arguments import keyword

HELPER = "_npu_fused_optimizer"
HELPER_TEMPLATE = "training/fused_optimizer.py.j2"
#: Written once after the imports of a file whose optimizer NPU411 rewrites, or into its helper module.
HELPER_CODE = render(HELPER_TEMPLATE)

FUSED_OPTIMIZER = Rule(
    id="NPU411",
    name="npu-fused-optimizer",
    family="optimizers",
    summary="`torch.optim.SGD/Adam/AdamW/Adadelta/RMSprop` build torch_npu's `NpuFused*` twin on an NPU (opt-in)",
    what="""
    Rewrites `torch.optim.X(params, ...)` (X one of SGD, Adam, AdamW, Adadelta, RMSprop, however imported)
    to `_npu_fused_optimizer(torch.optim.X, params, ...)`, a helper written once after the file's imports,
    or imported from the `_npu_fused.py` module its package's (or script folder's) fused-op helpers go to.
    It builds `torch_npu.optim.NpuFusedX` when every parameter is a float32 or float16 tensor on an NPU and
    no option is a tensor, and `torch.optim.X` otherwise (a CPU or GPU host, bf16 parameters, named
    parameters): the class is chosen when the optimizer is built, and only one is built. Positional
    options become keywords (the fused classes take them in the same order, but by name is plainer).
    The fused classes have the original's defaults for every option they take (torch_npu
    `optim/npu_fused_*.py`), except `NpuFusedSGD`, which has no default learning rate: an SGD without
    `lr` is declined. Options the fused class lacks (`foreach`, `fused`, `maximize`, `capturable`,
    `differentiable`, `decoupled_weight_decay`) are dropped when they say the default, and the call is
    declined otherwise. Declined too, with the reason: the file re-allocates the parameters after the
    optimizer exists (`.cpu()`, `.half()`, `.to(...)` of the model after it is built or in another
    function, an assignment to `.data` or `.grad` or of a new `nn.Parameter`; in `__init__`,
    `reset_parameters` or `_init_weights` they build the model and are fine), a `zero_grad` that sets
    gradients to None (`model.zero_grad()`, `set_to_none=True`: the fused step would keep reading the old gradients), or
    a framework owns the optimizer (DeepSpeed, Lightning, accelerate, FSDP, the transformers Trainer:
    each has its own switch, see the finding). `torch.optim.AdamW(fused=True)` is left as it is: torch
    dispatches it to torch_npu's `_fused_adamw_` kernel on an NPU already. Not selected by `ALL`: select
    it by id (`--select ALL,NPU411`).
    """,
    why="""
    torch.optim launches several small kernels per parameter and step; on an NPU each launch has a fixed
    cost, so a model of many small tensors is bound by launches. The fused class updates one combined
    tensor per dtype. Measured by its author in huggingface/transformers PR #26194 (Trainer option
    `adamw_torch_npu_fused`): BERT-base on SST-2, Ascend 910B, 96.6 -> 149.9 train samples/s (+55%).
    Not measured by npu-migrate (no NPU). The update is the original's formula (checked on the CPU
    against torch.optim, tests/test_training_levers_runs.py), but spelled with other elementwise
    operations (`mul_` and `add_` where torch.optim's AdamW uses `lerp_`), so the last bits can differ:
    this is why the rule is opt-in.
    """,
    example=Example(
        before="""
            import torch

            model = torch.nn.Linear(4, 2).npu()
            opt = torch.optim.AdamW(model.parameters(), 1e-3)
        """,
        after="import torch\n\n\n"
        + HELPER_CODE
        + """

model = torch.nn.Linear(4, 2).npu()
opt = _npu_fused_optimizer(torch.optim.AdamW, model.parameters(), lr=1e-3)
""",
    ),
    valid=(
        """
        import torch

        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.Adagrad(model.parameters())
        """,
    ),
    fix_safety=FixSafety.NEEDS_REVIEW,
    review="""
    Ascend's API reference states the constraint (Ascend Extension for PyTorch 7.0.0,
    `torch_npu.optim.NpuFusedAdam`: no `.cpu()` of the model, no parameter pointed at a new tensor or
    None; in-place updates and reads are fine). The fused classes keep a parameter's gradient inside a combined tensor from the first step on: code
    the rule cannot see that re-allocates a parameter or sets its gradient to None after that (a library
    that calls `model.zero_grad()`, a parameter frozen at the first step and unfrozen later, a `.to()` in
    a function of another file) leaves those parameters un-updated, silently. Their `zero_grad()` zeroes
    the gradients instead of setting them to None, and their state's `step` is an int, not a tensor
    (torch.optim converts it when it loads such a checkpoint).
    """,
    severity=Severity.INFO,
    tags=frozenset({"lever", "opt-in"}),
    needs_torch_npu=False,
)

NATIVE_FUSED = Rule(
    id="NPU412",
    name="native-fused-optimizer",
    family="optimizers",
    summary="`torch.optim.Adam/SGD(fused=True)` fail on a torch_npu without their fused kernel",
    what="""
    Reports `torch.optim.Adam(..., fused=True)` and `torch.optim.SGD(..., fused=True)`: a warning when the
    target torch_npu is older than 2.13.0, a note otherwise (the code then needs 2.13.0 or newer). torch sends them to the device's `_fused_adam_` / `_fused_sgd_`
    kernel, which torch_npu registers in 2.13.0 and 2.14.0 and in none of the older sampled versions
    (2.1.0.post8, 2.5.1, 2.8.0: `csrc/aten/npu_native_functions_by_codegen.yaml`). `AdamW(fused=True)`
    is not reported: `_fused_adamw_` is registered in every sampled version.
    """,
    why="""
    On such a host the first `optimizer.step()` fails with NotImplementedError. Dropping `fused=True`
    computes the same update with the foreach kernels; NPU411 builds torch_npu's `NpuFusedAdam` /
    `NpuFusedSGD` instead.
    """,
    example=Example(
        before="""
            import torch

            model = torch.nn.Linear(4, 2)
            optimizer = torch.optim.Adam(model.parameters(), fused=True)
        """,
        reports="`_fused_adam_` kernel",
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    severity=Severity.WARNING,
    tags=frozenset({"lever"}),
)


@dataclass(frozen=True)
class Optimizer:
    #: The options torch.optim.X takes by position after `params`, in order.
    positional: tuple[str, ...]
    #: The options `torch_npu.optim.NpuFusedX` takes (by keyword).
    fused: frozenset[str]


_ADAM = Optimizer(
    ("lr", "betas", "eps", "weight_decay", "amsgrad"), frozenset({"lr", "betas", "eps", "weight_decay", "amsgrad"})
)
OPTIMIZERS = {
    "SGD": Optimizer(
        ("lr", "momentum", "dampening", "weight_decay", "nesterov"),
        frozenset({"lr", "momentum", "dampening", "weight_decay", "nesterov"}),
    ),
    "Adam": _ADAM,
    "AdamW": _ADAM,
    "Adadelta": Optimizer(
        ("lr", "rho", "eps", "weight_decay", "foreach"), frozenset({"lr", "rho", "eps", "weight_decay"})
    ),
    "RMSprop": Optimizer(
        ("lr", "alpha", "eps", "weight_decay", "momentum", "centered", "capturable", "foreach", "maximize"),
        frozenset({"lr", "alpha", "eps", "weight_decay", "momentum", "centered"}),
    ),
}
#: Options the fused classes lack -> the spellings of torch.optim's default, which can be dropped.
DEFAULTS = {
    "foreach": {"None", "False"},
    "fused": {"None", "False"},
    "maximize": {"False"},
    "capturable": {"False"},
    "differentiable": {"False"},
    "decoupled_weight_decay": {"False"},
}
#: torch.optim's native fused kernel -> the first sampled torch_npu that registers it.
NATIVE_KERNEL_SINCE = {"Adam": ("_fused_adam_", "2.13.0"), "SGD": ("_fused_sgd_", "2.13.0")}
#: Methods that re-allocate a module's parameters (Module._apply replaces `param.data`).
REALLOCATING = frozenset({"cpu", "cuda", "npu", "to", "half", "float", "double", "bfloat16", "type", "to_empty"})
#: Methods that build a model's parameters, before any optimizer holds them: assignments there are fine.
_BUILDERS = frozenset({"__init__", "reset_parameters", "_init_weights", "init_weights", "_reset_parameters"})
#: Imports that mean a framework builds, wraps or steps the optimizer.
FRAMEWORKS = {
    "deepspeed": "DeepSpeed builds its own optimizer from its config (it has NPU fused Adam in its op builder)",
    "lightning": "Lightning steps the optimizer itself",
    "pytorch_lightning": "Lightning steps the optimizer itself",
    "accelerate": "accelerate wraps the optimizer (`Accelerator.prepare`)",
    "torch.distributed.fsdp": "FSDP flattens and re-allocates the parameters",
    "torch.distributed._composable.fsdp": "FSDP flattens and re-allocates the parameters",
    "transformers.Trainer": 'the transformers Trainer builds it: pass `optim="adamw_torch_npu_fused"`',
}
_QUALNAMES = tuple(f"torch.optim.{name}" for name in OPTIMIZERS)


def optimizer_name(qualname: str | None) -> str | None:
    """`torch.optim.AdamW` or `torch.optim.adamw.AdamW` -> "AdamW"; None for anything else."""
    if not qualname or not qualname.startswith("torch.optim."):
        return None
    name = qualname.rsplit(".", 1)[1]
    return name if name in OPTIMIZERS and qualname.count(".") <= 3 else None


@dataclass
class Site:
    call: cst.Call
    name: str
    order: int
    function: cst.CSTNode | None
    statement: cst.SimpleStatementLine | None
    depth: int
    target: str | None  # the code of what the optimizer is assigned to


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


class OptimizerChecker(Checker):
    rules = (FUSED_OPTIMIZER, NATIVE_FUSED)
    markers = ("optim",)

    @classmethod
    def wants_words(cls, words) -> bool:
        return words_may_name(words, name_sets(_QUALNAMES))

    @classmethod
    def wants(cls, index) -> bool:
        return index.may_name(name_sets(_QUALNAMES))

    def __init__(self, ctx, enabled) -> None:
        super().__init__(ctx, enabled)
        self._order = 0
        self._functions: list[cst.CSTNode] = []
        self._statements: list[cst.SimpleStatementLine] = []
        self._depth = 0
        self._sites: list[Site] = []
        self._frameworks: list[str] = []
        # (receiver code, method, order, function) of each call of a method in REALLOCATING
        self._moves: list[tuple[str, str, int, cst.CSTNode | None]] = []
        self._zero_grads: list[tuple[str, cst.Call]] = []
        self._assigned: list[str] = []  # `.data = ` / `.grad = ` targets
        self._module_receivers: set[str] = set()  # X of each X.parameters() / X.named_parameters()
        self._helper_defined = False

    # -- the walk ---------------------------------------------------------------------------------

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._functions.append(node)
        if node.name.value == HELPER and not self._functions[:-1]:
            self._helper_defined = True

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._functions.pop()

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._depth += 1

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock) -> None:
        self._depth -= 1

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self._statements.append(node)

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine) -> None:
        self._statements.pop()

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            self._framework(_code(alias.name))

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if not self._functions and not self._depth and not isinstance(node.names, cst.ImportStar):
            if any(_code(alias.name) == HELPER and alias.asname is None for alias in node.names):
                self._helper_defined = True  # from the helper module, by an earlier run
        if node.module is None or node.relative:
            return
        module = _code(node.module)
        self._framework(module)
        if module == "transformers" and not isinstance(node.names, cst.ImportStar):
            if any(_code(alias.name) == "Trainer" for alias in node.names):
                self._framework("transformers.Trainer")

    def _framework(self, module: str) -> None:
        for name in FRAMEWORKS:
            if module == name or module.startswith(name + "."):
                self._frameworks.append(name)

    def visit_Assign(self, node: cst.Assign) -> None:
        function = self._function()
        if function is not None and getattr(function, "name", None) is not None:
            if function.name.value in _BUILDERS:
                return  # the model is being built: its optimizer does not exist yet
        new_parameter = (
            self.ctx.qualname(node.value.func) == "torch.nn.Parameter" if isinstance(node.value, cst.Call) else False
        )
        for target in node.targets:
            if not isinstance(target.target, cst.Attribute):
                continue
            if target.target.attr.value in ("data", "grad") or new_parameter:
                self._assigned.append(_code(target.target))

    def visit_Call(self, node: cst.Call) -> None:
        self._order += 1
        func = node.func
        if isinstance(func, cst.Attribute):
            receiver = _code(func.value)
            method = func.attr.value
            if method in REALLOCATING:
                self._moves.append((receiver, method, self._order, self._function()))
            elif method == "zero_grad":
                self._zero_grads.append((receiver, node))
            elif method in ("parameters", "named_parameters"):
                self._module_receivers.add(receiver)
        name = optimizer_name(self.ctx.qualname(func))
        if name is None:
            return
        statement = self._statements[-1] if self._statements else None
        target = None
        if statement is not None and len(statement.body) == 1:
            small = statement.body[0]
            if isinstance(small, cst.Assign) and small.value is node and len(small.targets) == 1:
                target = _code(small.targets[0].target)
            elif isinstance(small, cst.AnnAssign) and small.value is node:
                target = _code(small.target)
        self._sites.append(Site(node, name, self._order, self._function(), statement, self._depth, target))

    def _function(self) -> cst.CSTNode | None:
        return self._functions[-1] if self._functions else None

    # -- the decisions ----------------------------------------------------------------------------

    def finish(self) -> None:
        for site in self._sites:
            self._native_fused(site)
            reason = self._declined(site)
            if reason:
                self.report(FUSED_OPTIMIZER, site.call, f"`torch.optim.{site.name}` kept: {reason}")
                continue
            message = (
                f"`torch.optim.{site.name}` builds torch_npu's `NpuFused{site.name}` when its parameters are "
                "float32 / float16 on an NPU (the original class elsewhere)"
            )
            self.report(FUSED_OPTIMIZER, self._fix_node(site), message, fix=self._fix(site))

    def finalize(self) -> None:
        if self._helper_defined or FUSED_OPTIMIZER.id not in self.enabled:
            return
        if any(r.rule is FUSED_OPTIMIZER and r.applied for r in self.ctx.reports):
            # Where the fused-op helpers go to a helper module, this one does too (the driver writes it there,
            # `output.helper_module`); the fused rules add their names to the same import line.
            module = self.ctx.helper_module
            self.ctx.edits.append((self.ctx.module, _add_helper if module is None else _helper_import(module)))

    def _native_fused(self, site: Site) -> None:
        since = NATIVE_KERNEL_SINCE.get(site.name)
        fused = keyword(site.call, "fused")
        if since is None or fused is None or _code(fused.value).strip() != "True":
            return
        kernel, version = since
        target = self.ctx.api.version
        if _version_key(target) >= _version_key(version):
            self.report(
                NATIVE_FUSED,
                fused,
                f"`torch.optim.{site.name}(fused=True)` runs torch_npu's `{kernel}` kernel on an NPU with torch_npu "
                f"{target}; a torch_npu older than {version} (the first sampled one with it) fails here",
                severity=Severity.INFO,
            )
            return
        self.report(
            NATIVE_FUSED,
            fused,
            f"`torch.optim.{site.name}(fused=True)` fails on an NPU with torch_npu {target}: it registers no "
            f"`{kernel}` kernel (the first sampled torch_npu with it is {version}); drop `fused=True` (the foreach "
            f"path computes the same update) or select NPU411 for torch_npu's `NpuFused{site.name}`",
            severity=Severity.WARNING,
            crashes=True,
        )

    def _declined(self, site: Site) -> str:
        """Why the site cannot be rewritten ("" when it can)."""
        call = site.call
        spec = OPTIMIZERS[site.name]
        if any(arg.star for arg in call.args):
            return "`*args` / `**kwargs`: which options it passes is unknown"
        positional = [arg for arg in call.args if arg.keyword is None]
        keywords = {arg.keyword.value: arg for arg in call.args if arg.keyword is not None}
        if not positional and "params" not in keywords:
            return "no parameters given"
        if len(positional) - 1 > len(spec.positional):
            return "more positional arguments than the optimizer takes"
        given = set(keywords) | set(spec.positional[: max(len(positional) - 1, 0)])
        fused = keywords.get("fused")
        if site.name == "AdamW" and fused is not None and _code(fused.value).strip() == "True":
            return "`fused=True` already runs torch_npu's `_fused_adamw_` kernel on an NPU"
        for option in sorted(given - spec.fused - {"params"}):
            arg = keywords.get(option)
            value = _code(arg.value).strip() if arg is not None else None
            if value is None or value not in DEFAULTS.get(option, ()):
                return f"`{option}` has no counterpart in torch_npu's `NpuFused{site.name}`"
        if site.name == "SGD" and "lr" not in given:
            return "torch_npu's `NpuFusedSGD` has no default learning rate: pass `lr`"
        for module, why in FRAMEWORKS.items():
            if module in self._frameworks:
                return f"a framework owns the optimizer ({why})"
        if site.function is not None and getattr(site.function, "name", None) is not None:
            if site.function.name.value == "configure_optimizers":
                return "a framework owns the optimizer (Lightning's `configure_optimizers`)"
        if self._assigned:
            return (
                f"`{self._assigned[0]} = ...` re-allocates a parameter or gradient, which the fused class keeps "
                "in a combined tensor from its first step"
            )
        for receiver, zero_grad in self._zero_grads:
            reason = self._clears_grads(receiver, zero_grad, site)
            if reason:
                return reason
        roots = _roots(call) or self._module_receivers
        if not roots:
            return "which module's parameters it updates is unknown, so whether they stay in place is too"
        for receiver, method, order, function in self._moves:
            if receiver not in roots:
                continue
            if function is not site.function or order > site.order or method == "cpu":
                return (
                    f"`{receiver}.{method}()` re-allocates the parameters the optimizer holds (the fused class keeps "
                    "them in a combined tensor)"
                )
        return ""

    def _clears_grads(self, receiver: str, call: cst.Call, site: Site) -> str:
        arg = keyword(call, "set_to_none")
        if arg is None and call.args and call.args[0].keyword is None:
            arg = call.args[0]
        value = _code(arg.value).strip() if arg is not None else None
        if value == "False":
            return ""
        if value is not None:
            if value == "True":
                return f"`{receiver}.zero_grad(set_to_none=True)` raises ValueError with the fused class"
            return f"`{receiver}.zero_grad(set_to_none={value})` may set the gradients to None"
        last = receiver.rsplit(".", 1)[-1].lower()
        if receiver == site.target or "optim" in last or last.startswith("opt"):
            return ""  # the optimizer's own: the fused class zeroes in place by default
        return (
            f"`{receiver}.zero_grad()` sets the gradients to None, and the fused step would keep reading the "
            "old ones: pass `set_to_none=False`"
        )

    # -- the rewrite ------------------------------------------------------------------------------

    def _fix_node(self, site: Site) -> cst.CSTNode:
        # The whole statement where the call is its value, so it can be laid out within the line width.
        return site.statement if self._whole_statement(site) else site.call

    def _whole_statement(self, site: Site) -> bool:
        statement = site.statement
        if statement is None or len(statement.body) != 1:
            return False
        small = statement.body[0]
        return isinstance(small, (cst.Assign, cst.AnnAssign, cst.Return, cst.Expr)) and small.value is site.call

    def _fix(self, site: Site):
        spec = OPTIMIZERS[site.name]
        if not self._whole_statement(site):
            return lambda updated: _rewritten(updated, spec)
        unit = self.ctx.module.default_indent
        width = line_width(self.ctx.text) - len(unit) * site.depth

        def fix(updated: cst.SimpleStatementLine) -> cst.CSTNode:
            small = updated.body[0]
            call = _rewritten(small.value, spec)
            new = updated.with_changes(body=[small.with_changes(value=call)])
            code = _code(new.with_changes(leading_lines=[]))
            spread = "\n" in _code(small.value) or max(len(line) for line in code.splitlines()) > width
            if spread and "#" not in _code(call):  # comments live in the whitespace this replaces
                new = new.with_changes(body=[small.with_changes(value=_one_per_line(call, unit))])
            return new

        return fix


def _roots(call: cst.Call) -> set[str]:
    """The X of each `X.parameters()` / `X.named_parameters()` inside the call's first argument."""
    if not call.args:
        return set()
    found = set()

    class Finder(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            func = node.func
            if isinstance(func, cst.Attribute) and func.attr.value in ("parameters", "named_parameters"):
                found.add(_code(func.value))

    call.args[0].value.visit(Finder())
    return found


def _rewritten(call: cst.Call, spec: Optimizer) -> cst.Call:
    """`torch.optim.X(params, a, b=c)` -> `_npu_fused_optimizer(torch.optim.X, params, lr=a, b=c)`."""
    params = None
    options: list[cst.Arg] = []
    position = 0
    for arg in call.args:
        if arg.keyword is None and params is None:
            params = arg
        elif arg.keyword is None:
            options.append(arg.with_changes(keyword=cst.Name(spec.positional[position]), equal=_EQUAL))
            position += 1
        elif arg.keyword.value == "params":
            params = arg.with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT)
        elif arg.keyword.value in DEFAULTS:
            continue  # the default of an option the fused class lacks (checked in `_declined`)
        else:
            options.append(arg)
    assert params is not None
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    first = cst.Arg(value=call.func, comma=comma)
    args = [first, params, *options]
    fixed = []
    for index, arg in enumerate(args):
        last = index == len(args) - 1
        if last:
            fixed.append(arg.with_changes(comma=cst.MaybeSentinel.DEFAULT))
        elif arg.comma is cst.MaybeSentinel.DEFAULT:
            fixed.append(arg.with_changes(comma=comma))
        else:
            fixed.append(arg)
    return call.with_changes(func=cst.Name(HELPER), args=fixed)


def _one_per_line(call: cst.Call, unit: str) -> cst.Call:
    """`call` with one argument a line, indented one level, and a trailing comma (black's layout)."""

    def newline(indent: str) -> cst.ParenthesizedWhitespace:
        return cst.ParenthesizedWhitespace(indent=True, last_line=cst.SimpleWhitespace(indent))

    args = [
        arg.with_changes(comma=cst.Comma(whitespace_after=newline(unit)), whitespace_after_arg=cst.SimpleWhitespace(""))
        for arg in call.args
    ]
    args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=newline("")))
    return call.with_changes(whitespace_before_args=newline(unit), args=args)


_EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


def _add_helper(module: cst.Module) -> cst.Module:
    """The module with `_npu_fused_optimizer` after its top-level imports (once)."""
    body = list(module.body)
    if any(isinstance(stmt, cst.FunctionDef) and stmt.name.value == HELPER for stmt in body):
        return module
    return _after_imports(module, cst.parse_statement(HELPER_CODE), blank_lines=2)


def _helper_import(helper_module: str):
    """An edit: the module with `from <helper_module> import _npu_fused_optimizer` after its imports."""

    def add(module: cst.Module) -> cst.Module:
        return _after_imports(module, cst.parse_statement(f"from {helper_module} import {HELPER}\n"), blank_lines=0)

    return add


def _after_imports(module: cst.Module, statement: cst.BaseStatement, blank_lines: int) -> cst.Module:
    """`module` with `statement` after its docstring and top-level imports, `blank_lines` around it."""
    body = list(module.body)
    index = 1 if body and _is_docstring(body[0]) else 0
    while index < len(body) and _is_import(body[index]):
        index += 1
    if not blank_lines:
        body.insert(index, statement)
        return module.with_changes(body=body)
    blank = cst.EmptyLine()
    helper = statement.with_changes(leading_lines=[blank] * blank_lines)
    if index < len(body):
        following = body[index]
        lines = list(following.leading_lines)
        while lines and lines[0].comment is None:
            lines.pop(0)
        body[index] = following.with_changes(leading_lines=[blank, blank, *lines])
    body.insert(index, helper)
    return module.with_changes(body=body)


def _is_import(stmt: cst.CSTNode) -> bool:
    if isinstance(stmt, cst.SimpleStatementLine):
        return all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body)
    if isinstance(stmt, cst.Try):  # try: import x / except ImportError
        return all(_is_import(s) for s in stmt.body.body)
    return False


def _is_docstring(stmt: cst.CSTNode) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )
