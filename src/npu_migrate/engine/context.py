"""Per-file state shared by the rules of one run: name resolution, reported findings, pending fixes.

Fixes come in two kinds. A plain fix rewrites the node it was reported on. A fix that `requires` an
import binding (code that reaches `torch.cuda` through `from torch import cuda`) is only valid if that
import is rewritten too, and the import may only be rewritten if *every* use through it can be: one
unmappable use vetoes the binding, and all fixes that required it fall back to findings.

A fix that flips a `guard` (a test of whether CUDA is there) stands only if the code the test guards can
run on an NPU once it does: `npu_migrate.program.guards` decides, after the import decisions, from the reports
that leave code which `crashes` there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst

from npu_migrate.engine.fixes import Fix
from npu_migrate.engine.rule import Rule
from npu_migrate.engine.sites import Report
from npu_migrate.findings import Severity
from npu_migrate.program import guards as coherence
from npu_migrate.program.imports import Binding, ImportTable, rebind_import

if TYPE_CHECKING:
    from pathlib import Path

    from npu_migrate.program.api import NpuApi


class CstReport(Report):
    """A libcst checker's report: the site is a node of the module; `fix` rewrites it. A fix that
    `requires` an import binding stands only if that import can be rewritten (`FileContext.resolve_plans`)."""

    node: cst.CSTNode
    fix: Fix | None
    requires: Binding | None
    #: The fix turns a test of CUDA into a test of the NPU (`torch.cuda.is_available()`, `x.is_cuda`,
    #: `device.type == "cuda"`): on an NPU host the code it guards starts (or stops) running.
    guard: bool
    #: Left as it is (no fix, or a fix that does not stand), the code at `node` fails on an NPU host.
    crashes: bool

    def __init__(
        self,
        rule: Rule,
        node: cst.CSTNode,
        message: str,
        severity: Severity | None = None,
        fix: Fix | None = None,
        *,
        requires: Binding | None = None,
        applied: bool = False,
        data: Mapping[str, str | int] | None = None,
        guard: bool = False,
        crashes: bool = False,
    ) -> None:
        super().__init__(rule, message, severity, fix, applied=applied, data=data)
        self.node = node
        self.requires = requires
        self.guard = guard
        self.crashes = crashes


@dataclass(eq=False)
class BindingPlan:
    binding: Binding
    target: str  # the qualified name the import should bind instead
    rule: Rule
    vetoes: list[str] = field(default_factory=list)
    #: The import binds a test of whether CUDA is there (`is_available`): its uses are guards (`coherence`).
    guard: bool = False


class FileContext:
    def __init__(
        self,
        module: cst.Module,
        path: str,
        api: NpuApi,
        text: str = "",
        *,
        file: Path | None = None,
        helper_module: str | None = None,
    ) -> None:
        self.module = module
        #: The display name (relative to the run's root, not to the current folder): for messages only.
        self.path = path
        #: Where the file lies on disk (None: not known, as for stdin without --stdin-filename): what a rule
        #: reads to learn about its place (its package), never `path`, which the current folder would resolve.
        self.file = file
        #: The helper module the file imports generated helpers from (`packages.usable_module`: `.._npu_fused`,
        #: or `_npu_fused` beside a script folder's files); None: they are written into the file.
        self.helper_module = helper_module
        self.api = api
        #: The source `module` was parsed from ("" when unknown): cheap substring tests before a walk.
        self.text = text
        self.imports = ImportTable.of(module)
        self.reports: list[CstReport] = []
        self._plans: dict[int, BindingPlan] = {}
        self._vetoes: dict[int, list[str]] = {}
        self._reported: set[tuple[str, int]] = set()
        self._claimed: set[int] = set()
        #: CUDA branches of code that already supports the NPU: rewrites inside them are dropped (`coherence`).
        self.kept_cuda: list[cst.CSTNode] = []
        #: Engine edits that are not findings of their own (inline TODO comments).
        self.edits: list[tuple[cst.CSTNode, Fix]] = []

    # -- used by rules ------------------------------------------------------------------------------

    def resolve(self, expr: cst.BaseExpression) -> tuple[str | None, Binding | None]:
        return self.imports.resolve(expr)

    def qualname(self, expr: cst.BaseExpression) -> str | None:
        return self.imports.resolve(expr)[0]

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def claim(self, node: cst.CSTNode) -> None:
        """Mark a node as handled, so that a rule visiting it later (an inner part of a chain) skips it."""
        self._claimed.add(id(node))

    def claimed(self, node: cst.CSTNode) -> bool:
        return id(node) in self._claimed

    def report(
        self,
        rule: Rule,
        node: cst.CSTNode,
        message: str,
        *,
        fix: Fix | None = None,
        severity: Severity | None = None,
        requires: Binding | None = None,
        data: Mapping[str, str | int] | None = None,
        guard: bool = False,
        crashes: bool = False,
    ) -> None:
        key = (rule.id, id(node))
        if key in self._reported:  # two contexts matched the same literal: one finding
            return
        self._reported.add(key)
        self.reports.append(
            CstReport(
                rule,
                node,
                message,
                severity,
                fix,
                requires=requires,
                applied=fix is not None and requires is None,
                data=data,
                guard=guard,
                crashes=crashes,
            )
        )

    def rebind(self, rule: Rule, binding: Binding, target: str, *, guard: bool = False) -> None:
        """Ask for import `binding` to bind `target` instead (unless some use vetoes it); `guard`: the
        name it binds is a test of whether CUDA is there."""
        plan = self._plans.get(id(binding))
        if plan is None:
            self._plans[id(binding)] = BindingPlan(binding, target, rule, guard=guard)
        elif plan.target != target:
            plan.vetoes.append(f"its uses need both {plan.target} and {target}")

    def veto(self, binding: Binding, reason: str) -> None:
        """Forbid rewriting import `binding`: some use through it has no NPU equivalent."""
        self._vetoes.setdefault(id(binding), []).append(reason)

    def keep_cuda(self, branch: cst.CSTNode) -> None:
        """Leave `branch` as it is: it is the CUDA side of code that already has an NPU side."""
        self.kept_cuda.append(branch)

    # -- used by the engine -------------------------------------------------------------------------

    def located_nodes(self) -> list[cst.CSTNode]:
        """Every node a finding can end up reported at: the module, what was reported, and the import
        lines rewrites were asked for (`resolve_plans` reports at those)."""
        return [self.module, *(r.node for r in self.reports), *(p.binding.line for p in self._plans.values())]

    @property
    def pending(self) -> bool:
        """Whether anything was reported or any import rewrite was asked for."""
        return bool(self.reports or self._plans)

    def suppress(self, covers: Callable[[cst.CSTNode, str], bool]) -> None:
        """Drop what `# npu-migrate: ignore` comments cover; an import on a suppressed line stays as is,
        and so do the uses that depend on it."""
        kept = []
        for report in self.reports:
            if covers(report.node, report.rule.id):
                if report.requires is not None:
                    self.veto(report.requires, "a use of it is suppressed by a comment")
            else:
                kept.append(report)
        self.reports = kept
        for plan in self._plans.values():
            if covers(plan.binding.line, plan.rule.id):
                self.veto(plan.binding, "its import is suppressed by a comment")

    def resolve_plans(self, line_of: Callable[[cst.CSTNode], int] | None = None) -> None:
        """Decide which fixes stand, once every rule has seen the whole file: first the import rewrites,
        then the guard flips (`coherence`), whose vetoes of imports are decided again. `line_of` gives
        the line of any node of the module, for messages that name the line that blocks a rewrite."""
        accepted = self._decide()
        while coherence.check(self, line_of or (lambda node: 0)):
            accepted = self._decide()  # a vetoed guard reached through an import: other uses may fall back
        coherence.note_module_flags(self)
        for key, reasons in self._vetoes.items():
            if key in self._plans:
                self._plans[key].vetoes.extend(reasons)
        for report in self.reports:
            if report.requires is not None and not report.applied:
                vetoes = self._vetoes.get(id(report.requires)) or ["its import could not be rewritten"]
                why = "; ".join(vetoes)
                report.message += f" (not rewritten: `{report.requires.local}` is also used where {why})"
                report.severity = Severity.WARNING
        # One import edit per statement, covering every accepted alias in it.
        by_statement: dict[tuple[int, int], list[BindingPlan]] = {}
        for plan in accepted.values():
            b = plan.binding
            by_statement.setdefault((id(b.line), b.line.body.index(b.stmt)), []).append(plan)
        for (_, stmt_index), plans in by_statement.items():
            line = plans[0].binding.line
            targets = {p.binding.index: p.target for p in plans}
            names = ", ".join(f"`{p.binding.local}`" for p in plans)
            self.reports.append(
                CstReport(
                    plans[0].rule,
                    line,
                    f"import of {names} rewritten for torch_npu",
                    Severity.INFO,
                    fix=lambda updated, i=stmt_index, t=targets: rebind_import(updated, i, t),
                    applied=True,
                )
            )
        for plan in self._plans.values():
            if plan.vetoes:
                self.reports.append(
                    CstReport(
                        plan.rule,
                        plan.binding.line,
                        f"import of `{plan.binding.local}` left as is: it is used where " + "; ".join(plan.vetoes),
                        Severity.WARNING,
                    )
                )

    def _decide(self) -> dict[int, BindingPlan]:
        """The import rewrites that stand, and whether each fix is applied; changes no message."""
        accepted = {key: plan for key, plan in self._plans.items() if not plan.vetoes and key not in self._vetoes}
        for report in self.reports:
            if report.requires is not None:
                report.applied = id(report.requires) in accepted
            elif report.fix is not None:
                report.applied = True
        return accepted

    @property
    def accepted_plans(self) -> list[BindingPlan]:
        """The import rewrites that stand as decided so far (for `coherence`, during `resolve_plans`)."""
        return [plan for key, plan in self._plans.items() if not plan.vetoes and key not in self._vetoes]

    def drop(self, report: CstReport) -> None:
        """Forget a report: its fix is not applied and no finding is made of it."""
        self.reports = [r for r in self.reports if r is not report]

    @property
    def needs_torch_npu(self) -> bool:
        """Whether an applied rewrite needs `import torch_npu` to run."""
        return any(r.applied and r.rule.needs_torch_npu for r in self.reports)
