"""The checkers: what finds the sites of a family of rules.

A `Checker` is the libcst visitor of one family; one visitor serves several related rules so that a file is
walked once per family, not once per rule. A checker never edits the tree. It calls
`self.report(rule, node, message, fix=...)`, where `fix` is a function from the node (with its children
already rewritten) to its replacement, given only when the rewrite is provably equivalent. The engine
applies all fixes in one pass after every checker has seen the file, so fixes compose, and `analyze`
reports the same findings without applying anything. `TreeChecker`s decide on the `ast` instead, and
`TextChecker`s read files without a Python syntax tree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import libcst as cst

if TYPE_CHECKING:
    import ast

    from npu_migrate.engine.astindex import AstIndex
    from npu_migrate.engine.context import FileContext
    from npu_migrate.engine.lines import Source
    from npu_migrate.engine.rule import Rule
    from npu_migrate.engine.sites import TextReport, TreeReport
    from npu_migrate.program.api import NpuApi


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
    alone (`npu_migrate.engine.scoped`). For rules that must look at many files and change few (the fused-op
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
    """Base class of the checkers for files without a Python syntax tree (see `npu_migrate.engine.textfiles`).

    `kinds` names the file kinds it reads (`npu_migrate.files.kinds`); `check` returns reports, each with an
    optional span edit, for the whole text.
    """

    kinds: ClassVar[frozenset[str]]

    def __init__(self, enabled: frozenset[str], target: str = "npu") -> None:
        super().__init__(enabled)
        #: `api.TARGETS`: a launch script migrated to "portable" must keep serving CUDA hosts.
        self.target = target

    def check(self, text: str, kind: str) -> list[TextReport]:
        raise NotImplementedError
