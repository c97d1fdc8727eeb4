"""The rule contract.

A `Rule` is a declaration: a stable id (`NPU101`), a name, a family, tags, a severity, and its user
documentation in one fixed shape (what it does, why, an example, how far its fix can be trusted), as ruff
documents its rules. `npu-migrate rules NPU101` prints it, and the example runs as a test. A `Checker` is
the libcst visitor that finds the sites of one family of rules; one visitor serves several related rules
so that a file is walked once per family, not once per rule.

A checker never edits the tree. It calls `self.report(rule, node, message, fix=...)`, where `fix` is a
function from the node (with its children already rewritten) to its replacement, given only when the
rewrite is provably equivalent. The engine applies all fixes in one pass after every checker has seen
the file, so fixes compose, and `analyze` reports the same findings without applying anything.

Every kind of checker (`BaseChecker`: the libcst `Checker`, the `ast` `TreeChecker`, the `TextChecker` of
files without a Python syntax tree) reports a `Report`; the engine of its kind locates the site, decides
whether the fix is applied, and makes the `Finding` (`Report.finding`).
"""

from __future__ import annotations

import enum
import inspect
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, NamedTuple

import libcst as cst

from npu_migrate.findings import Finding, FindingData, Severity

if TYPE_CHECKING:
    import ast

    from npu_migrate.api import NpuApi
    from npu_migrate.astindex import AstIndex

    # The one reference back: a libcst checker works on the file's `FileContext`, whose reports name
    # their `Rule`. It goes once `Rule` is declared in a module of its own, below both.
    from npu_migrate.context import FileContext
    from npu_migrate.fixes import Fix
    from npu_migrate.lines import Source


class FixSafety(str, enum.Enum):
    """How far a rule's rewrite can be trusted, graded as ruff grades fixes (safe / unsafe / display-only)."""

    SAFE = "safe"  # the migrated code does on the NPU what the original did on the GPU
    NEEDS_REVIEW = "needs review"  # a correct port that changes something a user should look at (`Rule.review`)
    REPORT_ONLY = "report only"  # never rewrites: the finding says what to do

    @property
    def meaning(self) -> str:
        return _SAFETY_MEANING[self]


_SAFETY_MEANING = {
    FixSafety.SAFE: "The rewritten code does on the NPU what the original did on the GPU.",
    FixSafety.NEEDS_REVIEW: "The rewrite is a correct port, but it changes something you should look at:",
    FixSafety.REPORT_ONLY: "The code is left as it is; the finding says what to do.",
}


def _code(text: str) -> str:
    """A code block written indented inside a declaration, as the file it stands for."""
    return textwrap.dedent(text).strip("\n") + "\n" if text.strip() else ""


@dataclass(frozen=True)
class Example:
    """Code a rule acts on. `tests/test_rule_docs.py` runs it, so the documentation cannot drift from the code.

    A rewrite rule's `before` becomes `after` with only the rule (and NPU001, where the rule needs
    `import torch_npu`) selected; a report-only rule leaves `before` as it is (`after` None) and reports a
    finding whose message contains `reports`. Analysis rules (tag "analysis") are checked on
    `npu-migrate analyze --mode all` of `before`.
    """

    before: str
    after: str | None = None
    reports: str = ""
    #: The file's name, which decides its kind: `train.sh`, `Dockerfile`, `kernel.cu`.
    path: str = "example.py"
    #: (path, text) of the files of a library `before` calls, which `analyze --env-path LIB` reads.
    library: tuple[tuple[str, str], ...] = ()
    #: Other rules that must run too for this one to act (NPU001 adds its import after their rewrites).
    with_rules: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "before", _code(self.before))
        if self.after is not None:
            object.__setattr__(self, "after", _code(self.after))
        object.__setattr__(self, "library", tuple((path, _code(text)) for path, text in self.library))


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    #: The group the rule belongs to: the `transforms` module of an `apply` rule ("device", "fused"), the
    #: `analyze` mode of an analysis rule ("model"). `rules` lists it and reports count findings by it.
    family: str
    summary: str
    #: What the rule does: what it rewrites or reports, and what it declines.
    what: str
    #: Why: what goes wrong on an NPU without it.
    why: str
    example: Example
    fix_safety: FixSafety
    #: What to look at after the rewrite; required for `FixSafety.NEEDS_REVIEW`.
    review: str = ""
    severity: Severity = Severity.INFO
    #: Properties callers select rules by (`registry.rules_tagged`); `registry.TAGS` lists them.
    tags: frozenset[str] = frozenset()
    #: Code the rule must leave alone and not report (written like `Example.before`, same file name).
    valid: tuple[str, ...] = ()
    #: Whether the rewritten code needs torch_npu imported unconditionally (rule NPU001). False for the
    #: fused branches, which reach torch_npu only through their guarded prelude and must keep running
    #: where torch_npu is absent.
    needs_torch_npu: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "valid", tuple(_code(text) for text in self.valid))

    @property
    def fixable(self) -> bool:
        return self.fix_safety is not FixSafety.REPORT_ONLY

    @property
    def documentation(self) -> str:
        """The documentation in its one shape: what it does, why, the example, fix safety."""
        example = self.example
        parts = ["What it does:", _indent(inspect.cleandoc(self.what)), "", "Why:", _indent(inspect.cleandoc(self.why))]
        also = f", with {', '.join(example.with_rules)}" if example.with_rules else ""
        parts += ["", f"Example ({example.path}{also}):"]
        for path, text in example.library:
            parts += [f"  The library (given to `analyze --env-path`), {path}:", _indent(text, 4)]
        if example.after is not None:
            parts += ["  Before:", _indent(example.before, 4), "  After:", _indent(example.after, 4)]
        else:
            parts += ["  Left as it is and reported:", _indent(example.before, 4)]
            parts += [f"  Finding: ...{example.reports}..."]
        if self.valid:
            parts += ["", "Left alone:"] + [_indent(text, 4) for text in self.valid]
        parts += ["", f"Fix safety: {self.fix_safety.value}. {self.fix_safety.meaning}"]
        if self.review:
            parts.append(_indent(inspect.cleandoc(self.review)))
        return "\n".join(parts)


def _indent(text: str, by: int = 2) -> str:
    return textwrap.indent(text.rstrip("\n"), " " * by, lambda line: bool(line.strip()))


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
        self.severity = severity or rule.severity
        self.fix = fix
        self.applied = applied
        self.data = FindingData.of(data)

    @property
    def actionable(self) -> bool:
        """Left open, and more than information: a human must act (what `--annotate` marks with a TODO)."""
        return not self.applied and self.severity is not Severity.INFO

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
            severity=self.severity,
            fixed=self.applied and changed,
            original=original,
            replacement=replacement,
            data=self.data,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.rule.id}, {self.message!r}, applied={self.applied})"


class TreeReport(Report):
    """A `TreeChecker`'s report: the site is an `ast` node (an `ast.Module` reports at line 1); `fix` is a
    libcst fix of the twin of `target`, or of `node` (`npu_migrate.scoped`)."""

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


class BaseChecker:
    """What every kind of checker has: the rules it reports, the ids selected in this run (`enabled`), and
    its family (its module's name)."""

    rules: ClassVar[tuple[Rule, ...]]

    def __init__(self, enabled: frozenset[str]) -> None:
        super().__init__()  # cooperative: libcst's visitor base follows this one in `Checker`
        self.enabled = enabled

    @classmethod
    def family(cls) -> str:
        return cls.__module__.rsplit(".", 1)[-1]


class PythonChecker(BaseChecker):
    """What the two kinds of checker of Python files add: the prefilters, which the engine asks in this
    order before it parses a file for them."""

    #: Substrings of which a file must contain at least one for this checker to run: the cheap prefilter.
    markers: ClassVar[tuple[str, ...]] = ()
    #: Runs on every file some other checker parses, never on its own (the `import torch_npu` rule).
    follows_others: ClassVar[bool] = False

    @classmethod
    def wants_words(cls, words: frozenset[str]) -> bool:
        """Whether a file whose text holds the identifier-like `words` (`astindex.text_words`: comments
        and strings included) can match at all: checked after `markers`, before the `ast` parse."""
        return True

    @classmethod
    def wants(cls, index: AstIndex) -> bool:
        """Whether a file whose identifiers and short strings are `index` can match at all. Checked on
        the `ast` of files that passed `markers`, before the ten-times-dearer libcst parse."""
        return True


class Checker(PythonChecker, cst.BatchableCSTVisitor):
    """Base class of the libcst visitors in `transforms/`."""

    markers = ("cuda",)

    def __init__(self, ctx: FileContext, enabled: frozenset[str]) -> None:
        super().__init__(enabled)
        self.ctx = ctx

    def report(self, rule: Rule, node: cst.CSTNode, message: str, **kwargs) -> None:
        """Report a finding of `rule` (dropped when the rule is not selected)."""
        if rule.id in self.enabled:
            self.ctx.report(rule, node, message, **kwargs)

    def finish(self) -> None:
        """Called once after the whole file was visited, before the engine decides which fixes stand."""

    def finalize(self) -> None:
        """Called after fix decisions, for reports that depend on whether the file changes at all."""


class NameUseChecker(Checker):
    """A checker that looks at names and attribute chains as *uses*, and so must skip the places where a
    name is not one: attribute names (`x.cuda` is no use of an imported `cuda`), keyword names, the
    names inside import statements, and the inner links of a chain it already handled (`_skip_chain`)."""

    def __init__(self, ctx: FileContext, enabled: frozenset[str]) -> None:
        super().__init__(ctx, enabled)
        self._skip: set[int] = set()

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self._skip.add(id(node.keyword))

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.module is not None:
            self._skip_chain(node.module)

    def visit_ImportAlias(self, node: cst.ImportAlias) -> None:
        self._skip_chain(node.name)
        if node.asname is not None:
            self._skip.add(id(node.asname.name))

    def _skip_chain(self, node: cst.BaseExpression) -> None:
        while isinstance(node, cst.Attribute):
            self._skip.add(id(node))
            self._skip.add(id(node.attr))
            node = node.value
        self._skip.add(id(node))


class TreeChecker(PythonChecker):
    """A checker that decides on the `ast` tree every file is vetted with, and never needs the whole file
    in libcst: its fixes are libcst fixes of the few statements it changes, which the engine parses
    alone (`npu_migrate.scoped`). For rules that must look at many files and change few (the fused-op
    idioms), where a libcst parse and walk of every candidate file would cost ten times the `ast`.

    It runs after the libcst checkers of the same file, on their result: what they rewrote, it sees
    rewritten, as a second run would.
    """

    def __init__(self, enabled: frozenset[str], api: NpuApi) -> None:
        super().__init__(enabled)
        self.api = api

    def check(self, tree: ast.Module, source: Source, index: AstIndex) -> list[TreeReport]:
        """The findings in `tree` (the file `source`, whose identifiers and strings are `index`)."""
        raise NotImplementedError


class TextChecker(BaseChecker):
    """Base class of the checkers for files without a Python syntax tree (see `npu_migrate.textfiles`).

    `kinds` names the file kinds it reads (`npu_migrate.kinds`); `check` returns reports, each with an
    optional span edit, for the whole text.
    """

    kinds: ClassVar[frozenset[str]]

    def check(self, text: str, kind: str) -> list[TextReport]:
        raise NotImplementedError
