"""One file through the migration: read -> prefilter -> parse -> rules -> fixes -> validate -> diff/write.

Everything here runs inside a worker process, so it takes and returns plain picklable data.
"""

from __future__ import annotations

import ast
import difflib
import enum
import gc
import importlib
import re
import signal
import stat
import sys
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from npu_migrate.engine import markers
from npu_migrate.files import kinds, notebooks
from npu_migrate.files.source import SourceError, SourceFile, atomic_write, decode_source, parse_python, read_source
from npu_migrate.findings import Finding
from npu_migrate.program.api import DEFAULT_TARGET, NpuApi, PortableApi
from npu_migrate.program.packages import MODULE, proven_module, usable_module

# The rules, libcst and what works on its trees are imported where a file first needs them: a file no
# checker may want (`markers.may_match`) is answered without them (start-up of `apply --check`, #16).
if TYPE_CHECKING:
    import libcst as cst

    from npu_migrate.engine.checkers import Checker


class Status(str, enum.Enum):
    UNCHANGED = "unchanged"
    CHANGED = "changed"
    FAILED = "failed"


class Mode(str, enum.Enum):
    DIFF = "diff"  # report and diff only; write nothing (--diff, --check, analyze)
    IN_PLACE = "in-place"
    OUTPUT = "output"  # write migrated files into an output tree


@dataclass(frozen=True)
class Job:
    path: Path  # where to read
    display: str  # how to name it to the user and in diffs (relative, POSIX)
    destination: Path | None = None  # where to write in OUTPUT mode
    ignore: tuple[str, ...] = ()  # rule ids or prefixes switched off for this file (per-file-ignores)
    dirty: bool = False  # has uncommitted changes in git, and --force was not given
    #: The package's fused-helper module as the file's path allows it to import it (`.._npu_fused`): an upper
    #: bound, which the worker lowers to what the file proves; None: a file of no package (or run as a
    #: script), which gets the helpers written into it.
    helper_module: str | None = None


@dataclass
class FileResult:
    display: str
    status: Status
    findings: list[Finding] = field(default_factory=list)
    diff: str = ""
    error: str = ""
    parsed: bool = False
    #: The helper module the file, as written, imports (`Job.helper_module` or, where the file proves less,
    #: one lower: `helper_location.proven_module`), and the names it imports from it: what it must define.
    helper_module: str | None = None
    helper_imports: tuple[str, ...] = ()


@dataclass(frozen=True)
class Plan:
    """What every worker needs to know: the enabled rules, the torch_npu version, the mode."""

    enabled: frozenset[str] | None  # the ids of the selected rules; None: every rule (read when a file needs it)
    torch_npu_version: str | None
    mode: Mode
    annotate: bool = False  # insert `# TODO(npu-migrate ...)` above open findings
    timeout: float | None = None  # seconds per file; a file that takes longer fails and is left alone
    output_root: Path | None = None  # OUTPUT mode: nothing may be written outside it
    target: str = DEFAULT_TARGET  # `api.TARGETS`: what the code is migrated to
    torch_version: str | None = None  # the portable target's torch version (`torch_accelerator.toml`)

    def enabled_for(self, job_ignore: tuple[str, ...]) -> frozenset[str]:
        enabled = self.enabled
        if enabled is None:
            from npu_migrate.engine.registry import select_rules

            enabled = select_rules(target=self.target)
        if not job_ignore:
            return enabled
        return frozenset(r for r in enabled if not any(r.startswith(code) for code in job_ignore))


_ENGINE = (
    "npu_migrate.engine.registry",
    "npu_migrate.engine.scoped",
    "npu_migrate.engine.context",
    "npu_migrate.engine.textfiles",
)


#: Set by the runner for the processes it runs files in (`runner._collector_for_files`, its workers).
FREEZE_AFTER_IMPORT = False


def _import_engine() -> None:
    """Import the rules and libcst, the first time a file needs them, with the file's time limit (--timeout,
    an itimer) paused: the file must neither pay for the import nor be interrupted in the middle of it."""
    if all(name in sys.modules for name in _ENGINE):
        return
    timed = hasattr(signal, "setitimer") and _in_main_thread()
    left, _ = signal.setitimer(signal.ITIMER_REAL, 0) if timed else (0.0, 0.0)
    try:
        for name in _ENGINE:
            importlib.import_module(name)
        # What the imports made (libcst's grammar, the rules and their tables) lives as long as the process:
        # out of the collector's way, so that its full runs walk the files' trees only (#26). Only in a run
        # of the tool's own (`runner`): a program that calls the engine as a library keeps its collector,
        # which would otherwise never free a cycle of the objects it had alive at that moment.
        if FREEZE_AFTER_IMPORT:
            gc.freeze()
    finally:
        if left > 0:
            signal.setitimer(signal.ITIMER_REAL, left)


def _checkers(enabled: frozenset[str]) -> list[type[Checker]]:
    from npu_migrate.engine.registry import all_checkers

    return [c for c in all_checkers() if any(r.id in enabled for r in c.rules)]


_GIT_LINE = re.compile(r"[^\n]*\n|[^\n]+\Z")


def unified_diff(display: str, before: str, after: str, *, new_file: bool = False) -> str:
    """A patch that `git apply` and `patch -p1` accept, newline style and missing final newline included.
    Lines are what git calls lines: ended by `\n` only (a `\r\n` keeps its `\r`; a form feed or a lone
    `\r` is inside a line), not what `str.splitlines` breaks at. A `new_file` comes from /dev/null."""
    a_lines = _GIT_LINE.findall(before)
    b_lines = _GIT_LINE.findall(after)
    out = []
    origin = "/dev/null" if new_file else f"a/{display}"
    for line in difflib.unified_diff(a_lines, b_lines, origin, f"b/{display}", n=3):
        out.append(line)
        if not line.endswith("\n"):
            out.append("\n\\ No newline at end of file\n")
    return "".join(out)


def migrate_source(
    source: SourceFile,
    display: str,
    plan: Plan,
    api: NpuApi,
    job_ignore: tuple[str, ...] = (),
    helper_module: str | None = None,
    file: Path | None = None,
) -> tuple[str, list[Finding], bool]:
    """The migrated text of one file, its findings, and whether any rule looked into it; the fused-op
    helpers are imported from `helper_module` if given. `file` is where it lies on disk (None: nowhere
    known), which rules read for what the display name cannot say (whether it is a package's module).
    Raises SourceError for unparsable input."""
    text = source.text
    if not markers.may_match(text):
        return text, [], False
    _import_engine()
    from npu_migrate.engine import scoped
    from npu_migrate.engine.astindex import AstIndex, text_words
    from npu_migrate.engine.checkers import TreeChecker

    enabled = plan.enabled_for(job_ignore)
    # The prefilter: a checker whose markers are all absent cannot match, so the file is not parsed for it.
    checkers = _checkers(enabled)
    active = [checker for checker in checkers if any(m in text for m in checker.markers)]
    if not active:
        return text, [], False
    words = text_words(text)
    active = [checker for checker in active if checker.wants_words(words)]
    if not active:
        return text, [], False
    tree = parse_python(text, display)
    index = AstIndex.of(tree)
    active = [checker for checker in active if checker.wants(index)]
    if not active:
        return text, [], False
    on_tree = [c for c in active if issubclass(c, TreeChecker)]
    on_cst = [c for c in active if not issubclass(c, TreeChecker)]
    new_text, findings = text, []
    if on_cst:
        on_cst += [c for c in checkers if c.follows_others]
        # The helper module the libcst rules' helpers go to (NPU411's), as the fused rules decide it.
        module = usable_module(helper_module, tree) if helper_module is not None else None
        new_text, findings = _migrate_cst(text, display, plan, api, enabled, on_cst, file, module)
    if on_tree:
        if new_text != text:
            tree = validate(new_text, display)
            index = AstIndex.of(tree)
        tree_text, tree_findings = scoped.run(
            on_tree,
            tree,
            scoped.Source(new_text, helper_module, file),
            display,
            enabled,
            api,
            index=index,
            annotate=plan.annotate,
        )
        if new_text != text:  # their positions are in the text the libcst rules rewrote
            where = scoped.position_map(text, new_text)
            tree_findings = [replace(f, **dict(zip(("line", "col"), where(f.line, f.col)))) for f in tree_findings]
        new_text = tree_text
        findings += tree_findings
    findings.sort(key=lambda f: (f.line, f.col, f.rule_id))
    return new_text, findings, True


def _migrate_cst(
    text: str,
    display: str,
    plan: Plan,
    api: NpuApi,
    enabled: frozenset[str],
    active: list[type[Checker]],
    file: Path | None = None,
    helper_module: str | None = None,
) -> tuple[str, list[Finding]]:
    """The libcst checkers' part: parse, visit, decide, fix, all on the whole module."""
    import libcst as cst

    from npu_migrate.engine.context import FileContext
    from npu_migrate.engine.fixes import apply_fixes, node_code
    from npu_migrate.engine.lines import StatementIndex, Suppressions, line_of, source_lines, todo_edits
    from npu_migrate.engine.positions import positions_of

    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError as exc:
        raise SourceError(f"syntax error at line {exc.raw_line}, column {exc.raw_column}: {exc.message}") from None
    except RecursionError:
        raise SourceError("too deeply nested for the parser (recursion limit)") from None
    ctx = FileContext(module, display, api, text, file=file, helper_module=helper_module)
    visitors = [checker(ctx, enabled) for checker in active]
    cst.visit_batched(module, visitors)
    for visitor in visitors:
        visitor.finish()
    if not ctx.pending:
        return text, []

    # Positions for what can be reported, plus every statement when comments or TODOs need them, plus
    # the top-level statements to know which of them hold something to fix.
    needs_statements = plan.annotate or Suppressions.may_have(text)
    decorators = [stmt.decorators[0] for stmt in module.body if getattr(stmt, "decorators", None)]
    positions = positions_of(module, [*ctx.located_nodes(), *module.body, *decorators], statements=needs_statements)
    statement_index: list[StatementIndex] = []

    def statements() -> StatementIndex:
        if not statement_index:
            statement_index.append(StatementIndex(positions))
        return statement_index[0]

    suppressions = Suppressions.scan(text, statements)
    if suppressions.ranges:
        ctx.suppress(lambda node, rule_id: suppressions.covers(line_of(positions, node), rule_id))

    def line_anywhere(node: cst.CSTNode) -> int:
        # A veto names the line that blocks it, which may be a node no finding is reported at.
        if node not in positions:
            positions.update(positions_of(module, [node]))
        return line_of(positions, node)

    ctx.resolve_plans(line_anywhere)
    for visitor in visitors:
        visitor.finalize()
    if not ctx.reports:
        return text, []
    if plan.annotate:
        open_findings = ((r.rule.id, r.message, line_of(positions, r.node)) for r in ctx.reports if r.actionable)
        ctx.edits += todo_edits(open_findings, source_lines(text), statements(), lambda s: line_of(positions, s))

    fixes = [(r.node, r.fix) for r in ctx.reports if r.applied and r.fix is not None] + ctx.edits
    new_module, applier = apply_fixes(module, fixes, _skip_unfixed(module, fixes, positions))
    # Findings only, no fix: libcst prints a module it parsed back as it was read, so it is not printed (#26).
    new_text = text if new_module is module else new_module.code
    changed = new_text != text
    findings = []
    for report in ctx.reports:
        pos = positions.get(report.node)
        line, col = (pos.start.line, pos.start.column + 1) if pos else (1, 1)
        replacement = applier.results.get(id(report.node))
        # A module-level edit (an added import) would quote the whole file: its message says it.
        quoted = report.node is not module
        findings.append(
            report.finding(
                display,
                line,
                col,
                changed=changed,
                original=ctx.code(report.node).strip() if report.applied and quoted else "",
                replacement=node_code(replacement).strip() if replacement is not None and quoted else "",
            )
        )
    return new_text, findings


def _skip_unfixed(module: cst.Module, fixes, positions):
    """The fix pass's `skip`: top-level statements (their positions are known) with no fixed node inside.
    A fix of the module itself (an added import) is applied when the walk leaves it, whatever is skipped."""
    from npu_migrate.engine.fixes import skip_statements_apart

    spans = []
    for node, _ in fixes:
        if node is module:
            continue
        where = positions.get(node)
        if where is None:
            return None  # somewhere unknown: walk everything
        spans.append((where.start.line, where.end.line))
    return skip_statements_apart(spans, positions)


def migrate_file(
    source: SourceFile,
    display: str,
    plan: Plan,
    api: NpuApi,
    kind: str,
    job_ignore: tuple[str, ...] = (),
    helper_module: str | None = None,
    file: Path | None = None,
) -> tuple[str, list[Finding], bool]:
    """Any supported file: Python through libcst, notebooks cell by cell, the rest as text. A Python file
    of a package imports the fused-op helpers from `helper_module`; `file` is where it lies (`migrate_source`)."""
    if kind == kinds.NOTEBOOK:
        return _migrate_notebook(source, display, plan, api, job_ignore)
    if kind in kinds.TEXT_KINDS:
        _import_engine()
        from npu_migrate.engine.registry import text_checkers
        from npu_migrate.engine.textfiles import apply_reports

        enabled = plan.enabled_for(job_ignore)
        reports = [
            r for c in text_checkers() if kind in c.kinds for r in c(enabled, plan.target).check(source.text, kind)
        ]
        new_text, findings = apply_reports(source.text, reports, display)
        return new_text, findings, False
    return migrate_source(source, display, plan, api, job_ignore, helper_module, file)


def helper_imports(text: str, tree: ast.Module | None, helper_module: str | None) -> tuple[str | None, tuple[str, ...]]:
    """The helper module `text` (whose tree is `tree`, if parsed) imports, as far up as `helper_module` and
    the file itself allow (`proven_module`), and the names it imports from it."""
    if helper_module is None or MODULE not in text:
        return None, ()
    from npu_migrate.transforms.fused.helpers import imported_helpers  # imports libcst: only where needed

    if tree is None:
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None, ()
    module = proven_module(helper_module, tree)
    return module, tuple(imported_helpers(tree, module)) if module else ()


def _migrate_notebook(source, display, plan, api, job_ignore):

    notebook = notebooks.load(source.text, display)
    module, indexes, magics = notebooks.join_cells(notebook)
    cells = SourceFile(path=source.path, raw=module.encode("utf-8"), text=module, encoding="utf-8")
    try:
        new_module, findings, parsed = migrate_source(cells, display, plan, api, job_ignore)
    except SourceError as exc:
        raise SourceError(f"code cells: {exc}") from None
    where = notebooks.cell_lines(module)
    findings = [
        replace(
            f,
            line=where[f.line][1] if f.line < len(where) else f.line,
            message=f"cell {where[f.line][0]}: {f.message}" if f.line < len(where) else f.message,
        )
        for f in findings
    ]
    if new_module == module:
        return source.text, findings, parsed
    sources = notebooks.split_cells(new_module, indexes, magics, notebook)
    return notebooks.dump(notebook, sources, source.text), findings, parsed


def validate(text: str, display: str, kind: str = kinds.PYTHON) -> ast.Module | None:
    """Never write code that does not parse: an engine bug must fail the file, not corrupt it. Returns
    the tree of Python code."""
    if kind == kinds.NOTEBOOK:
        notebooks.validate(text)
        return None
    if kind != kinds.PYTHON:
        return None  # text edits replace whole tokens only; there is no parser to ask
    try:
        return ast.parse(text, filename=display)
    except SyntaxError as exc:
        raise SourceError(
            f"internal error: the migrated code does not parse ({exc.msg}, line {exc.lineno}); file left untouched"
        ) from None


class FileTimeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise FileTimeout


def process(job: Job, plan: Plan, seen: list[bytes] | None = None) -> FileResult:
    """One file, with the per-file time limit (SIGALRM, so only where signals are available). The bytes
    read are appended to `seen`, if given: what the result was computed from (the cache's key)."""
    use_alarm = plan.timeout is not None and hasattr(signal, "setitimer") and _in_main_thread()
    if use_alarm:
        previous = signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, plan.timeout)
    try:
        return _process(job, plan, seen)
    except FileTimeout:
        return FileResult(
            job.display, Status.FAILED, error=f"took longer than {plan.timeout:g} s (--timeout); file left untouched"
        )
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _process(job: Job, plan: Plan, seen: list[bytes] | None = None) -> FileResult:
    try:
        source = read_source(job.path)
        if seen is not None:
            seen.append(source.raw)
        api = api_for(plan)
        kind = kinds.kind_of(job.path) or kinds.PYTHON
        helper_module = job.helper_module if kind == kinds.PYTHON else None
        new_text, findings, parsed = migrate_file(
            source, job.display, plan, api, kind, job.ignore, helper_module, job.path
        )
        if new_text == source.text:
            if plan.mode is Mode.OUTPUT and job.destination is not None:
                write_output(job.destination, source.raw, plan.output_root, like=job.path)
            module, imports = helper_imports(source.text, None, helper_module)
            return FileResult(
                job.display, Status.UNCHANGED, findings, parsed=parsed, helper_module=module, helper_imports=imports
            )
        tree = validate(new_text, job.display, kind)
        module, imports = helper_imports(new_text, tree, helper_module)
        diff = unified_diff(job.display, source.text, new_text)
        data = source.encode(new_text)
        if plan.mode is Mode.IN_PLACE:
            if job.dirty:
                raise SourceError(
                    "has uncommitted changes; commit or stash them first so git can undo the migration "
                    "(or pass --force)"
                )
            atomic_write(job.path, data, expected=source.raw)
        elif plan.mode is Mode.OUTPUT and job.destination is not None:
            write_output(job.destination, data, plan.output_root, like=job.path)
        return FileResult(
            job.display, Status.CHANGED, findings, diff=diff, parsed=True, helper_module=module, helper_imports=imports
        )
    except SourceError as exc:
        return FileResult(job.display, Status.FAILED, error=str(exc))
    except FileTimeout:
        raise
    except RecursionError:
        return FileResult(job.display, Status.FAILED, error="too deeply nested (recursion limit); file left untouched")
    except Exception as exc:  # a bug in a rule must cost one file, never the run
        return FileResult(
            job.display, Status.FAILED, error=f"internal error ({type(exc).__name__}: {exc}); file left untouched"
        )


def write_output(destination: Path, data: bytes, root: Path | None, like: Path | None = None) -> None:
    """Write into the output tree, never through a symlink that leads out of it; the copy of a source
    file (`like`) takes its mode bits."""
    if root is not None:
        resolved_root = root.resolve()
        parent = destination.parent.resolve()
        if parent != resolved_root and resolved_root not in parent.parents:
            raise SourceError(f"output folder {destination.parent} leads outside {root} (symlink); not written")
    mode = None
    if like is not None:
        try:
            mode = stat.S_IMODE(like.stat().st_mode)
        except OSError:
            pass  # the source just read went away: the output keeps a new file's mode
    atomic_write(destination, data, mode=mode)


_API_CACHE: dict[tuple, NpuApi] = {}


def api_for(plan: Plan) -> NpuApi:
    """What the rules consult for this plan's target and versions (raises UnknownVersionError)."""
    key = (plan.target, plan.torch_npu_version, plan.torch_version)
    if key not in _API_CACHE:
        portable = plan.target == "portable"
        _API_CACHE[key] = PortableApi(*key[1:]) if portable else NpuApi(plan.torch_npu_version)
    return _API_CACHE[key]


def migrate_text(
    text: str,
    *,
    path: str = "<string>",
    select: list[str] | None = None,
    ignore: list[str] | None = None,
    torch_npu_version: str | None = None,
    annotate: bool = False,
    target: str = DEFAULT_TARGET,
    torch_version: str | None = None,
    helper_module: str | None = None,
) -> tuple[str, list[Finding]]:
    """Migrate text in memory: the Python API used by tests, `analyze` and editors. `path` (its name)
    decides the file kind: Python unless it names a notebook, a launch script or another known kind. With
    `helper_module` (`helper_modules.helper_module`), fused-op helpers are imported from there."""
    from npu_migrate.engine.registry import select_rules

    plan = Plan(
        select_rules(select, ignore, target),
        torch_npu_version,
        Mode.DIFF,
        annotate=annotate,
        target=target,
        torch_version=torch_version,
    )
    source = decode_source(Path(path), text.encode("utf-8"))
    kind = kinds.kind_of(Path(path)) or kinds.PYTHON  # "<string>" and other unknown names are Python
    helper_module = helper_module if kind == kinds.PYTHON else None
    new_text, findings, _ = migrate_file(source, path, plan, api_for(plan), kind, (), helper_module, Path(path))
    if new_text != text:
        validate(new_text, path, kind)
    return new_text, findings
