"""Lines as `ast` and libcst count them, and the line-level features on top of the syntax tree:
`# npu-migrate: ignore` comments and inline TODOs, the same for every kind of file.

Both features need to know which statement a line belongs to. Positions cost about two parses, so they
are only computed for files that have findings, and the statement index only when a file has
suppression comments or `--annotate` is on.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

if TYPE_CHECKING:
    from pathlib import Path

    from libcst.metadata import CodeRange

    from npu_migrate.engine.fixes import Fix

#: The line breaks `ast` and libcst count: `\r\n`, `\r` and `\n`, never the form feeds, `\x1c`, `\u2028` ...
#: that `str.splitlines` also breaks at and that can sit inside a line of code.
LINE_BREAK = re.compile(r"\r\n|\r|\n")
_LINE_WITH_BREAK = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def source_lines(text: str, *, keepends: bool = False) -> list[str]:
    """The lines of `text` as `ast` and libcst number them (see `LINE_BREAK`)."""
    if keepends:
        return _LINE_WITH_BREAK.findall(text)
    lines = LINE_BREAK.split(text)
    return lines[:-1] if lines and lines[-1] == "" else lines


class Source:
    """The text of a file as `ast` sees it: lines split on the newlines the tokenizer knows (never on
    form feeds or the other separators `str.splitlines` breaks at), columns in characters."""

    def __init__(self, text: str, helper_module: str | None = None, file: Path | None = None) -> None:
        self.text = text
        #: Where the file lies on disk (None: nowhere known, as stdin): a rule that reads the files next to
        #: it (NPU703's imported helpers) reads them from there.
        self.file = file
        self.lines = source_lines(text, keepends=True)
        #: Where the file imports the fused-op helpers from (a relative module, `.._npu_fused`) when it is
        #: part of a package; None: they are written into the file itself.
        self.helper_module = helper_module

    def char_col(self, lineno: int, byte_col: int) -> int:
        """`ast` columns count UTF-8 bytes; libcst's and the user's count characters."""
        line = self.lines[lineno - 1] if lineno <= len(self.lines) else ""
        return len(line.encode("utf-8")[:byte_col].decode("utf-8", errors="replace"))

    def segment(self, node: ast.stmt) -> str:
        """The whole lines of a statement, decorators included."""
        return "".join(self.lines[first_line(node) - 1 : node.end_lineno])

    def starts_line(self, node: ast.stmt) -> bool:
        """Whether nothing but indentation precedes `node` on its first line (its block is indented)."""
        return not self.lines[node.lineno - 1][: node.col_offset].strip()

    def position(self, node: ast.AST) -> tuple[int, int]:
        if not hasattr(node, "lineno"):
            return 1, 1
        return node.lineno, self.char_col(node.lineno, node.col_offset) + 1


def first_line(node: ast.stmt) -> int:
    """An `ast` statement's first line, its decorators included."""
    decorators = getattr(node, "decorator_list", ())
    return min([node.lineno, *(d.lineno for d in decorators)])


SUPPRESSION = re.compile(
    r"#\s*(?:npu-migrate:\s*ignore(?:\[(?P<codes>[A-Za-z0-9,\s]*)\])?|noqa:\s*(?P<noqa>NPU[0-9A-Za-z,\s]*))"
)
TODO_PREFIX = "# TODO(npu-migrate "

_STATEMENTS = (cst.SimpleStatementLine, cst.BaseCompoundStatement)


class StatementIndex:
    """Statements by the lines they span."""

    def __init__(self, positions) -> None:
        self.spans: list[tuple[int, int, object]] = sorted(
            ((r.start.line, r.end.line, node) for node, r in positions.items() if isinstance(node, _STATEMENTS)),
            key=lambda item: (item[0], -item[1]),
        )

    @classmethod
    def of_spans(cls, spans) -> StatementIndex:
        """From (first line, last line, statement) triples: the statements of an `ast` tree."""
        index = cls.__new__(cls)
        index.spans = sorted(spans, key=lambda item: (item[0], -item[1]))
        return index

    def starting_at(self, line: int) -> list[tuple[int, int, cst.CSTNode]]:
        return [span for span in self.spans if span[0] == line]

    def innermost(self, line: int) -> cst.CSTNode | None:
        """The smallest statement containing `line`; for a compound statement only its header line counts,
        so a finding in an `if` test is annotated above the `if`, one in its body above the body line."""
        best = None
        for start, end, node in self.spans:
            if start <= line <= end and (best is None or start >= best[0]):
                best = (start, end, node)
        return best[2] if best else None


def suppression_comments(text: str) -> list[tuple[int, frozenset[str] | None]]:
    """The suppression comments of `text`, Python or not: (line, rule codes or None for all) each."""
    if not Suppressions.may_have(text):
        return []
    found = []
    for number, line in enumerate(source_lines(text), start=1):
        match = SUPPRESSION.search(line)
        if match:
            raw = match.group("codes") if match.group("noqa") is None else match.group("noqa")
            codes = frozenset(c.strip().upper() for c in raw.split(",") if c.strip()) if raw else None
            found.append((number, codes or None))
    return found


@dataclass
class Suppressions:
    #: (first line, last line, codes or None for all) per suppression comment
    ranges: list[tuple[int, int, frozenset[str] | None]]

    @staticmethod
    def may_have(text: str) -> bool:
        return "npu-migrate:" in text or "noqa" in text

    @classmethod
    def scan(cls, text: str, statements: Callable[[], StatementIndex] | None = None) -> Suppressions:
        """The suppressions of `text`. A comment covers its line, and with `statements` (the statement index
        of a Python file, asked for only when there is a comment) the whole block of a header it ends."""
        found = suppression_comments(text)
        if not found or statements is None:
            return cls([(number, number, codes) for number, codes in found])
        index = statements()
        ranges = []
        for number, codes in found:
            spans = index.starting_at(number)
            end = max((s[1] for s in spans), default=number)  # a comment on a block header covers the block
            ranges.append((number, end, codes))
        return cls(ranges)

    def covers(self, line: int, rule_id: str) -> bool:
        return any(
            start <= line <= end and (codes is None or any(rule_id.startswith(c) for c in codes))
            for start, end, codes in self.ranges
        )


def todo_comment(rule_id: str, message: str) -> str:
    """One line: the finding's first clause, and where the rest is documented."""
    first = re.split(r"(?<=[.;])\s", message.split("\n")[0], maxsplit=1)[0].rstrip(".;")
    return f"{TODO_PREFIX}{rule_id}): {first} (see `npu-migrate rules {rule_id}`)"


def add_todo(statement: cst.CSTNode, comment: str):
    """A fix: `comment` as the last line above `statement`, unless a TODO for that rule is there already."""
    rule_tag = comment.split(")")[0]

    def fix(updated):
        lines = list(getattr(updated, "leading_lines", ()))
        if any(line.comment and line.comment.value.startswith(rule_tag) for line in lines):
            return updated
        lines.append(cst.EmptyLine(indent=True, comment=cst.Comment(comment)))
        return updated.with_changes(leading_lines=lines)

    return fix


def todo_above(lines: list[str], line: int, tag: str) -> bool:
    """Whether the comment lines right above `line` hold a TODO starting with `tag` (from an earlier run).
    The comments above a module's first statement belong to the module header, not the statement,
    so this reads the text rather than the statement's leading lines."""
    index = line - 2
    while index >= 0 and lines[index].strip().startswith("#"):
        if lines[index].strip().startswith(tag):
            return True
        index -= 1
    return False


def todo_edits(
    open_findings: Iterable[tuple[str, str, int]],
    lines: list[str],
    statements: StatementIndex,
    first_line_of: Callable[[object], int],
) -> list[tuple[object, Fix]]:
    """`--annotate`, for either syntax tree: a TODO comment above the statement of each open finding, given
    as (rule id, message, line), unless the comment lines right above the statement (which starts at
    `first_line_of(statement)`) carry one for that rule already, from an earlier run. Returns the
    statements and their fixes."""
    edits = []
    for rule_id, message, line in open_findings:
        statement = statements.innermost(line)
        if statement is None:
            continue
        comment = todo_comment(rule_id, message)
        if not todo_above(lines, first_line_of(statement), comment.split(")")[0]):
            edits.append((statement, add_todo(statement, comment)))
    return edits


def line_of(positions, node: cst.CSTNode) -> int:
    position: CodeRange | None = positions.get(node)
    return position.start.line if position else 1
