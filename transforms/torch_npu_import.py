"""`import torch_npu` for files the migration changed.

`torch.npu`, `Tensor.npu()` and the `npu` device only exist once torch_npu has been imported, so every
migrated file that needs it imports it once, right after its first top-level torch import (or after
the docstring and `__future__` imports when torch is only imported inside functions, or not at all
but the file moves tensors it is given: `batch.npu()` needs torch_npu as much).

One import policy: a file that calls torch.npu APIs imports torch_npu unconditionally (it cannot run
without it); the fused branches alone never require it (their helpers import it guarded, and use this
import instead where there is one).
"""

from __future__ import annotations

import ast

import libcst as cst

from npu_migrate.engine.checkers import Checker
from npu_migrate.engine.layout import line_width
from npu_migrate.engine.rule import EVERY_TARGET, Example, FixSafety, Rule
from npu_migrate.findings import Severity
from npu_migrate.program.imports import add_module_import, dotted_name, insertion_index
from npu_migrate.transforms.common.accelerator import (
    ACCELERATOR_NAME,
    MODULE_NAME,
    defined_at,
    defines_accelerator,
    defines_accelerator_module,
    definition,
    legacy_definition_at,
    module_definition,
    names_read,
    portable,
    top_level_torch,
)
from npu_migrate.transforms.common.guarded_import import GUARDED_IMPORT, is_guarded_import

IMPORT_TORCH_NPU = Rule(
    id="NPU001",
    name="import-torch-npu",
    family="torch_npu_import",
    summary="`import torch_npu` is added once to each migrated file that needs it",
    what="""
    Adds `import torch_npu` after the file's first torch import, once, when another rule changed the
    file in a way that needs torch_npu, the file uses torch (or, without a torch import, moves tensors
    to the NPU: `batch.npu()`), and it does not import torch_npu already. The fused-operator branches do not count: they import torch_npu guarded, or use
    this import when the file has it. `--select` of rules that need torch_npu selects this rule too
    unless it is ignored. With `--target portable` the import is guarded (`try: import torch_npu` /
    `except ImportError: pass`), so the file still imports on a CUDA or CPU host without torch_npu, and the
    names the other rules' code reads are defined after the imports: `ACCELERATOR` ("npu" on an Ascend host,
    "cuda" on every other, an Apple MPS or Intel XPU one included, as the original said) and
    `ACCELERATOR_MODULE` (`torch.get_device_module(ACCELERATOR)`). An `ACCELERATOR` written by an earlier
    npu-migrate (the accelerator's own type, "mps" on an Apple host) is replaced in a file migrated again.
    """,
    why="""
    `torch.npu`, the "npu" device and the hccl backend exist only once torch_npu is imported; without
    it the migrated code fails on its first NPU call. Ignore this rule (`--ignore NPU001`) if your entry
    point imports torch_npu for the whole process.
    """,
    example=Example(
        before="""
            import torch

            x = torch.ones(2).cuda()
        """,
        after="""
            import torch
            import torch_npu

            x = torch.ones(2).npu()
        """,
        with_rules=("NPU101",),
    ),
    valid=(
        """
        import torch
        import torch_npu

        x = torch.ones(2).npu()
        """,
    ),
    fix_safety=FixSafety.SAFE,
    targets=EVERY_TARGET,
)


NPU_CODE = Rule(
    id="NPU002",
    name="npu-code",
    family="torch_npu_import",
    summary="`--target portable` leaves code already written for torch_npu as it is, and says so",
    what="""
    Reports, once per file, a file that imports torch_npu and uses `torch.npu`, `.npu()` or another `npu`
    attribute: code already migrated to the NPU (by `apply --target npu`, or by hand). The portable target
    does not turn NPU code into device-generic code; it leaves the file as it is.
    """,
    why="""
    `apply --target portable` on an npu-migrated tree would otherwise change nothing and say nothing, and the
    tree would still run on Ascend only. Migrating the CUDA original with `--target portable` gives code for
    every host.
    """,
    example=Example(
        before="""
            import torch
            import torch_npu

            x = torch.ones(2).npu()
        """,
        reports="written for torch_npu",
    ),
    valid=(
        """
        import torch

        x = torch.ones(2)
        """,
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    # The user asked for code for every host and this file still runs on Ascend only: a human must act.
    severity=Severity.WARNING,
    needs_torch_npu=False,
    targets=frozenset({"portable"}),
)


def _first_torch_import(module: cst.Module) -> int | None:
    for index, stmt in enumerate(module.body):
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Import) and any(
                (dotted_name(a.name) or "").split(".")[0] == "torch" for a in small.names
            ):
                return index
            if isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative:
                if (dotted_name(small.module) or "").split(".")[0] == "torch":
                    return index
    return None


def _insert(updated: cst.Module) -> cst.Module:
    after = _first_torch_import(updated)
    module = add_module_import(updated, "torch_npu", after=after)
    if after is not None:
        return module
    # No torch import to sit next to: the import stands alone, apart from a def or class after it.
    body = list(module.body)
    index = next(i for i, stmt in enumerate(body) if _is_torch_npu_import(stmt))
    following = body[index + 1] if index + 1 < len(body) else None
    if isinstance(following, (cst.FunctionDef, cst.ClassDef)) and not following.leading_lines:
        blank = cst.EmptyLine(indent=False, whitespace=cst.SimpleWhitespace(""))
        body[index + 1] = following.with_changes(leading_lines=[blank, blank])
    return module.with_changes(body=body)


def _portable_prelude(updated: cst.Module, *, import_torch_npu: bool, names: frozenset[str]) -> cst.Module:
    """The portable target's additions after the imports: the guarded `import torch_npu` (right after the
    first torch import), `ACCELERATOR` (right after the torch_npu import, which must run first for the NPU
    to be torch's accelerator) and `ACCELERATOR_MODULE` right after it."""
    body = list(updated.body)
    if import_torch_npu:
        after = _first_torch_import(updated)
        index = insertion_index(updated) if after is None else after + 1
        guarded = cst.parse_statement(GUARDED_IMPORT)
        # A compound statement among the imports stands apart from them, as `ruff format` lays it out.
        body.insert(index, guarded.with_changes(leading_lines=[cst.EmptyLine()]) if index else guarded)
    if ACCELERATOR_NAME in names:
        module = updated.with_changes(body=body)
        npu = next((i for i, stmt in enumerate(body) if _imports_torch_npu_at(module, stmt)), -1)
        body.insert(
            max(_end_of_imports(module), npu, top_level_torch(module)) + 1, definition(line_width(updated.code))
        )
    if MODULE_NAME in names:
        module = updated.with_changes(body=body)
        body.insert(defined_at(module, ACCELERATOR_NAME) + 1, module_definition())
    return updated.with_changes(body=body)


def _end_of_imports(module: cst.Module) -> int:
    """The index of the last statement of the imports the file opens with (its docstring included)."""
    last = -1
    for index, stmt in enumerate(module.body):
        simple = isinstance(stmt, cst.SimpleStatementLine)
        if simple and all(isinstance(small, (cst.Import, cst.ImportFrom)) for small in stmt.body):
            last = index
        elif index == 0 and simple and isinstance(stmt.body[0], cst.Expr):
            last = index  # the docstring
        elif not _imports_torch_npu_at(module, stmt):
            break
        else:
            last = index
    return last


def _imports_torch_npu_at(module: cst.Module, stmt: cst.CSTNode) -> bool:
    """A module-level `import torch_npu`, plain or guarded."""
    if _is_torch_npu_import(stmt):
        return True
    return isinstance(stmt, cst.Try) and is_guarded_import(ast.parse(module.code_for_node(stmt)).body[0])


_MAIN_GUARD = "__name__ =="  # `if __name__ == "__main__":`: a script, run rather than imported


def _guard_import(updated: cst.SimpleStatementLine) -> cst.BaseStatement:
    return cst.parse_statement(GUARDED_IMPORT).with_changes(leading_lines=updated.leading_lines)


def _is_torch_npu_import(stmt: cst.CSTNode) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and isinstance(stmt.body[0], cst.Import)
        and dotted_name(stmt.body[0].names[0].name) == "torch_npu"
    )


class TorchNpuImportChecker(Checker):
    rules = (IMPORT_TORCH_NPU,)
    markers = ()  # never a reason to parse a file on its own
    follows_others = True

    def finalize(self) -> None:
        imports = self.ctx.imports
        # Without a torch import a file still needs torch_npu for the tensors it is given (`batch.npu()`);
        # a script that only sets environment variables does not.
        tensors = imports.uses_torch or any(r.applied and r.rule.family == "device" for r in self.ctx.reports)
        if portable(self.ctx) is not None and imports.imports_torch_npu:
            self._guard_plain_import()
        needs_import = self.ctx.needs_torch_npu and tensors and not imports.imports_torch_npu
        if portable(self.ctx) is not None:
            self._portable_prelude(needs_import)
        elif needs_import:
            self.report(IMPORT_TORCH_NPU, self.ctx.module, "`import torch_npu` added" + self._library(), fix=_insert)

    def _library(self) -> str:
        """What the added import means for a module of a package (not a script, nor `__main__.py`): every
        importer of the package now needs torch_npu; the npu target is for code that runs on Ascend only."""
        from npu_migrate.program.packages import helper_module

        # The file's place on disk, not its display name: that is relative to the run's root, and resolved
        # against the current folder it named another file (or none).
        file = self.ctx.file
        if file is None or helper_module(file) is None or _MAIN_GUARD in self.ctx.text:
            return ""
        return (
            ": this module is part of a package, which now needs torch_npu to import (a CPU or CUDA host can no "
            "longer import it); for a library that must keep importing there, migrate it with --target portable, "
            "which imports torch_npu guarded and picks the device of the host"
        )

    def _portable_prelude(self, needs_import: bool) -> None:
        module = self.ctx.module
        legacy = legacy_definition_at(module)
        # The earlier version's device tests (`torch.accelerator.is_available()`) say True on an MPS host: under
        # the new definition ("cuda" there) they would send it to CUDA. Replaced only where none is left.
        tests_left = any(f"torch.accelerator.{test}" in self.ctx.text for test in ("is_available", "device_count"))
        if legacy is not None and any(r.applied for r in self.ctx.reports) and not tests_left:
            width = line_width(self.ctx.text)
            self.report(
                IMPORT_TORCH_NPU,
                module.body[legacy],
                '`ACCELERATOR` as an earlier npu-migrate wrote it (the accelerator\'s own type, "mps" on an Apple '
                'host, where the original fell back to the CPU) now says "cuda" on every host but an Ascend one',
                fix=lambda updated: definition(width),
            )
        elif legacy is not None and any(r.applied for r in self.ctx.reports):
            self.report(
                IMPORT_TORCH_NPU,
                module.body[legacy],
                '`ACCELERATOR` as an earlier npu-migrate wrote it ("mps" on an Apple host) kept: this file\'s '
                "`torch.accelerator.is_available()` / `device_count()` go with it; migrate the CUDA original again "
                "(or write `ACCELERATOR_MODULE.is_available()` there) to get the CPU fallback on such hosts",
            )
        read: set[str] = set()
        for r in self.ctx.reports:
            if r.applied and r.fix is not None and r.node is not module:
                read |= names_read(r.fix(r.node))
        if MODULE_NAME in read:
            read.add(ACCELERATOR_NAME)  # the module is the accelerator's: it is defined from ACCELERATOR
        names = frozenset(
            name
            for name, defined in ((ACCELERATOR_NAME, defines_accelerator), (MODULE_NAME, defines_accelerator_module))
            if name in read and not defined(module)
        )
        if not (needs_import or names):
            return
        said = []
        if needs_import:
            said.append("`import torch_npu` added, guarded: the file still imports where it is absent")
        if ACCELERATOR_NAME in names:
            said.append("`ACCELERATOR` (the current accelerator's device type) defined after the imports")
        if MODULE_NAME in names:
            said.append("`ACCELERATOR_MODULE` (its torch module: torch.cuda, torch.npu) defined after it")
        fix = lambda updated: _portable_prelude(updated, import_torch_npu=needs_import, names=names)  # noqa: E731
        self.report(IMPORT_TORCH_NPU, module, "; ".join(said), fix=fix)

    def _guard_plain_import(self) -> None:
        """The portable target's files must import where torch_npu is absent: a plain top-level
        `import torch_npu` (an npu-migrated file) is guarded, once the file is migrated at all."""
        if not any(r.applied for r in self.ctx.reports):
            return
        for stmt in self.ctx.module.body:
            if _is_torch_npu_import(stmt) and len(stmt.body) == 1 and stmt.body[0].names[0].asname is None:
                self.report(
                    IMPORT_TORCH_NPU,
                    stmt,
                    "`import torch_npu` guarded: the file must import where torch_npu is absent",
                    fix=_guard_import,
                )


class NpuCodeChecker(Checker):
    """The portable target on code already written for torch_npu (an npu-migrated tree): it does not turn
    `torch.npu` calls, `.npu()` moves and "npu" devices back into generic code, so it says so, once per file,
    at the import that makes the file NPU code."""

    rules = (NPU_CODE,)
    markers = ("torch_npu",)

    @classmethod
    def wants(cls, index) -> bool:
        # The finding sits on the file's `import torch_npu` and needs an `.npu` use besides.
        return index.uses("torch_npu") and index.uses("npu")

    def __init__(self, ctx, enabled) -> None:
        super().__init__(ctx, enabled)
        self._npu_uses: list[str] = []

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value == "npu" and not self._npu_uses:
            self._npu_uses.append(self.ctx.code(node))

    def finish(self) -> None:
        if not self._npu_uses:
            return
        for stmt in self.ctx.module.body:
            if _is_torch_npu_import(stmt):
                self.report(
                    NPU_CODE,
                    stmt,
                    f"this file is written for torch_npu (`{self._npu_uses[0]}`): --target portable leaves NPU code "
                    "as it is; migrate the file's CUDA original with --target portable for code that runs on both",
                )
                return
