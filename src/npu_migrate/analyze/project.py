"""What every part of the analysis shares: the settings, one parsed file, the facts found in it, a mode and
its result, the project the modes summarise, the analysis they make.

A leaf: it imports no mode and not the run, so the modes, the run (`core`) and the reports (`output`)
can all import it.
"""

from __future__ import annotations

import ast
import os
import re
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npu_migrate.files.source import parse_python, read_source
from npu_migrate.findings import Finding
from npu_migrate.program.api import NpuApi
from npu_migrate.program.names import Names

#: A line as `ast.get_source_segment` counts them: ended by \r\n, \r or \n (not by a form feed).
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")

#: Why a file that killed its worker process (`runner.run_each` retries it alone to find it) is not analysed.
WORKER_DIED = "the worker process died while analysing this file (a crash in the parser?)"


class AnalysisError(Exception):
    """Bad input the run cannot go on with (a missing path, an unreadable --api-files CSV): exit 2."""


@dataclass(frozen=True)
class Settings:
    modes: tuple[str, ...]
    enabled: frozenset[str]  # the codemod rules, as `apply` would select them
    #: The opt-in training levers `enabled` lacks: run apart, to list where they would act (`affinity_apis`).
    levers: frozenset[str] = frozenset()
    torch_npu_version: str | None = None
    env_paths: tuple[Path, ...] = ()
    api_files: tuple[Path, ...] = ()
    jobs: int | None = None


@dataclass
class Source:
    """One parsed file, as the mode scanners see it."""

    display: str  # relative to the analysed root, POSIX
    module: str | None  # dotted module name relative to the root
    text: str
    tree: ast.Module
    names: Names
    lines: list[str]
    #: The lines as `ast.get_source_segment` splits them, split once: that function splits the whole file
    #: on every call, which was a fifth of `analyze` on a large tree (#26).
    _ends: list[str] | None = field(default=None, repr=False, compare=False)

    def _segment(self, node: ast.AST) -> str:
        """`ast.get_source_segment(self.text, node) or ""`, without splitting the text again."""
        end_line, end_col = getattr(node, "end_lineno", None), getattr(node, "end_col_offset", None)
        if end_line is None or end_col is None or not hasattr(node, "lineno"):
            return ""
        if self._ends is None:
            self._ends = _LINE.findall(self.text)
        first, last, lines = node.lineno - 1, end_line - 1, self._ends
        if first == last:
            return lines[first].encode()[node.col_offset : end_col].decode()
        head = lines[first].encode()[node.col_offset :].decode()
        tail = lines[last].encode()[:end_col].decode()
        return "".join([head, *lines[first + 1 : last], tail])

    def pos(self, node: ast.AST) -> tuple[int, int]:
        """1-based line and column in characters, as the rule findings count them (ast counts UTF-8 bytes)."""
        line = node.lineno
        offset = node.col_offset
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        if not text.isascii():
            offset = len(text.encode("utf-8")[:offset].decode("utf-8", "replace"))
        return line, offset + 1

    def where(self, node: ast.AST) -> str:
        line, col = self.pos(node)
        return f"{self.display}:{line}:{col}"

    def segment(self, node: ast.AST, limit: int = 120) -> str:
        text = self._segment(node)
        text = " ".join(text.split())
        return text if len(text) <= limit else text[: limit - 3] + "..."


def package_of(module: str | None, display: str) -> str | None:
    if module is None:
        return None
    if display.endswith("__init__.py"):
        return module
    return module.rpartition(".")[0] or None


class Visitor(ast.NodeVisitor):
    """`ast.NodeVisitor`, the same walk in the same order, made cheaper for the modes' scanners (#26): they
    walk every node of every file, and the stdlib's `visit` builds the method name and looks it up on each
    node, and its `generic_visit` goes through the `iter_fields` generator. Here the method is looked up
    once per (scanner class, node class), `generic_visit` calls it itself (one call per node, not two),
    and the fields are read directly (`getattr` with a default is `iter_fields`' skip of a missing field).
    A node of no fields (`Load`, `Add`) whose visit would be this `generic_visit` is not visited at all:
    that visit does nothing. Subclasses define `visit_*` and may override `generic_visit`, not `visit`."""

    _methods: dict[type, Callable[[Any, ast.AST], Any]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "visit" in cls.__dict__:
            raise TypeError(f"{cls.__name__}: `generic_visit` does not go through `visit`; override `visit_*`")
        cls._methods = {}  # each class its own: a subclass may define other `visit_*`

    def _method(self, kind: type) -> Callable[[Any, ast.AST], Any]:
        method = self._methods.get(kind)
        if method is None:
            cls = type(self)
            method = getattr(cls, "visit_" + kind.__name__, None)
            if method is None or method is _STDLIB_CONSTANT and not _legacy_constants(cls):
                # The stdlib's `visit_Constant` only forwards to the deprecated `visit_Num` and the like.
                method = cls.generic_visit
            if method is Visitor.generic_visit and not kind._fields:
                method = _nothing
            self._methods[kind] = method
        return method

    def visit(self, node: ast.AST) -> Any:
        return self._method(node.__class__)(self, node)

    def generic_visit(self, node: ast.AST) -> None:
        methods = self._methods
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.AST):
                        method = methods.get(item.__class__) or self._method(item.__class__)
                        if method is not _nothing:
                            method(self, item)
            elif isinstance(value, ast.AST):
                method = methods.get(value.__class__) or self._method(value.__class__)
                if method is not _nothing:
                    method(self, value)


def _nothing(visitor: Visitor, node: ast.AST) -> None:
    """The visit of a node without fields that no `visit_*` wants: `generic_visit` of it does nothing."""


#: What `ast.NodeVisitor` defines as `visit_Constant` (None where the stdlib no longer has it).
_STDLIB_CONSTANT = getattr(ast.NodeVisitor, "visit_Constant", None)


def walk(node: ast.AST) -> Iterator[ast.AST]:
    """`ast.walk`: the same nodes in the same (breadth-first) order, without `iter_child_nodes`' generator
    per node (the scanners walk each function again for the names it assigns, #26)."""
    todo = deque([node])
    while todo:
        node = todo.popleft()
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, ast.AST):
                todo.append(value)
            elif isinstance(value, list):
                todo.extend(item for item in value if isinstance(item, ast.AST))
        yield node


def _legacy_constants(cls: type) -> bool:
    names = ("visit_Num", "visit_Str", "visit_Bytes", "visit_NameConstant", "visit_Ellipsis")
    return any(hasattr(cls, name) for name in names)


def parse(path: Path, display: str, module: str | None) -> Source:
    text = read_source(path).text
    tree = parse_python(text, display)
    return Source(display, module, text, tree, Names.of(tree, package_of(module, display)), text.splitlines())


@dataclass
class Context:
    """What every worker needs besides the file: sent once to each worker process."""

    settings: Settings
    library_unsupported: dict[str, str] = field(default_factory=dict)  # qualified name -> why
    library_rows: list[list[str]] = field(default_factory=list)  # full_unsupported_results.csv
    _api: NpuApi | None = None

    def __getstate__(self) -> dict:
        # Workers need the verdicts, not the report rows (thousands for a large library).
        return {**self.__dict__, "library_rows": [], "_api": None}

    @property
    def api(self) -> NpuApi:
        if self._api is None:
            self._api = NpuApi(self.settings.torch_npu_version)
        return self._api


@dataclass
class FileScan:
    display: str
    module: str | None
    findings: list[Finding] = field(default_factory=list)  # the codemod's, and those of the scanners
    error: str = ""
    facts: dict[str, Any] = field(default_factory=dict)  # mode name -> what its scanner found in this file
    lines: int = 0

    @property
    def scanner_findings(self) -> list[Finding]:
        """The analysis findings the scanners found in this file (every scanner's, whatever the modes)."""
        return [f for facts in self.facts.values() for f in facts.get("findings", ())]


@dataclass(frozen=True)
class Task:
    path: Path
    display: str
    module: str | None
    ignore: tuple[str, ...] = ()


@dataclass
class Table:
    """One CSV of the report (and one table of the markdown/HTML reports)."""

    name: str  # file name, e.g. "unsupported_api.csv"
    title: str
    header: list[str]
    rows: list[list[Any]]
    #: Rows nobody acts on (an API that runs on the NPU as it is): the HTML report folds them away; the CSV
    #: and report.json keep every row.
    routine: Callable[[list[Any]], bool] | None = None


@dataclass
class ModeResult:
    mode: str
    title: str
    findings: list[Finding] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)  # terminal lines
    data: dict[str, Any] = field(default_factory=dict)  # the mode's section of report.json


@dataclass(frozen=True)
class Mode:
    """One analysis mode: what it finds in each file, and what it makes of the whole project.

    Every registered mode's `scan` runs on every Python file whatever modes were asked for (they are cheap,
    and some facts serve several modes); `collect` runs for the modes asked for and those they read.
    """

    name: str  # as on the command line and in report.json; also the name of its module under `modes/`
    title: str
    #: Per file, in a worker process: picklable facts (a dict; its "findings" are the file's), or None.
    scan: Callable[[Source, Context], Any]
    #: Over the project, once the files are scanned: fills in the mode's result.
    collect: Callable[[Project, ModeResult], None]
    #: The modes whose results `collect` reads (`project.result(name)`): computed before it.
    reads: tuple[str, ...] = ()
    #: Before the files are scanned, in the main process: what the workers need in the context.
    prepare: Callable[[Context], None] | None = None


@dataclass
class Project:
    root: Path
    settings: Settings
    context: Context | None
    files: list[FileScan]
    paths: list[Path]  # what the user gave
    respect_gitignore: bool = True
    results: dict[str, ModeResult] = field(default_factory=dict)  # mode name -> result, in the order computed

    def facts(self, name: str) -> Iterator[tuple[FileScan, Any]]:
        for scan in self.files:
            if name in scan.facts:
                yield scan, scan.facts[name]

    def result(self, mode: str) -> ModeResult:
        """The result of a mode the calling mode declares in its `reads` (so it is computed first)."""
        try:
            return self.results[mode]
        except KeyError:
            raise LookupError(f"the {mode} result is read before it is computed: declare it in `reads`") from None

    @property
    def rule_findings(self) -> list[Finding]:
        return [f for scan in self.files for f in scan.findings]


@dataclass
class Analysis:
    root: Path
    settings: Settings
    results: list[ModeResult]
    files: list[FileScan]
    errors: list[tuple[str, str]]  # (path, reason)
    torch_npu_version: str

    def shown(self, path: str) -> str:
        """A root-relative `path` (a finding's, a file's) as `apply` shows the same file from the current
        folder (`cli.shared.display`): relative to it when the root is under it, else root-relative, which
        `path` already is. What people read is shown so (the text, CSV, markdown and HTML reports); module
        names, report.json (which names the root) and SARIF (its base URI is the root) keep the root-relative
        path."""
        if not path or Path(path).is_absolute():
            return path
        try:
            prefix = self.root.relative_to(Path.cwd().resolve())
        except ValueError:
            return path
        return (prefix / path).as_posix()

    @property
    def findings(self) -> list[Finding]:
        seen: dict[tuple, Finding] = {}
        for result in self.results:
            for f in result.findings:
                seen.setdefault((f.path, f.line, f.col, f.rule_id, f.message), f)
        return sorted(seen.values(), key=finding_key)


# --- paths ------------------------------------------------------------------------------------------


def finding_key(f: Finding) -> tuple[str, int, int, str]:
    """A finding's place in a report: by file, position, then rule."""
    return f.path, f.line, f.col, f.rule_id


def location_key(location: str) -> tuple[str, int, int]:
    """`path:line:col` as a sort key: lines and columns in numeric order."""
    path, line, col = location.rsplit(":", 2)
    return path, int(line), int(col)


def common_root(paths: list[Path]) -> Path:
    dirs = [p.resolve() if p.is_dir() else p.resolve().parent for p in paths]
    return Path(os.path.commonpath([str(d) for d in dirs]))


def relative(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


def module_name(display: str) -> str | None:
    if not display.endswith(".py"):
        return None
    parts = display[:-3].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if not parts or not all(p.isidentifier() for p in parts):
        return None
    return ".".join(parts)
