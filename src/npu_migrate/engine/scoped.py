"""libcst edits without parsing the whole module: only the top-level statements that change are parsed.

A libcst parse, and above all a walk over its tree in Python, costs ten to twenty times what `ast` costs
(`benchmarks/`). Rules that can decide on the `ast` every file is vetted with anyway (`TreeChecker`s: the
fused-operator idioms, looked for in 800 of transformers' 2,900 files and rewritten in 260 of them)
report `ast` nodes, and give their fixes as libcst fixes of those nodes. The engine then parses with
libcst only the top-level statements that hold a node to fix, finds each node's libcst twin by its
position, applies the fixes there in one pass (`npu_migrate.engine.fixes`), and puts the regenerated
statements back in place of their lines. The rest of the file is never parsed by libcst and is kept
byte for byte; libcst's round trip keeps the parsed statements so too, apart from the fixes.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from npu_migrate.engine.astindex import AstIndex
from npu_migrate.engine.checkers import TreeChecker
from npu_migrate.engine.fixes import Fix, apply_fixes, node_code, skip_statements_apart
from npu_migrate.engine.lines import (
    LINE_BREAK,
    Source,
    StatementIndex,
    Suppressions,
    first_line,
    source_lines,
    todo_edits,
)
from npu_migrate.engine.positions import positions_of
from npu_migrate.engine.sites import TreeReport  # with `Source`, what tree checkers import from here
from npu_migrate.findings import Finding

if TYPE_CHECKING:
    from npu_migrate.program.api import NpuApi

_COMPOUND = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.If,
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.With,
    ast.AsyncWith,
    ast.Try,
    ast.TryStar,
    ast.Match,
)


def statement_index(tree: ast.Module) -> StatementIndex:
    """Statements by the lines they span, as `lines.StatementIndex` has them from libcst positions (a def
    starts at its `def` line, as in libcst)."""
    return StatementIndex.of_spans(
        (node.lineno, node.end_lineno, node) for node in ast.walk(tree) if isinstance(node, ast.stmt)
    )


def run(
    checkers: list[type[TreeChecker]],
    tree: ast.Module,
    source: Source,
    display: str,
    enabled: frozenset[str],
    api: NpuApi,
    *,
    index: AstIndex | None = None,
    annotate: bool = False,
) -> tuple[str, list[Finding]]:
    """Run tree checkers on one file: its migrated text and the findings (positions in `source`)."""
    index = index or AstIndex.of(tree)
    reports: list[TreeReport] = [
        report for checker in checkers for report in checker(enabled, api).check(tree, source, index)
    ]
    if not reports:
        return source.text, []
    built: list[StatementIndex] = []  # only when comments or --annotate need it

    def statements() -> StatementIndex:
        if not built:
            built.append(statement_index(tree))
        return built[0]

    suppressions = Suppressions.scan(source.text, statements)
    if suppressions.ranges:
        # A report that exists for others (the helpers their branches call) stands or falls with them, not
        # with a comment on its own line (the module's: line 1).
        reports = [r for r in reports if r.serves or not suppressions.covers(source.position(r.node)[0], r.rule.id)]
        kept = {id(r) for r in reports}
        reports = [r for r in reports if not r.serves or any(id(s) in kept for s in r.serves)]
    for report in reports:
        report.applied = report.fix is not None
    edits: list[tuple[ast.AST, Fix]] = [(r.target or r.node, r.fix) for r in reports if r.applied]
    if annotate:
        open_findings = ((r.rule.id, r.message, source.position(r.node)[0]) for r in reports if r.actionable)
        edits += todo_edits(open_findings, source_lines(source.text), statements(), first_line)
    new_text, twins = _splice(source, tree, edits)
    changed = new_text != source.text
    findings = []
    for report in reports:
        original, replacement = twins.get(id(report.fix), ("", "")) if report.applied else ("", "")
        if report.applied and id(report.fix) not in twins:
            report.message += " (not rewritten: libcst could not parse or locate this code)"
            report.applied = False
        line, col = source.position(report.node)
        findings.append(report.finding(display, line, col, changed=changed, original=original, replacement=replacement))
    return new_text, findings


# -- splicing -----------------------------------------------------------------------------------------


def _blocks(tree: ast.Module) -> list[tuple[int, int]]:
    """The line ranges of the top-level statements; statements sharing a line (`a; b`) share a range."""
    blocks: list[list[int]] = []
    for stmt in tree.body:
        start, end = first_line(stmt), stmt.end_lineno
        if blocks and start <= blocks[-1][1]:
            blocks[-1][1] = max(blocks[-1][1], end)
        else:
            blocks.append([start, end])
    return [(start, end) for start, end in blocks]


def _splice(source: Source, tree: ast.Module, edits: list[tuple[ast.AST, Fix]]):
    """Apply `edits` block by block. Returns the new text and, per applied fix (by id), the code of its
    node before and after."""
    twins: dict[int, tuple[str, str]] = {}
    if not edits:
        return source.text, twins
    blocks = _blocks(tree)
    by_block: dict[int, list[tuple[ast.AST, Fix]]] = {}
    for target, fix in edits:
        line = target.lineno if hasattr(target, "lineno") else 1
        number = next((i for i, (start, end) in enumerate(blocks) if start <= line <= end), None)
        if number is not None:
            by_block.setdefault(number, []).append((target, fix))
    lines = list(source.lines)
    config = _FileConfig.of(tree, source)
    for number in sorted(by_block, reverse=True):  # from the bottom, so earlier line numbers hold
        start, end = blocks[number]
        snippet = "".join(lines[start - 1 : end])
        try:
            parsed = cst.parse_module(snippet)
        except (cst.ParserSyntaxError, RecursionError):
            continue  # its reports say so: no twin, not rewritten
        # libcst's round trip is exact but for a final lone `\r`, which it drops; whatever it drops is put
        # back after the rewritten code. A snippet it changes elsewhere is left alone.
        lost = snippet[len(parsed.code) :] if snippet.startswith(parsed.code) else None
        if lost is None or lost.strip("\r\n"):
            continue
        module = config.pin(parsed)
        if any(isinstance(target, ast.Call) for target, _ in by_block[number]):
            from libcst.metadata import MetadataWrapper, PositionProvider  # 20 ms to import; rarely needed

            positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
        else:  # defs and statements: the statements' positions are enough, at a third of the cost
            positions = positions_of(module, statements=True)
        located = []
        for target, fix in by_block[number]:
            twin = _twin(target, positions, start - 1, source)
            if twin is not None:
                located.append((twin, fix, target))
        if not located:
            continue
        spans = [(positions[twin].start.line, positions[twin].end.line) for twin, _, _ in located]
        new_module, applier = apply_fixes(
            module, [(twin, fix) for twin, fix, _ in located], skip_statements_apart(spans, positions)
        )
        for twin, fix, target in located:
            result = applier.results.get(id(twin))
            if result is not None:
                # A statement's original is its lines; generating a def's code again costs a third of a parse.
                original = source.segment(target) if isinstance(target, ast.stmt) else module.code_for_node(twin)
                twins[id(fix)] = (original.strip(), node_code(result).strip())
        lines[start - 1 : end] = [new_module.code + lost]
    return "".join(lines), twins


def _twin(target: ast.AST, positions, offset: int, source: Source) -> cst.CSTNode | None:
    """The libcst node of the snippet (which starts after line `offset`) that `target` is."""
    line = target.lineno - offset
    if isinstance(target, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        kind = cst.ClassDef if isinstance(target, ast.ClassDef) else cst.FunctionDef
        return next(
            (
                node
                for node, where in positions.items()
                if isinstance(node, kind) and node.name.value == target.name and where.start.line == line
            ),
            None,
        )
    if isinstance(target, ast.Call):
        column = source.char_col(target.func.lineno, target.func.col_offset)
        func_line = target.func.lineno - offset
        return next(
            (
                node
                for node, where in positions.items()
                if isinstance(node, cst.Call)
                and (positions[node.func].start.line, positions[node.func].start.column) == (func_line, column)
            ),
            None,
        )
    if isinstance(target, ast.stmt):
        found = [
            node
            for node, where in positions.items()
            if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)) and where.start.line == line
        ]
        return found[-1] if found else None
    return None


@dataclass(frozen=True)
class _FileConfig:
    """The indentation and newline libcst would detect for the whole file. A snippet detects its own (from
    its first block and first line), and code a fix inserts is written with the snippet's: so where
    they differ the snippet's blocks and newlines are pinned to what they are and it gets the file's."""

    indent: str
    newline: str

    @classmethod
    def of(cls, tree: ast.Module, source: Source) -> _FileConfig:
        newline = LINE_BREAK.search(source.text)
        # A form feed in the first indentation is not indentation to the code libcst generates with it.
        indent = (_first_indent(tree, source) or "").replace("\f", "") or "    "
        return cls(indent, newline.group() if newline else "\n")

    def pin(self, module: cst.Module) -> cst.Module:
        if module.default_indent == self.indent and module.default_newline == self.newline:
            return module
        pinned = module.visit(_Pin(module.default_indent, module.default_newline))
        return pinned.with_changes(default_indent=self.indent, default_newline=self.newline)


def _first_indent(tree: ast.Module, source: Source) -> str | None:
    """libcst's default indent is its first INDENT token's: the first block, in source order, that does not
    sit on its header's line (a same-line `if x: pass` has none; its `else:` block may)."""
    for stmt in tree.body:
        found = _block_indent(stmt, source)
        if found is not None:
            return found
    return None


def _block_indent(stmt: ast.stmt, source: Source) -> str | None:
    if isinstance(stmt, ast.Match):  # `case` lines are always a block of their own
        line = source.lines[stmt.cases[0].pattern.lineno - 1]
        return line[: len(line) - len(line.lstrip(" \t\f"))]
    if not isinstance(stmt, _COMPOUND):
        return None
    blocks = [
        stmt.body,
        *(h.body for h in getattr(stmt, "handlers", ())),
        getattr(stmt, "orelse", []),
        getattr(stmt, "finalbody", []),
    ]
    for block in blocks:
        if not block:
            continue
        first = block[0]
        line = source.lines[first.lineno - 1]
        if (
            block is getattr(stmt, "orelse", None)
            and isinstance(first, ast.If)
            and line[first.col_offset :].startswith("elif")
        ):
            found = _block_indent(first, source)  # `elif`: a header of its own, at the `if`'s level
        elif not line[: first.col_offset].strip():
            found = line[: first.col_offset]
        else:
            found = None
        if found is not None:
            return found
    return None


class _Pin(cst.CSTTransformer):
    def __init__(self, indent: str, newline: str) -> None:
        super().__init__()
        self.indent, self.newline = indent, newline

    def leave_IndentedBlock(self, original_node, updated_node):
        return updated_node if updated_node.indent is not None else updated_node.with_changes(indent=self.indent)

    def leave_Newline(self, original_node, updated_node):
        return updated_node if updated_node.value is not None else updated_node.with_changes(value=self.newline)


# -- positions after an earlier stage changed the text ------------------------------------------------


def position_map(before: str, after: str):
    """A function from a (line, column) of `after` to where that code was in `before`, for findings made
    on text an earlier stage rewrote. Lines are aligned by a diff, and within a changed block each new
    line is paired with the most similar old one (an inserted `import torch_npu` pairs with nothing);
    columns are aligned by a diff of the two lines. Code that is new maps to where its block was."""
    old, new = Source(before).lines, Source(after).lines
    origin: dict[int, int] = {}
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag == "equal":
            origin.update((j1 + k + 1, i1 + k + 1) for k in range(j2 - j1))
            continue
        for k, index in enumerate(_pair_lines(old[i1:i2], new[j1:j2])):
            # An inserted line (nothing paired) belongs where its block was.
            origin[j1 + k + 1] = i1 + index + 1 if index is not None else max(min(i1 + 1, len(old)), 1)

    def where(line: int, col: int) -> tuple[int, int]:
        source_line = origin.get(line, line)
        if not (0 < line <= len(new) and 0 < source_line <= len(old)) or old[source_line - 1] == new[line - 1]:
            return source_line, col
        return source_line, _map_column(old[source_line - 1], new[line - 1], col)

    return where


def _pair_lines(old: list[str], new: list[str]) -> list[int | None]:
    """For each new line, the index of the old line it is a rewrite of (in order, one to one), or None."""
    paired: list[int | None] = []
    start = 0
    for line in new:
        best, best_ratio = None, 0.5  # less alike than this is not the same line rewritten
        for index in range(start, len(old)):
            ratio = difflib.SequenceMatcher(None, old[index], line, autojunk=False).ratio()
            if ratio > best_ratio:
                best, best_ratio = index, ratio
        paired.append(best)
        if best is not None:
            start = best + 1
    return paired


def _map_column(old: str, new: str, col: int) -> int:
    k = col - 1
    for tag, i1, _i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if j1 <= k < j2 or (k == j2 == len(new)):
            return (i1 + (k - j1) if tag == "equal" else i1) + 1
    return col
