"""The steps of one `npu-migrate apply` run, in the order they happen.

`run` reads as the run itself: check the options, read the settings, find the files, make sure git can
undo an in-place run, migrate every file on the worker pool (each result shown as it arrives), write the
packages' fused-op helper modules once every file that imports them is done, then the documents and the
summary, and the exit status. `app.apply` only declares the options; `-` (one file from stdin) and
`--interactive` (hunk by hunk) are runs of their own, below.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import typer

from npu_migrate.cli.config import split_codes
from npu_migrate.cli.shared import (
    EXIT_CHANGES,
    EXIT_ERROR,
    EXIT_OK,
    absolute,
    common_root,
    display,
    fail,
    relative_to,
)


@dataclass(frozen=True)
class ApplyOptions:
    """The command line of `apply`, as plain values (an enum option's `.value`, None where not given)."""

    paths: list[Path]
    diff: bool = False
    check: bool = False
    output: Path | None = None
    select: list[str] | None = None
    ignore: list[str] | None = None
    exclude: list[str] | None = None
    fail_on: str | None = None
    exit_zero: bool = False
    quiet: bool = False
    statistics: bool = False
    min_severity: str | None = None
    colour: bool = False
    show_fixes: bool = False
    interactive: bool = False
    stdin_filename: str | None = None
    jobs: int | None = None
    torch_npu_version: str | None = None
    target: str | None = None
    torch_version: str | None = None
    output_format: str = "text"
    annotate: bool = False
    force: bool = False
    config_file: Path | None = None
    no_gitignore: bool = False
    timeout: float = 300.0
    no_cache: bool = False

    @property
    def stdin(self) -> bool:
        return any(str(p) == "-" for p in self.paths)

    @property
    def machine_readable(self) -> bool:
        return self.output_format in ("json", "sarif")


def run(o: ApplyOptions, settings) -> int:
    """One `apply` run; `settings` is `app._settings` (configuration merged with the command line). Returns
    the exit status; a usage error raises `typer.Exit` after saying why."""
    from npu_migrate.engine.pipeline import Mode
    from npu_migrate.findings import Severity

    _check_options(o)
    config_paths = [Path(o.stdin_filename or "-").parent] if o.stdin else o.paths
    config, enabled, version = settings(
        config_paths,
        o.config_file,
        o.select,
        o.ignore,
        o.torch_npu_version,
        o.target,
        o.torch_version,
        every_rule_lazily=True,
    )
    target = {"target": o.target or config.target, "torch_version": o.torch_version or config.torch_version}
    threshold = o.fail_on or config.fail_on
    shown = Severity(o.min_severity or config.min_severity or ("info" if o.machine_readable else "warning"))
    if o.stdin:
        code = _apply_stdin(o, config, enabled, version, fail_on=threshold, shown=shown, **target)
        return EXIT_OK if code == EXIT_CHANGES and o.exit_zero else code

    found = _find_files(o, config)
    root = common_root(o.paths) if o.paths else Path.cwd()
    mode = Mode.OUTPUT if o.output is not None else (Mode.DIFF if o.diff or o.check else Mode.IN_PLACE)
    plan, job_list, dirty, modules = _plan(o, config, enabled, version, target, found, root, mode)
    if o.output is not None:
        _prepare_output_tree(o, root)
    if mode is Mode.IN_PLACE and not o.quiet:
        _warn_outside_git(found.files, root)
    if dirty:
        _refuse_dirty_changes(job_list, dirty & modules, plan, o.jobs, lambda path: display(path, root))
    if o.interactive:
        return _review(job_list, plan, quiet=o.quiet)

    cache = None
    if config.cache and not o.no_cache and mode is not Mode.OUTPUT:
        from npu_migrate.engine.cache import Cache, cache_root

        # Beside the inputs (their project), not in the working folder: a run from a repository on
        # /tmp/x.py must not leave a cache folder in the repository.
        cache = Cache.open(cache_root(o.paths, config.path), plan)
    shower = _Shower(o, mode, shown, total=len(job_list))
    shower.migrate(job_list, plan, root, cache)
    shower.finish(job_list)
    if found.errors or shower.summary.failed:
        return EXIT_ERROR
    if shower.summary.fails(threshold, check=o.check) and not o.exit_zero:
        return EXIT_CHANGES
    return EXIT_OK


def _check_options(o: ApplyOptions) -> None:
    if o.output is not None and (o.diff or o.check):
        raise fail("--output cannot be combined with --diff or --check")
    if o.output is not None and o.output.exists() and not o.output.is_dir():
        raise fail(f"--output {o.output} is an existing file; --output takes a folder to write the migrated tree in")
    if o.interactive and (o.diff or o.check or o.output is not None or o.output_format != "text"):
        raise fail("--interactive rewrites in place; it cannot be combined with --diff, --check, --output or --format")
    if o.stdin and o.interactive:
        raise fail("--interactive reads its answers from stdin; it cannot review a file read from stdin")
    if o.stdin and len(o.paths) > 1:
        raise fail("`-` (stdin) cannot be combined with other paths")
    if o.stdin_filename is not None and not o.stdin:
        raise fail("--stdin-filename needs `-` among the paths")


def _find_files(o: ApplyOptions, config):
    """The files of the run, each error and skipped path said on stderr; a run with no file ends here."""
    from npu_migrate.files.discovery import discover

    excludes = [(p, config.root) for p in config.exclude] + [(p, Path.cwd()) for p in split_codes(o.exclude)]
    found = discover(o.paths, _migratable, excludes=excludes, respect_gitignore=not o.no_gitignore)
    for path, reason in found.errors:
        typer.echo(f"{path}: error: {reason}", err=True)
    for path, reason in sorted(found.skipped):
        typer.echo(f"{path}: warning: {reason}", err=True)
    if not found.files and found.errors:
        raise typer.Exit(EXIT_ERROR)  # the errors above say it all; a "0 files scanned" summary would not
    if not found.files:
        # Nothing to do is not a failure (a pre-commit run whose files are all excluded must pass), but a
        # silent "0 files scanned" hides a wrong path or a .gitignore that swallowed the tree.
        typer.echo(f"npu-migrate: warning: {found.nothing_found(o.paths)}", err=True)
        raise typer.Exit(EXIT_OK)
    return found


def _plan(o: ApplyOptions, config, enabled, version, target, found, root: Path, mode):
    """The run's `Plan`, a `Job` per file, and which files (and helper modules) git could not restore."""
    from npu_migrate.engine.pipeline import Job, Mode, Plan
    from npu_migrate.files.discovery import GitStateUnknown, uncommitted
    from npu_migrate.program.packages import foreign_modules, helper_module, possible_module_files, run_sibling_modules

    # An --output tree holds nothing above `root`: the package's helper module cannot go higher.
    bounds = {f: helper_module(f, stop=root if o.output is not None else None) for f in found.files}
    # A script folder's files, where their own imports prove the folder is on sys.path: a sibling module,
    # unless another folder's could be imported in its place (then inline, as before, and said why).
    siblings, why = run_sibling_modules(
        (f for f, bound in bounds.items() if bound is None), (f for f, bound in bounds.items() if bound is not None)
    )
    if why and not o.quiet:
        typer.echo(f"npu-migrate: note: script folders keep their fused-op helpers inline: {why}", err=True)
    bounds.update(siblings)
    # A `_npu_fused.py` of the user's own is never appended to: the files that would import it keep theirs.
    bounds, foreign = foreign_modules(bounds)
    if not o.quiet:
        for module in foreign:
            typer.echo(
                f"npu-migrate: note: {display(module, root)} was not generated by npu-migrate and is never edited: "
                "the files beside it keep their fused-op helpers inline",
                err=True,
            )
    guard_git = mode is Mode.IN_PLACE and config.require_clean_git and not o.force
    # The packages' helper modules are files the run may change too (it appends the helpers they lack).
    modules = {m for f in found.files for m in possible_module_files(f, bounds[f])} if guard_git else set()
    try:
        dirty = uncommitted(o.paths, [*found.files, *sorted(modules)]) if guard_git else set()
    except GitStateUnknown as exc:
        raise fail(f"{exc}; commit or stash first, or pass --force") from None
    out = absolute(o.output) if o.output is not None else None
    plan = Plan(enabled, version, mode, annotate=o.annotate, timeout=o.timeout, output_root=out, **target)
    job_list = [
        Job(
            path=f,
            display=display(f, root),
            destination=(out / absolute(f).relative_to(root)) if out is not None else None,
            ignore=config.ignored_for(relative_to(f, config.root)),
            dirty=f in dirty,
            helper_module=bounds[f],
        )
        for f in found.files
    ]
    return plan, job_list, dirty, modules


def _prepare_output_tree(o: ApplyOptions, root: Path) -> None:
    out = absolute(o.output)
    for given in o.paths:
        g = absolute(given)
        if given.is_dir() and (out == g or g in out.parents):
            raise fail(f"--output {o.output} is inside the input tree {given}; choose a folder outside it")
    # Made before any file is migrated: an output folder that cannot be written is one line and exit 2,
    # not an internal error per file and a traceback from change_list.csv at the end.
    try:
        out.mkdir(parents=True, exist_ok=True)
        _copy_tree_skeleton(o.paths, root, out)
    except OSError as exc:
        raise fail(_cannot_write(o.output, exc)) from None


def _cannot_write(output: Path, exc: OSError) -> str:
    where = exc.filename if exc.filename is not None else output
    return f"--output {output}: cannot write {where}: {exc.strerror or exc}"


def _warn_outside_git(files: list[Path], root: Path) -> None:
    from npu_migrate.files.discovery import in_git_work_tree

    outside = [f for f in files if not in_git_work_tree(f)]
    if outside:
        where = display(outside[0], root) + (f" and {len(outside) - 1} more are" if len(outside) > 1 else " is")
        typer.echo(
            f"npu-migrate: warning: {where} not in a git repository: nothing can undo an in-place migration "
            "there; --output DIR writes a migrated copy, --diff a patch",
            err=True,
        )


class _Shower:
    """Shows each file's result as the pool delivers it, then the documents and the summary. With --diff the
    patch owns stdout (so it can be saved and `git apply`-ed); findings go to stderr."""

    def __init__(self, o: ApplyOptions, mode, shown, *, total: int) -> None:
        from npu_migrate.engine.pipeline import Mode
        from npu_migrate.engine.runner import Progress
        from npu_migrate.output.report import Summary

        self.o, self.mode, self.shown = o, mode, shown
        self.dry_run = mode is Mode.DIFF
        self.text = o.output_format == "text"
        self.colour = self.text and o.colour
        self.summary = Summary()
        self.results, self.findings = [], []
        self.progress = Progress(total, "checking" if self.dry_run else "migrating", enabled=self.text and not o.quiet)

    def say(self, line: str, *, err: bool) -> None:
        self.progress.clear()
        typer.echo(line, err=err)

    def show(self, result) -> None:
        from npu_migrate.engine.pipeline import Status
        from npu_migrate.output.report import colour_diff, format_finding, github_annotation

        o = self.o
        self.summary.add(result)
        self.findings.extend(result.findings)
        if o.output_format == "json":
            self.results.append(result)
        if result.status is Status.FAILED:
            self.say(f"{result.display}: error: {result.error}", err=True)
        if o.output_format == "github":
            for finding in result.findings:
                if finding.fixed or finding.severity.at_least(self.shown):
                    typer.echo(github_annotation(finding))
            return
        if not self.text:
            return
        if self.dry_run and result.diff and o.diff:
            self.progress.clear()
            sys.stdout.write(colour_diff(result.diff) if self.colour else result.diff)
        elif result.status is Status.CHANGED and o.check:
            # ruff's and black's --check: the files, not the patch (which --diff adds), so a CI log of a
            # large tree stays readable; stdout stays empty for a caller that only wants the exit status.
            self.say(f"would migrate {result.display}", err=True)
        elif result.status is Status.CHANGED and not o.quiet:
            self.say(f"migrated {result.display}", err=self.dry_run)
        if o.statistics:
            return
        for finding in result.findings:
            if o.show_fixes if finding.fixed else finding.severity.at_least(self.shown):
                self.say(format_finding(finding, written=not self.dry_run), err=self.dry_run)

    def migrate(self, job_list, plan, root: Path, cache=None) -> None:
        """Every file on the pool, then the packages' helper modules, once every file that imports them is done."""
        from npu_migrate.engine.runner import run as run_jobs
        from npu_migrate.program.packages import collect

        helper_imports: dict[Path, set[str]] = {}
        for job, result in zip(job_list, run_jobs(job_list, plan, self.o.jobs, cache)):
            self.progress.advance()
            collect(helper_imports, job.path, result.helper_module, result.helper_imports)
            self.show(result)
        self.progress.clear()
        if not helper_imports:
            return
        from npu_migrate.output.helper_module import written  # the fused rules: only once a file imports helpers

        out = absolute(self.o.output) if self.o.output is not None else None

        def destination(path: Path) -> Path | None:
            return out / absolute(path).relative_to(root) if out is not None else None

        for result in written(helper_imports, plan, lambda path: display(path, root), destination):
            self.show(result)

    def finish(self, job_list) -> None:
        """change_list.csv with --output, the JSON / SARIF document, --statistics, and the summary."""
        from npu_migrate.output.report import sarif_document, statistics_lines, write_change_list, write_json

        o = self.o
        if o.output is not None:
            destinations = {job.display: job.destination for job in job_list}
            try:
                write_change_list(absolute(o.output) / "change_list.csv", self.findings, destinations)
            except OSError as exc:
                raise fail(_cannot_write(o.output, exc)) from None
        if o.output_format == "json":
            write_json(sys.stdout, "apply", self.results, self.summary)
        elif o.output_format == "sarif":
            json.dump(sarif_document(self.findings), sys.stdout, indent=2)
            sys.stdout.write("\n")
        if o.statistics and self.text:
            for line in statistics_lines(self.summary, written=not self.dry_run):
                typer.echo(line, err=self.dry_run)
        if o.output_format != "json" and not o.quiet:
            # --statistics already gave the per-rule counts; the summary keeps only its file counts then.
            lines = self.summary.lines(dry_run=self.dry_run, min_severity=self.shown)
            for line in lines[: 1 if o.statistics else None]:
                typer.echo(line, err=True)


def _refuse_dirty_changes(job_list, dirty_modules, plan, workers, display) -> None:
    """Refuse the whole in-place run, before anything is written, when it would rewrite a file with
    uncommitted changes: a half-migrated tree is worse than none. A dirty file with nothing to migrate is
    no reason to refuse, so the dirty files are migrated in memory first to see which would change. A
    package's helper module (`dirty_modules`) changes only if the files that may import it need a helper
    it lacks: those files are migrated in memory too, to see."""
    from dataclasses import replace

    from npu_migrate.engine.pipeline import Mode, Status
    from npu_migrate.engine.runner import run
    from npu_migrate.program.packages import collect, possible_module_files

    checked = [
        job
        for job in job_list
        if job.dirty or dirty_modules.intersection(possible_module_files(job.path, job.helper_module))
    ]
    blocked, imports = [], {}
    for job, result in zip(checked, run(checked, replace(plan, mode=Mode.DIFF), workers)):
        if job.dirty and result.status is Status.CHANGED:
            blocked.append(result.display)
        collect(imports, job.path, result.helper_module, result.helper_imports)
    needed = {path: names for path, names in imports.items() if path in dirty_modules}
    if needed:
        from npu_migrate.output.helper_module import changes  # the fused rules: only once a file imports helpers

        blocked += [
            f"{display(c.path)} (the fused-op helper module the migrated files import)"
            for c in changes(needed)
            if not c.error
        ]
    if blocked:
        listed = "\n".join(f"  {name}" for name in blocked)
        raise fail(
            f"nothing written: {len(blocked)} file(s) that would change have uncommitted changes:\n{listed}\n"
            "commit or stash them first so git can undo the migration, or pass --force"
        )


def _review(job_list, plan, *, quiet: bool) -> int:
    """`apply --interactive`: see `npu_migrate.output.interactive`."""
    from npu_migrate.files.source import SourceError
    from npu_migrate.output.interactive import Quit, ask, helper_module_changes, prepare, write_all
    from npu_migrate.program.api import NpuApi

    def ask_line(prompt: str) -> str:
        sys.stdout.write(prompt)
        sys.stdout.flush()
        line = sys.stdin.readline()
        if not line:
            raise EOFError
        return line

    api = NpuApi(plan.torch_npu_version)
    reviews, errors = [], []
    try:
        for job in job_list:
            try:
                review = prepare(job, plan, api)
            except SourceError as exc:
                errors.append((job.display, str(exc)))
                continue
            if review is not None:
                reviews.append(review)
                ask(review, ask_line, sys.stdout.write)
    except Quit:
        pass
    except (EOFError, KeyboardInterrupt):
        typer.echo("\nnpu-migrate: review interrupted; nothing written", err=True)
        return EXIT_ERROR
    # All files or none: a file that could not even be read for review stops the writing of the others.
    written_any = False
    modules = []
    if not errors:
        modules = helper_module_changes(reviews)
        errors, written_any = write_all(reviews, modules)
    for name, reason in errors:
        typer.echo(f"{name}: error: {reason}", err=True)
    if errors and written_any:
        typer.echo("some files were written before the error above: review them with git diff", err=True)
    elif errors and any(r.result() != r.source.text for r in reviews):
        typer.echo("nothing written: fix the errors above and review again", err=True)
    elif not quiet:
        written = [r.job.display for r in reviews if r.result() != r.source.text]
        typer.echo(f"{len(written)} files changed, {len(reviews) - len(written)} left as they were", err=True)
        for module in modules:
            shown = display(module.path, common_root([r.job.path for r in reviews]))
            typer.echo(f"wrote {shown}: the fused-op helpers the accepted hunks import", err=True)
    return EXIT_ERROR if errors else EXIT_OK


def _apply_stdin(
    o: ApplyOptions, config, enabled, version, *, fail_on: str, shown, target: str, torch_version: str | None
) -> int:
    """`apply -`: one file from stdin. The migrated text (or with --diff the patch; with --check nothing)
    goes to stdout, findings (with --show-fixes the rewrites too) to stderr. On an error the input is echoed unchanged, so an editor that replaces
    its buffer with stdout loses nothing."""
    from npu_migrate.engine.pipeline import (
        FileResult,
        Mode,
        Plan,
        Status,
        api_for,
        migrate_file,
        unified_diff,
        validate,
    )
    from npu_migrate.files import kinds
    from npu_migrate.files.source import SourceError, decode_source
    from npu_migrate.output.report import Summary, format_finding

    diff, check, annotate = o.diff, o.check, o.annotate
    name = o.stdin_filename or "-"
    raw = sys.stdin.buffer.read()
    display = name if name != "-" else "<stdin>"
    plan = Plan(enabled, version, Mode.DIFF, annotate=annotate, target=target, torch_version=torch_version)
    kind = kinds.kind_of(Path(name)) or kinds.PYTHON
    try:
        source = decode_source(Path(name), raw)
        new_text, findings, _ = migrate_file(
            source,
            display,
            plan,
            api_for(plan),
            kind,
            config.ignored_for(relative_to(Path(name), config.root)),
            # --stdin-filename says where the text lies (the package it is a module of); without it, nowhere.
            file=Path(name) if name != "-" else None,
        )
        if new_text != source.text:
            validate(new_text, display, kind)
    except SourceError as exc:
        typer.echo(f"{display}: error: {exc}", err=True)
        if not diff and not check:
            sys.stdout.buffer.write(raw)
        return EXIT_ERROR
    # stdout carries the migrated text (or the patch), so every finding goes to stderr, the rewrites too
    # with --show-fixes (ruff's `check --fix --show-fixes -` lists its fixes on stderr as well): fixed
    # where the text on stdout has them, fixable where only a patch or --check's verdict does.
    for finding in findings:
        if o.show_fixes if finding.fixed else finding.severity.at_least(shown):
            typer.echo(format_finding(finding, written=not diff and not check), err=True)
    changed = new_text != source.text
    if check and changed:
        typer.echo(f"would migrate {display}", err=True)  # as --check says of a file, so exit 1 is explained
    if diff:
        sys.stdout.write(unified_diff(display, source.text, new_text))
    elif not check:
        sys.stdout.buffer.write(source.encode(new_text) if changed else raw)
    summary = Summary()
    summary.add(FileResult(display, Status.CHANGED if changed else Status.UNCHANGED, findings))
    return EXIT_CHANGES if summary.fails(fail_on, check=check) else EXIT_OK


def _migratable(path: Path) -> bool:
    from npu_migrate.files.kinds import kind_of

    return kind_of(path) is not None


def _copy_tree_skeleton(paths: list[Path], root: Path, out: Path) -> None:
    """Copy the files npu-migrate does not read into the output tree, so that it is a complete copy."""
    from npu_migrate.files.discovery import is_skipped_dir

    for given in paths:
        if given.is_file():
            continue
        for dirpath, dirnames, filenames in os.walk(given, followlinks=False):
            folder = Path(dirpath)
            dirnames[:] = [d for d in dirnames if not is_skipped_dir(folder / d)]
            for name in filenames:
                source = folder / name
                if _migratable(source) or source.is_symlink():
                    continue
                target = out / absolute(source).relative_to(root)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
