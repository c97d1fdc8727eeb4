"""`import torch_npu` for files the migration changed.

`torch.npu`, `Tensor.npu()` and the `npu` device only exist once torch_npu has been imported, so every
migrated file that uses torch imports it once, right after its first top-level torch import (or after
the docstring and `__future__` imports when torch is only imported inside functions).
"""

from __future__ import annotations

import libcst as cst

from npu_migrate.checkers import Checker
from npu_migrate.imports import add_module_import, dotted_name
from npu_migrate.rule import Example, FixSafety, Rule

IMPORT_TORCH_NPU = Rule(
    id="NPU001",
    name="import-torch-npu",
    family="torch_npu_import",
    summary="`import torch_npu` is added once to each migrated file that uses torch",
    what="""
    Adds `import torch_npu` after the file's first torch import, once, when another rule changed the
    file in a way that needs torch_npu, the file imports torch, and it does not import torch_npu
    already. The fused-operator branches do not count: they import torch_npu guarded.
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
    return add_module_import(updated, "torch_npu", after=_first_torch_import(updated))


class TorchNpuImportChecker(Checker):
    rules = (IMPORT_TORCH_NPU,)
    markers = ()  # never a reason to parse a file on its own
    follows_others = True

    def finalize(self) -> None:
        imports = self.ctx.imports
        if self.ctx.needs_torch_npu and imports.uses_torch and not imports.imports_torch_npu:
            self.report(IMPORT_TORCH_NPU, self.ctx.module, "`import torch_npu` added", fix=_insert)
