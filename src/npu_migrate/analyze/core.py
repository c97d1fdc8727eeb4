"""The analysis run: find the files, scan each once (in worker processes), then let each mode summarise.

Per file, `scan_file` does two things. It runs the codemod's own pipeline (`pipeline.process` in DIFF
mode, exactly what `apply --diff` runs), so the rule findings of a report are the findings `apply`
reports, byte for byte. Then it parses the file once with `ast` and hands the tree to every mode's
`scan`, which returns plain picklable facts. The modes' `collect` functions turn the facts of the whole
tree into findings, tables (the CSVs) and report sections. Every scanner runs whatever modes were asked
for, because they are cheap and some facts serve several modes (a sync in a loop is model-mode memory
advice and torch_apis performance advice); the modes only choose what is reported.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npu_migrate.findings import Finding
from npu_migrate.names import Names
from npu_migrate.pipeline import Job, Mode, Plan, Status, process
from npu_migrate.source import SourceError, parse_python, read_source

MODES = ("torch_apis", "third_party", "custom_kernels", "affinity_apis", "dynamic_shape", "model")

#: Below this many files a process pool costs more to start than it saves (as in `runner`).
INLINE_LIMIT = 8


class AnalysisError(Exception):
    """Bad input the run cannot go on with (a missing path, an unreadable --api-files CSV): exit 2."""


@dataclass(frozen=True)
class Settings:
    modes: tuple[str, ...]
    enabled: frozenset[str]  # the codemod rules, as `apply` would select them
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
        text = ast.get_source_segment(self.text, node) or ""
        text = " ".join(text.split())
        return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class Context:
    """What every worker needs besides the file: set once per worker process."""

    settings: Settings
    library_unsupported: dict[str, str] = field(default_factory=dict)  # qualified name -> why
    library_rows: list[list[str]] = field(default_factory=list)  # full_unsupported_results.csv
    _api: Any = None

    def __getstate__(self) -> dict:
        # Workers need the verdicts, not the report rows (thousands for a large library).
        return {**self.__dict__, "library_rows": [], "_api": None}

    @property
    def api(self):
        if self._api is None:
            from npu_migrate.api import NpuApi

            self._api = NpuApi(self.settings.torch_npu_version)
        return self._api


@dataclass
class FileScan:
    display: str
    module: str | None
    findings: list[Finding] = field(default_factory=list)  # the codemod's, and those of the scanners
    error: str = ""
    facts: dict[str, Any] = field(default_factory=dict)  # scanner name -> its facts about this file
    lines: int = 0


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


@dataclass
class ModeResult:
    mode: str
    title: str
    findings: list[Finding] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)  # terminal lines
    data: dict[str, Any] = field(default_factory=dict)  # the mode's section of report.json


@dataclass
class Project:
    root: Path
    settings: Settings
    context: Context
    files: list[FileScan]
    paths: list[Path]  # what the user gave
    respect_gitignore: bool = True

    def facts(self, name: str) -> Iterator[tuple[FileScan, Any]]:
        for scan in self.files:
            if name in scan.facts:
                yield scan, scan.facts[name]

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

    @property
    def findings(self) -> list[Finding]:
        seen: dict[tuple, Finding] = {}
        for result in self.results:
            for f in result.findings:
                seen.setdefault((f.path, f.line, f.col, f.rule_id, f.message), f)
        return sorted(seen.values(), key=lambda f: (f.path, f.line, f.col, f.rule_id))


# --- worker side ------------------------------------------------------------------------------------

_CONTEXT: Context | None = None


def _init_worker(context: Context) -> None:
    global _CONTEXT
    _CONTEXT = context


def _scanners() -> dict[str, Callable[[Source, Context], Any]]:
    from npu_migrate.analyze import affinity, custom_kernels, dynamic_shape, model, third_party, torch_apis

    return {
        "torch_apis": torch_apis.scan,
        "third_party": third_party.scan,
        "custom_kernels": custom_kernels.scan,
        "affinity_apis": affinity.scan,
        "dynamic_shape": dynamic_shape.scan,
        "model": model.scan,
    }


def package_of(module: str | None, display: str) -> str | None:
    if module is None:
        return None
    if display.endswith("__init__.py"):
        return module
    return module.rpartition(".")[0] or None


def parse(path: Path, display: str, module: str | None) -> Source:
    text = read_source(path).text
    tree = parse_python(text, display)
    return Source(display, module, text, tree, Names.of(tree, package_of(module, display)), text.splitlines())


def scan_file(task: Task) -> FileScan:
    context = _CONTEXT
    assert context is not None, "scan_file runs after _init_worker"
    settings = context.settings
    plan = Plan(settings.enabled, settings.torch_npu_version, Mode.DIFF)
    result = process(Job(task.path, task.display, ignore=task.ignore), plan)
    scan = FileScan(task.display, task.module, findings=list(result.findings))
    if result.status is Status.FAILED:
        scan.error = result.error
        return scan
    if task.path.suffix != ".py":
        return scan  # notebooks, launch scripts, CUDA sources: the rules' findings are all there is
    try:
        source = parse(task.path, task.display, task.module)
    except SourceError as exc:
        scan.error = str(exc)
        return scan
    scan.lines = len(source.lines)
    for name, scanner in _scanners().items():
        try:
            facts = scanner(source, context)
        except RecursionError:
            scan.error = "too deeply nested to analyse (recursion limit)"
            return scan
        if facts:
            scan.facts[name] = facts
    return scan


def parallel(fn: Callable, items: list, context: Context, jobs: int | None) -> Iterable:
    """`map(fn, items)` over worker processes that share `context`; in order."""
    workers = jobs or _default_jobs()
    if workers <= 1 or len(items) < INLINE_LIMIT:
        _init_worker(context)
        return list(map(fn, items))
    chunksize = max(1, min(16, len(items) // (workers * 8)))
    with ProcessPoolExecutor(max_workers=workers, initializer=_init_worker, initargs=(context,)) as pool:
        return list(pool.map(fn, items, chunksize=chunksize))


def _default_jobs() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


# --- driver side ------------------------------------------------------------------------------------


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


def analyse(
    paths: list[Path],
    settings: Settings,
    *,
    ignored_for: Callable[[str], tuple[str, ...]] = lambda _: (),
    excludes: list[tuple[str, Path]] | None = None,
    respect_gitignore: bool = True,
) -> Analysis:
    """Analyse `paths` (files or folders) in the chosen modes."""
    from npu_migrate.analyze import MODE_MODULES, third_party
    from npu_migrate.discovery import discover

    for given in (*paths, *settings.env_paths):
        if not given.exists():
            raise AnalysisError(f"{given}: no such file or directory")
    root = common_root(paths)
    context = Context(settings)
    _ = context.api  # an unknown --torch-npu-version fails here, before any work
    if settings.env_paths:
        context.library_unsupported.update(third_party.library_unsupported(settings, context))
    for csv_path in settings.api_files:
        context.library_unsupported.update(third_party.read_api_file(csv_path))

    from npu_migrate.kinds import kind_of

    # Every file `apply` migrates (scripts, notebooks, CUDA sources too), so the rule findings are its findings.
    found = discover(paths, lambda p: kind_of(p) is not None, excludes=excludes, respect_gitignore=respect_gitignore)
    tasks = []
    for path in found.files:
        display = relative(path, root)
        tasks.append(Task(path, display, module_name(display), ignored_for(display)))
    files = list(parallel(scan_file, tasks, context, settings.jobs))
    errors = list(found.errors) + [(f.display, f.error) for f in files if f.error]
    project = Project(root, settings, context, files, list(paths), respect_gitignore)
    results = [MODE_MODULES[mode].collect(project) for mode in settings.modes]
    return Analysis(root, settings, results, files, errors, context.api.version)
