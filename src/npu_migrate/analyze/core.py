"""The analysis run: find the files, scan each once (in worker processes), then let each mode summarise.

Per file, `scan_file` does two things. It runs the codemod's own pipeline (`pipeline.process` in DIFF
mode, exactly what `apply --diff` runs), so the rule findings of a report are the findings `apply`
reports, byte for byte. Then it parses the file once with `ast` and hands the tree to every registered
mode's `scan`, which returns plain picklable facts. With a result cache (`engine/cache.py`), the rules'
part of an unchanged file is read from it. A file of no package shares its entry with `apply --diff`; a
package's files do not (`apply` migrates them importing the package's helper module, `analyze` with the
helpers inline), so a first `analyze` after `apply` computes those again. The modes' scans are not cached:
a warm `analyze` still parses and scans every file. The modes' `collect` turn the facts of the whole tree
into findings, tables (the CSVs) and report sections, each once, in the order their `reads` require.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from npu_migrate.analyze import REGISTRY
from npu_migrate.analyze.project import (
    WORKER_DIED,
    Analysis,
    AnalysisError,
    Context,
    FileScan,
    Mode,
    ModeResult,
    Project,
    Settings,
    Task,
    common_root,
    module_name,
    parse,
    relative,
)
from npu_migrate.engine import runner
from npu_migrate.engine.pipeline import FileResult, Job, Plan, Status, process
from npu_migrate.engine.pipeline import Mode as PipelineMode
from npu_migrate.files.discovery import discover
from npu_migrate.files.kinds import kind_of
from npu_migrate.files.source import SourceError

if TYPE_CHECKING:
    from npu_migrate.engine.cache import Cache


def _plan(settings: Settings) -> Plan:
    from npu_migrate.engine.registry import select_rules

    # Every rule is `None` to `apply` (see `Plan`): spelt the same, the two commands can share entries.
    enabled = None if settings.enabled == select_rules() else settings.enabled
    return Plan(enabled, settings.torch_npu_version, PipelineMode.DIFF)


def scan_file(task: Task, context: Context, cache: Cache | None = None) -> FileScan:
    settings = context.settings
    plan = _plan(settings)
    job = Job(task.path, task.display, ignore=task.ignore)
    result = _rules(job, plan, cache) if cache is not None else process(job, plan)
    scan = FileScan(task.display, task.module, findings=list(result.findings))
    if settings.levers and result.status is not Status.FAILED:
        # Apart from `findings`, which are exactly what `apply` reports with the user's selection.
        levers = Plan(settings.levers, settings.torch_npu_version, PipelineMode.DIFF)
        found = process(Job(task.path, task.display, ignore=task.ignore), levers).findings
        scan.facts["levers"] = {"opt_in": list(found)}  # not "findings": no finding of the report
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
    for name, mode in REGISTRY.items():
        try:
            facts = mode.scan(source, context)
        except RecursionError:
            scan.error = "too deeply nested to analyse (recursion limit)"
            return scan
        if facts:
            scan.facts[name] = facts
    return scan


def _rules(job: Job, plan: Plan, cache: Cache) -> FileResult:
    from npu_migrate.engine.cache import read_for_key

    raw = read_for_key(job.path)
    result = cache.get(cache.key(job, raw)) if raw is not None else None
    return result if result is not None else runner.process_and_store(job, (plan, cache))


def _scan_cached(task: Task, context: tuple[Context, Cache]) -> FileScan:
    return scan_file(task, *context)


def _not_scanned(task: Task) -> FileScan:
    return FileScan(task.display, task.module, error=WORKER_DIED)


def in_dependency_order(wanted: Iterable[str]) -> list[Mode]:
    """The modes `wanted` and those they read, each after the modes it reads, otherwise in registry order."""
    order: dict[str, Mode] = {}

    def visit(name: str, reading: tuple[str, ...]) -> None:
        if name in order:
            return
        if name in reading:
            raise ValueError(f"analysis modes read each other in a circle: {' -> '.join((*reading, name))}")
        mode = REGISTRY[name]
        for needed in mode.reads:
            visit(needed, (*reading, name))
        order[name] = mode

    for name in wanted:
        visit(name, ())
    return list(order.values())


def analyse(
    paths: list[Path],
    settings: Settings,
    *,
    ignored_for: Callable[[str], tuple[str, ...]] = lambda _: (),
    excludes: list[tuple[str, Path]] | None = None,
    respect_gitignore: bool = True,
    progress: Callable[[int, int], None] | None = None,
    cache_root: Path | None = None,
) -> Analysis:
    """Analyse `paths` (files or folders) in the chosen modes; `progress(done, total)` after each file scanned.
    With `cache_root` (the project's root), the rules' findings of unchanged files come from its cache."""
    for given in (*paths, *settings.env_paths):
        if not given.exists():
            raise AnalysisError(f"{given}: no such file or directory")
    root = common_root(paths)
    context = Context(settings)
    _ = context.api  # an unknown --torch-npu-version fails here, before any work
    for mode in REGISTRY.values():
        if mode.prepare is not None:
            mode.prepare(context)

    # Every file `apply` migrates (scripts, notebooks, CUDA sources too), so the rule findings are its findings.
    found = discover(paths, lambda p: kind_of(p) is not None, excludes=excludes, respect_gitignore=respect_gitignore)
    tasks = []
    for path in found.files:
        display = relative(path, root)
        tasks.append(Task(path, display, module_name(display), ignored_for(display)))
    files = []
    cache = None
    if cache_root is not None:
        from npu_migrate.engine.cache import Cache

        cache = Cache.open(cache_root, _plan(settings))
    work, shared = (scan_file, context) if cache is None else (_scan_cached, (context, cache))
    for scanned in runner.run_each(work, tasks, shared, crashed=_not_scanned, workers=settings.jobs):
        files.append(scanned)
        if progress is not None:
            progress(len(files), len(tasks))
    errors = list(found.errors) + [(f.display, f.error) for f in files if f.error]
    project = Project(root, settings, context, files, list(paths), respect_gitignore)
    for mode in in_dependency_order(settings.modes):
        result = ModeResult(mode.name, mode.title)
        mode.collect(project, result)
        project.results[mode.name] = result
    results = [project.results[name] for name in settings.modes]
    return Analysis(root, settings, results, files, errors, context.api.version)
