"""NPU803: a program that insists on a CUDA-only package (xformers, flash-attn, apex ...) stops on an NPU host.

`if xops is None: raise ImportError("xformers is required")`, `assert HAS_FLASH, "flash-attn required"`, or a
try-import whose handler raises again: the package only runs on NVIDIA GPUs and does not install on an
Ascend host, so there the requirement always fails, before any rewrite of the code that uses the package
could matter. Reported, never rewritten (what replaces the package is a decision of the code's author),
with the package table's alternative (`transforms/data/third_party.toml`).
"""

from __future__ import annotations

import libcst as cst

from npu_migrate.engine.checkers import Checker
from npu_migrate.engine.rule import EVERY_TARGET, Example, FixSafety, Rule
from npu_migrate.findings import Severity
from npu_migrate.program.api import package_table
from npu_migrate.program.guards import (
    cuda_only_package,
    presence_names,
    presence_node,
    presence_package,
    statements_of,
)
from npu_migrate.program.imports import handler_catches_import_error

REQUIRED_PACKAGE = Rule(
    id="NPU803",
    name="cuda-only-package-required",
    family="kernels",
    summary="A `raise` or `assert` that stops the program where a CUDA-only package (xformers, flash-attn, "
    "apex, ...) failed to import is reported with the Ascend alternative",
    what="""
    Reports the statements that stop a program when a package that only runs on NVIDIA GPUs is missing:
    an `assert` of its presence (`assert HAS_FLASH`, `assert xops is not None`), a `raise` under a test
    of its absence (`if xops is None: raise ...`, `if not is_flash_attn_2_available(): raise ...`), and a
    handler of its try-import that raises again. Presence is what the import binds, a flag set in the
    body or the handlers of its try-import, a name assigned a test of those, or transformers'
    `is_flash_attn_2_available()`-style tests. The finding names the package's Ascend alternative.
    """,
    why="""
    The package does not install on an Ascend host: the requirement always fails there, and the program
    stops before the code that uses the package, migrated or not, runs.
    """,
    example=Example(
        before="""
            try:
                import xformers.ops as xops
            except ImportError:
                xops = None


            def check():
                if xops is None:
                    raise ImportError("training needs xformers")
        """,
        reports="stops the program where xformers is absent",
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    severity=Severity.WARNING,
    targets=EVERY_TARGET,
)

#: The packages whose requirement is looked for (the markers of the prefilter).
_MARKERS = ("xformers", "flash_attn", "apex", "bitsandbytes")


class RequiredPackageChecker(Checker):
    rules = (REQUIRED_PACKAGE,)
    markers = _MARKERS

    @classmethod
    def wants(cls, index) -> bool:
        return any(marker in index.names for marker in _MARKERS) or any(
            name.startswith(("is_flash_attn", "is_xformers", "is_apex", "is_bitsandbytes")) for name in index.names
        )

    def finish(self) -> None:
        if REQUIRED_PACKAGE.id not in self.enabled:
            return
        names = presence_names(self.ctx)
        for node in _statements(self.ctx.module):
            found = self._requirement(node, names)
            if found is not None:
                site, package = found
                self._report(site, package)

    def _requirement(self, node: cst.CSTNode, names: dict[str, str]) -> tuple[cst.CSTNode, str] | None:
        """The statement that stops the program where a package is absent, and the package."""
        if isinstance(node, cst.Assert):
            tested = presence_node(node.test, names)
            if tested is not None and _positive(_operand(node.test, tested)):
                return node, presence_package(tested, names)
        elif isinstance(node, cst.If) and _raises(node.body):
            tested = presence_node(node.test, names)
            if tested is not None and not _positive(_operand(node.test, tested)):
                return node.body.body[-1], presence_package(tested, names)
        elif isinstance(node, cst.Try):
            package = _imported_package(node, names)
            if package is not None:
                for handler in node.handlers:
                    if _raises(handler.body) and handler_catches_import_error(handler):
                        return handler.body.body[-1], package
        return None

    def _report(self, site: cst.CSTNode, package: str) -> None:
        entry = package_table().get(package, {})
        alternative = entry.get("advice") or f"{package} only runs on NVIDIA GPUs"
        self.report(
            REQUIRED_PACKAGE,
            site,
            f"stops the program where {package} is absent, which it always is on an NPU host (it does not install "
            f"there): make it optional, with a fallback the NPU can run. {alternative}",
        )


def _statements(module: cst.Module):
    """Every `assert`, `if` and `try` of the module, in order (without walking the expressions, #26)."""
    return [node for node in statements_of(module) if isinstance(node, (cst.Assert, cst.If, cst.Try))]


def _operand(test: cst.BaseExpression, tested: cst.CSTNode) -> cst.BaseExpression:
    """The operand of `test`'s `and` / `or` that holds `tested` (`not is_flash_attn_2_available()` in
    `fused and not is_flash_attn_2_available()`)."""
    while isinstance(test, cst.BooleanOperation):
        test = test.left if _holds(test.left, tested) else test.right
    return test


def _holds(node: cst.CSTNode, tested: cst.CSTNode) -> bool:
    return node is tested or any(_holds(child, tested) for child in node.children)


def _positive(test: cst.BaseExpression) -> bool:
    """Whether `test` is true where the package is there: `HAS_FLASH`, `xops is not None`; False for
    `not HAS_FLASH`, `xops is None`."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return not _positive(test.expression)
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        operator = test.comparisons[0].operator
        if isinstance(operator, (cst.Is, cst.Equal)):
            return False
    return True


def _raises(block: cst.BaseSuite) -> bool:
    body = getattr(block, "body", ())
    last = body[-1] if body else None
    return isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[-1], cst.Raise)


def _imported_package(node: cst.Try, names: dict[str, str]) -> str | None:
    """The CUDA-only package the try's body imports."""
    for statement in node.body.body:
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, (cst.Import, cst.ImportFrom)):
                    package = cuda_only_package(small)
                    if package is not None:
                        return package
    return None
