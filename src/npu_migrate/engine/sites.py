"""What a checker reports at one site (`Report`), whatever kind of file it reads.

Every kind of checker (`npu_migrate.engine.checkers`: the libcst `Checker`, the `ast` `TreeChecker`, the
`TextChecker` of files without a Python syntax tree) reports a `Report`; the engine of its kind locates the
site, decides whether the fix is applied, and makes the `Finding` (`Report.finding`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

from npu_migrate.findings import Finding, FindingData, Severity

if TYPE_CHECKING:
    import ast

    from npu_migrate.engine.fixes import Fix
    from npu_migrate.engine.rule import Rule


class Report:
    """What a checker of any kind reports at one site: the rule, the message, how to fix it if a fix is
    provably equivalent, and `data`, the facts code reads about it (never its message). Each kind adds where
    the site is: a libcst node (`context.CstReport`), an `ast` node (`TreeReport`), a line and column of a
    text file (`TextReport`); its engine decides `applied` and makes the `Finding`."""

    rule: Rule
    message: str
    severity: Severity
    #: The kind's fix: a libcst `Fix` of the site (or of its twin) for Python files, a `TextEdit` for text.
    fix: object | None
    applied: bool
    data: FindingData

    def __init__(
        self,
        rule: Rule,
        message: str,
        severity: Severity | None = None,
        fix: object | None = None,
        *,
        applied: bool = False,
        data: Mapping[str, str | int] | None = None,
    ) -> None:
        self.rule = rule
        self.message = message
        #: Whether the checker chose the severity for this site (else the rule's: see `finding`).
        self.chosen_severity = severity is not None
        self.severity = severity or rule.severity
        self.fix = fix
        self.applied = applied
        self.data = FindingData.of(data)

    @property
    def actionable(self) -> bool:
        """Left open, and more than information: a human must act (what `--annotate` marks with a TODO)."""
        return not self.applied and self.open_severity() is not Severity.INFO

    def open_severity(self) -> Severity:
        """The severity the finding is reported with. A rewrite rule's severity is `info` (a rewrite
        needs nothing from the user), but where its checker declined the rewrite and chose no severity for
        the site, the CUDA code is still in place (`.cuda()` not rewritten fails on an NPU): a human must
        look, `warning`. A declined fused rewrite (tag "fused") stays `info`: the fused kernel is optional,
        and the code runs unfused as it is. A fused rule's open finding that is not a site of its kernel
        (`data["fused"]`: a helper of another version left in place, an import of a CUDA-only package an
        NPU host would run) is not optional: `warning`."""
        rule = self.rule
        declined = not self.applied and rule.fixable and not self.chosen_severity
        optional = "fused" in rule.tags and "fused" not in self.data
        if declined and self.severity is Severity.INFO and not optional:
            return Severity.WARNING
        return self.severity

    def finding(
        self, path: str, line: int, col: int, *, changed: bool, original: str = "", replacement: str = ""
    ) -> Finding:
        """The finding at `path:line:col`. It is fixed when its fix was applied and the text `changed` (a
        rewrite that changes nothing fixed nothing); `original` and `replacement` quote the rewritten code."""
        return Finding(
            rule_id=self.rule.id,
            path=path,
            line=line,
            col=col,
            message=self.message,
            severity=self.open_severity(),
            fixed=self.applied and changed,
            original=original,
            replacement=replacement,
            data=self.data,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.rule.id}, {self.message!r}, applied={self.applied})"


class TreeReport(Report):
    """A `TreeChecker`'s report: the site is an `ast` node (an `ast.Module` reports at line 1); `fix` is a
    libcst fix of the twin of `target`, or of `node` (`npu_migrate.engine.scoped`)."""

    node: ast.AST
    #: What `fix` rewrites when it is not `node`: a def or class (found by name and line), a call (by
    #: the position of its function), or another statement (by its first line).
    target: ast.AST | None
    #: Reports whose fixes this one exists for (the helpers their branches call): when a comment
    #: suppresses all of them, this one goes too.
    serves: tuple[TreeReport, ...]

    def __init__(
        self,
        rule: Rule,
        node: ast.AST,
        message: str,
        severity: Severity | None = None,
        fix: Fix | None = None,
        target: ast.AST | None = None,
        serves: tuple[TreeReport, ...] = (),
        applied: bool = False,
        *,
        data: Mapping[str, str | int] | None = None,
    ) -> None:
        super().__init__(rule, message, severity, fix, applied=applied, data=data)
        self.node = node
        self.target = target
        self.serves = serves


class TextEdit(NamedTuple):
    """A text file's fix: the characters `start:end` of the file become `replacement`."""

    start: int
    end: int
    replacement: str


class TextReport(Report):
    """A `TextChecker`'s report: the site is a line and a (1-based) column; the fix, if any, replaces the
    file offsets `span` with `replacement`."""

    line: int
    col: int
    fix: TextEdit | None

    def __init__(
        self,
        rule: Rule,
        line: int,
        col: int,
        message: str,
        severity: Severity | None = None,
        span: tuple[int, int] | None = None,
        replacement: str = "",
        *,
        data: Mapping[str, str | int] | None = None,
    ) -> None:
        super().__init__(rule, message, severity, TextEdit(*span, replacement) if span is not None else None, data=data)
        self.line = line
        self.col = col
