"""The `npu-migrate` command line. Thin: it parses options and hands over to the engine.

Exit codes (all commands): 0 done or nothing to do; 1 for `apply` a file `--check` would change, or an
open finding at or above `--fail-on` (unless `--exit-zero`), or for `verify`
the outputs differ, a fused op rejected its arguments, or no fused branch ran; 2 error (bad usage, a path
that does not exist, a file that could not be read or parsed, an error in the user's own code).
"""

from __future__ import annotations

import enum
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Annotated

import typer

from npu_migrate.cli.command import CONTEXT_SETTINGS, Command, Group, examples, run
from npu_migrate.cli.config import split_codes

app = typer.Typer(
    name="npu-migrate",
    cls=Group,
    help=(
        "Migrate a PyTorch code base from NVIDIA GPUs (CUDA) to Huawei Ascend NPUs (torch_npu).\n\n"
        "Exit codes: 0 done or nothing to do; 1 a file would change (apply --check) or an open finding at or "
        "above --fail-on remains; 2 error."
    ),
    epilog=examples(
        "npu-migrate apply --diff src/ > npu.patch   # what the migration would change",
        "npu-migrate analyze --mode all -o report/ src/   # what a human must port, as a report",
        "npu-migrate apply -h                         # one command's options and examples",
    ),
    add_completion=False,
    no_args_is_help=True,
    context_settings=CONTEXT_SETTINGS,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)

EXIT_OK, EXIT_CHANGES, EXIT_ERROR = 0, 1, 2


class OutputFormat(str, enum.Enum):
    text = "text"
    json = "json"
    sarif = "sarif"
    github = "github"


def _fail(message: str) -> typer.Exit:
    typer.echo(f"npu-migrate: error: {message}", err=True)
    return typer.Exit(EXIT_ERROR)


def _version_callback(value: bool) -> None:
    if value:
        from npu_migrate import __version__

        typer.echo(f"npu-migrate {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    """npu-migrate: CUDA -> Ascend NPU migration."""


def _absolute(path: Path) -> Path:
    # Not Path.resolve(): it follows symlinks (and raises on a symlink loop); paths here stay as given.
    return Path(os.path.abspath(path))


def _display(path: Path, root: Path) -> str:
    """Paths in diffs and findings: relative to the current folder (so `git apply` works from the
    repository root), else relative to the common root of the inputs."""
    resolved = _absolute(path)
    for base in (_absolute(Path.cwd()), root):
        try:
            return resolved.relative_to(base).as_posix()
        except ValueError:
            continue
    return path.as_posix()


def _relative_to(path: Path, base: Path) -> str:
    try:
        return _absolute(path).relative_to(_absolute(base)).as_posix()
    except ValueError:
        return path.as_posix()


def _common_root(paths: list[Path]) -> Path:
    dirs = [_absolute(p) if p.is_dir() else _absolute(p).parent for p in paths]
    return Path(os.path.commonpath([str(d) for d in dirs]))


class Target(str, enum.Enum):
    npu = "npu"
    portable = "portable"


class FailOn(str, enum.Enum):
    rewrite = "rewrite"
    error = "error"
    warning = "warning"


@app.command(
    cls=Command,
    epilog=examples(
        "npu-migrate apply --diff src/ > npu.patch      # review the migration as a patch; writes nothing",
        "npu-migrate apply src/                         # migrate in place (git keeps the tracked files' old versions)",
        "npu-migrate apply --check --statistics .       # CI: exit 1 while something is left to migrate",
        "npu-migrate apply --target portable src/       # one codebase for CUDA, Ascend NPU and CPU (torch.accelerator)",
    ),
)
def apply(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="Files or folders to migrate; `-` reads one file from stdin.", metavar="PATH", show_default=False
        ),
    ],
    diff: Annotated[bool, typer.Option("--diff", help="Print unified diffs; write nothing.")] = False,
    check: Annotated[
        bool,
        typer.Option(
            "--check", help="Write nothing; list the files that would change and exit 1 (CI); --diff adds the patch."
        ),
    ] = False,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", metavar="DIR", help="Write a migrated copy of the tree here (plus change_list.csv)."
        ),
    ] = None,
    select: Annotated[
        list[str] | None,
        typer.Option("--select", metavar="RULES", help="Rule ids or prefixes to run, comma-separated (default: ALL)."),
    ] = None,
    ignore: Annotated[
        list[str] | None, typer.Option("--ignore", metavar="RULES", help="Rule ids or prefixes to skip.")
    ] = None,
    exclude: Annotated[
        list[str] | None, typer.Option("--exclude", metavar="GLOB", help="Glob of paths to skip (repeatable).")
    ] = None,
    fail_on: Annotated[
        FailOn | None,
        typer.Option(
            "--fail-on",
            help="Also exit 1 when an open finding of this severity or worse remains: `error` or `warning` "
            "(default `rewrite`: only a file --check would change fails; config: fail-on).",
            show_default=False,
        ),
    ] = None,
    exit_zero: Annotated[
        bool, typer.Option("--exit-zero", help="Exit 0 even when --check or --fail-on would exit 1 (errors still 2).")
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Print findings, diffs and errors only: no summary, no progress.")
    ] = False,
    statistics: Annotated[
        bool, typer.Option("--statistics", help="Print a count per rule instead of every finding.")
    ] = False,
    show_fixes: Annotated[
        bool, typer.Option("--show-fixes", help="Also list each rewrite made (or, with --diff/--check, proposed).")
    ] = False,
    interactive: Annotated[
        bool,
        typer.Option(
            "--interactive",
            help="Review in place hunk by hunk, like `git add -p` (y/n/a/d/q/?); accepted hunks are written at the "
            "end, all files or none.",
        ),
    ] = False,
    stdin_filename: Annotated[
        str | None,
        typer.Option(
            "--stdin-filename",
            metavar="NAME",
            help="With `-`: the name of the file on stdin (decides its kind, per-file-ignores and how it is shown).",
        ),
    ] = None,
    jobs: Annotated[
        int | None, typer.Option("--jobs", "-j", min=1, help="Worker processes (default: all cores).")
    ] = None,
    torch_npu_version: Annotated[
        str | None,
        typer.Option(
            "--torch-npu-version", metavar="VERSION", help="torch_npu version to target (default: newest known)."
        ),
    ] = None,
    target: Annotated[
        Target | None,
        typer.Option(
            "--target",
            help="What to migrate to: `npu` (torch_npu code for Ascend) or `portable` (device-generic "
            "torch.accelerator code that runs on CUDA, Ascend NPU and CPU). Default: npu (config: target).",
            show_default=False,
        ),
    ] = None,
    torch_version: Annotated[
        str | None,
        typer.Option(
            "--torch-version",
            metavar="VERSION",
            help="With --target portable: the oldest torch the code must run on; decides which torch.accelerator "
            "names are used (default: newest known).",
        ),
    ] = None,
    output_format: Annotated[OutputFormat, typer.Option("--format", help="Report format.")] = OutputFormat.text,
    annotate: Annotated[
        bool, typer.Option("--annotate", help="Insert a TODO comment above each finding a human must act on.")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Rewrite files in place even if they have uncommitted git changes.")
    ] = False,
    config_file: Annotated[
        Path | None,
        typer.Option("--config", metavar="FILE", help="pyproject.toml to read (default: found from PATHS upwards)."),
    ] = None,
    no_gitignore: Annotated[bool, typer.Option("--no-gitignore", help="Also migrate files git ignores.")] = False,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout", min=0.1, metavar="SECONDS", help="Seconds one file may take; a slower file fails, untouched."
        ),
    ] = 300.0,
    no_cache: Annotated[
        bool,
        typer.Option("--no-cache", help="Neither read nor write .npu_migrate_cache/ (config: cache = false)."),
    ] = False,
) -> None:
    """Rewrite CUDA code for Ascend NPUs: in place, into --output, or as a --diff / --check dry run.

    Exit 1 when --check finds a file that would change, or when an open finding at or above --fail-on
    remains (findings only a human can act on never fail by default); exit 2 on an error.
    """
    from npu_migrate.files.discovery import GitStateUnknown, discover, uncommitted
    from npu_migrate.program.packages import collect, helper_module, possible_module_files

    def _uncommitted(paths, files):
        try:
            return uncommitted(paths, files)
        except GitStateUnknown as exc:
            raise _fail(f"{exc}; commit or stash first, or pass --force") from None

    from npu_migrate.engine.pipeline import Job, Mode, Plan, Status
    from npu_migrate.engine.runner import Progress, run
    from npu_migrate.output.report import (
        Summary,
        colour_diff,
        format_finding,
        github_annotation,
        sarif_document,
        statistics_lines,
        write_change_list,
        write_json,
    )

    if output is not None and (diff or check):
        raise _fail("--output cannot be combined with --diff or --check")
    if interactive and (diff or check or output is not None or output_format is not OutputFormat.text):
        raise _fail("--interactive rewrites in place; it cannot be combined with --diff, --check, --output or --format")
    stdin = [p for p in paths if str(p) == "-"]
    if stdin and interactive:
        raise _fail("--interactive reads its answers from stdin; it cannot review a file read from stdin")
    if stdin and len(paths) > 1:
        raise _fail("`-` (stdin) cannot be combined with other paths")
    if stdin_filename is not None and not stdin:
        raise _fail("--stdin-filename needs `-` among the paths")
    config_paths = [Path(stdin_filename or "-").parent] if stdin else paths
    config, enabled, version = _settings(
        config_paths,
        config_file,
        select,
        ignore,
        torch_npu_version,
        target.value if target else None,
        torch_version,
        every_rule_lazily=True,
    )
    plan_target = {
        "target": (target.value if target else None) or config.target,
        "torch_version": torch_version or config.torch_version,
    }
    threshold = (fail_on.value if fail_on is not None else None) or config.fail_on

    if stdin:
        code = _apply_stdin(
            stdin_filename or "-",
            config,
            enabled,
            version,
            diff=diff,
            check=check,
            annotate=annotate,
            fail_on=threshold,
            **plan_target,
        )
        if code == EXIT_CHANGES and exit_zero:
            code = EXIT_OK
        raise typer.Exit(code)

    excludes = [(p, config.root) for p in config.exclude] + [(p, Path.cwd()) for p in split_codes(exclude)]
    found = discover(paths, _migratable, excludes=excludes, respect_gitignore=not no_gitignore)
    for path, reason in found.errors:
        typer.echo(f"{path}: error: {reason}", err=True)
    if not found.files and not found.errors:
        # Nothing to do is not a failure (a pre-commit run whose files are all excluded must pass), but a
        # silent "0 files scanned" hides a wrong path or a .gitignore that swallowed the tree.
        typer.echo(f"npu-migrate: warning: {found.nothing_found(paths)}", err=True)
        raise typer.Exit(EXIT_OK)

    root = _common_root(paths) if paths else Path.cwd()
    mode = Mode.OUTPUT if output is not None else (Mode.DIFF if diff or check else Mode.IN_PLACE)
    # An --output tree holds nothing above `root`: the package's helper module cannot go higher.
    bounds = {f: helper_module(f, stop=root if output is not None else None) for f in found.files}
    guard_git = mode is Mode.IN_PLACE and config.require_clean_git and not force
    # The packages' helper modules are files the run may change too (it appends the helpers they lack).
    modules = {m for f in found.files for m in possible_module_files(f, bounds[f])} if guard_git else set()
    dirty = _uncommitted(paths, [*found.files, *sorted(modules)]) if guard_git else set()
    plan = Plan(
        enabled,
        version,
        mode,
        annotate=annotate,
        timeout=timeout,
        output_root=_absolute(output) if output is not None else None,
        **plan_target,
    )
    job_list = [
        Job(
            path=f,
            display=_display(f, root),
            destination=(_absolute(output) / _absolute(f).relative_to(root)) if output is not None else None,
            ignore=config.ignored_for(_relative_to(f, config.root)),
            dirty=f in dirty,
            helper_module=bounds[f],
        )
        for f in found.files
    ]
    if output is not None:
        out = _absolute(output)
        for given in paths:
            g = _absolute(given)
            if given.is_dir() and (out == g or g in out.parents):
                raise _fail(f"--output {output} is inside the input tree {given}; choose a folder outside it")
        _copy_tree_skeleton(paths, root, out)
    if dirty:
        _refuse_dirty_changes(job_list, dirty & modules, plan, jobs, lambda path: _display(path, root))
    if interactive:
        raise typer.Exit(_review(job_list, plan, quiet=quiet))

    summary = Summary()
    results, all_findings = [], []
    text = output_format is OutputFormat.text
    colour = text and sys.stdout.isatty() and "NO_COLOR" not in os.environ
    # With --diff the patch owns stdout (so it can be saved and `git apply`-ed); findings go to stderr.
    findings_err = mode is Mode.DIFF
    progress = Progress(len(job_list), "migrating" if mode is not Mode.DIFF else "checking", enabled=text and not quiet)

    def say(line: str, *, err: bool) -> None:
        progress.clear()
        typer.echo(line, err=err)

    def show(result) -> None:
        summary.add(result)
        all_findings.extend(result.findings)
        results.append(result) if output_format is OutputFormat.json else None
        if result.status is Status.FAILED:
            say(f"{result.display}: error: {result.error}", err=True)
        if output_format is OutputFormat.github:
            for finding in result.findings:
                typer.echo(github_annotation(finding))
            return
        if not text:
            return
        if mode is Mode.DIFF and result.diff and diff:
            progress.clear()
            sys.stdout.write(colour_diff(result.diff) if colour else result.diff)
        elif result.status is Status.CHANGED and check:
            # ruff's and black's --check: the files, not the patch (which --diff adds), so a CI log of a
            # large tree stays readable; stdout stays empty for a caller that only wants the exit status.
            say(f"would migrate {result.display}", err=True)
        elif result.status is Status.CHANGED and not quiet:
            say(f"migrated {result.display}", err=mode is Mode.DIFF)
        if statistics:
            return
        for finding in result.findings:
            if not finding.fixed or show_fixes:
                say(format_finding(finding), err=findings_err)

    cache = None
    if config.cache and not no_cache and mode is not Mode.OUTPUT:
        from npu_migrate.engine.cache import Cache

        cache = Cache.open(config.root, plan)
    helper_imports: dict[Path, set[str]] = {}
    for job, result in zip(job_list, run(job_list, plan, jobs, cache)):
        progress.advance()
        collect(helper_imports, job.path, result.helper_module, result.helper_imports)
        show(result)
    progress.clear()

    # The packages' helper modules, once every file that imports them is done.
    def module_destination(path: Path) -> Path | None:
        return _absolute(output) / _absolute(path).relative_to(root) if output is not None else None

    if helper_imports:
        from npu_migrate.output.helper_module import written  # the fused rules: only once a file imports helpers

        for result in written(helper_imports, plan, lambda path: _display(path, root), module_destination):
            show(result)

    if output is not None:
        destinations = {job.display: job.destination for job in job_list}
        write_change_list(_absolute(output) / "change_list.csv", all_findings, destinations)
    if output_format is OutputFormat.json:
        write_json(sys.stdout, "apply", results, summary)
    elif output_format is OutputFormat.sarif:
        json.dump(sarif_document(all_findings), sys.stdout, indent=2)
        sys.stdout.write("\n")
    if statistics and text:
        for line in statistics_lines(summary):
            typer.echo(line, err=findings_err)
    if output_format is not OutputFormat.json and not quiet:
        # --statistics already gave the per-rule counts; the summary keeps only its file counts then.
        for line in summary.lines(dry_run=mode is Mode.DIFF)[: 1 if statistics else None]:
            typer.echo(line, err=True)

    if found.errors or summary.failed:
        raise typer.Exit(EXIT_ERROR)
    if summary.fails(threshold, check=check) and not exit_zero:
        raise typer.Exit(EXIT_CHANGES)


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

        blocked += [f"{display(c.path)} (the package's fused-op helper module)" for c in changes(needed) if not c.error]
    if blocked:
        listed = "\n".join(f"  {name}" for name in blocked)
        raise _fail(
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
            shown = _display(module.path, _common_root([r.job.path for r in reviews]))
            typer.echo(f"wrote {shown}: the fused-op helpers the accepted hunks import", err=True)
    return EXIT_ERROR if errors else EXIT_OK


def _apply_stdin(
    name: str,
    config,
    enabled,
    version,
    *,
    diff: bool,
    check: bool,
    annotate: bool,
    fail_on: str,
    target: str,
    torch_version: str | None,
) -> int:
    """`apply -`: one file from stdin. The migrated text (or with --diff the patch; with --check nothing)
    goes to stdout, findings to stderr. On an error the input is echoed unchanged, so an editor that replaces
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

    raw = sys.stdin.buffer.read()
    display = name if name != "-" else "<stdin>"
    plan = Plan(enabled, version, Mode.DIFF, annotate=annotate, target=target, torch_version=torch_version)
    kind = kinds.kind_of(Path(name)) or kinds.PYTHON
    try:
        source = decode_source(Path(name), raw)
        new_text, findings, _ = migrate_file(
            source, display, plan, api_for(plan), kind, config.ignored_for(_relative_to(Path(name), config.root))
        )
        if new_text != source.text:
            validate(new_text, display, kind)
    except SourceError as exc:
        typer.echo(f"{display}: error: {exc}", err=True)
        if not diff and not check:
            sys.stdout.buffer.write(raw)
        return EXIT_ERROR
    for finding in findings:
        if not finding.fixed:
            typer.echo(format_finding(finding), err=True)
    changed = new_text != source.text
    if diff:
        sys.stdout.write(unified_diff(display, source.text, new_text))
    elif not check:
        sys.stdout.buffer.write(source.encode(new_text) if changed else raw)
    summary = Summary()
    summary.add(FileResult(display, Status.CHANGED if changed else Status.UNCHANGED, findings))
    return EXIT_CHANGES if summary.fails(fail_on, check=check) else EXIT_OK


def _settings(
    paths, config_file, select, ignore, torch_npu_version, target=None, torch_version=None, *, every_rule_lazily=False
):
    """Configuration file merged with the command line (which wins), validated; exits 2 on any error.
    `every_rule_lazily`: when nothing selects or ignores a rule, `enabled` is None (every rule of the target,
    see `Plan`), and the rules are not imported here: a run whose files no rule may want never imports them."""
    from npu_migrate.cli.config import ConfigError, discover_config
    from npu_migrate.program.api import NpuApi, PortableApi, UnknownVersionError

    try:
        config = discover_config(paths, config_file)
        chosen_select = split_codes(select) or list(config.select or ["ALL"])
        chosen_ignore = split_codes(ignore) if ignore else list(config.ignore)
        chosen_target = target or config.target
        every = [code.strip().upper() for code in chosen_select] == ["ALL"]
        if every_rule_lazily and every and not chosen_ignore and config.fused is True:
            enabled = None
        else:
            enabled = _selected(config, chosen_select, chosen_ignore, chosen_target)
        version = torch_npu_version or config.torch_npu_version
        NpuApi(version)
        if chosen_target == "portable":
            PortableApi(version, torch_version or config.torch_version)
    except (ConfigError, UnknownVersionError) as exc:
        raise _fail(str(exc)) from None
    return config, enabled, version


def _selected(config, chosen_select: list[str], chosen_ignore: list[str], target: str) -> frozenset[str]:
    from npu_migrate.engine.registry import SelectionError, fused_rule_names, select_rules, with_torch_npu_import

    try:
        chosen_ignore = chosen_ignore + config.fused_ignores(fused_rule_names())
        return with_torch_npu_import(select_rules(chosen_select, chosen_ignore, target), chosen_ignore)
    except SelectionError as exc:
        raise _fail(str(exc)) from None


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
                target = out / _absolute(source).relative_to(root)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)


@app.command(
    cls=Command,
    epilog=examples(
        "npu-migrate rules             # every rule, and whether the configuration enables it",
        "npu-migrate rules NPU203      # one rule's documentation, with before/after examples",
        "npu-migrate rules --target portable   # which rules act when migrating to device-generic code",
        "npu-migrate rules cuda-method # the same, by the rule's name",
    ),
)
def rules(
    rule_id: Annotated[
        str | None, typer.Argument(help="Show the documentation of this rule (id or name).", metavar="RULE")
    ] = None,
    config_file: Annotated[
        Path | None, typer.Option("--config", help="pyproject.toml to read (default: found from here upwards).")
    ] = None,
    target: Annotated[
        Target | None,
        typer.Option("--target", help="Say which rules are on for this target (default: the configuration's)."),
    ] = None,
) -> None:
    """List every rule (whether the current configuration enables it, and the targets it acts in), or show one
    rule's documentation."""
    from npu_migrate.engine.registry import all_rules, rule

    config, enabled, _ = _settings([Path.cwd()], config_file, None, None, None, target.value if target else None)
    if rule_id is None:
        if config.path is not None:
            typer.echo(f"configuration: {config.path}")
        for known in all_rules():
            state = "on" if known.id in enabled else "off"
            targets = ",".join(sorted(known.targets))
            typer.echo(
                f"{known.id}  {state:<3} {known.family:<16} {targets:<12} {known.fix_safety.value:<12} {known.summary}"
            )
        return
    try:
        found = rule(rule_id)
    except KeyError:
        raise _fail(f"unknown rule {rule_id!r}; `npu-migrate rules` lists them") from None
    state = "enabled" if found.id in enabled else "disabled by the current configuration"
    tags = f"; tags: {', '.join(sorted(found.tags))}" if found.tags else ""
    typer.echo(f"{found.id} ({found.name}): {found.summary}\n")
    typer.echo(
        f"family: {found.family}; severity: {found.severity.value}; fix: {found.fix_safety.value}{tags}; {state}\n"
    )
    typer.echo(found.documentation)


# Both import only typer here; what their commands run (the analysis engine, the verify harness) is imported
# when they run, so `apply --check` in a pre-commit hook does not pay for it.
from npu_migrate.analyze.cli import ANALYZE_EXAMPLES, analyze_command  # noqa: E402
from npu_migrate.verify.cli import verify_command  # noqa: E402  (imports no torch: only its workers do)

app.command("analyze", cls=Command, epilog=ANALYZE_EXAMPLES)(analyze_command)
app.command(
    "verify",
    cls=Command,
    epilog=examples(
        "npu-migrate verify --original src --migrated src_npu --factory factory.py   # same outputs as before?",
        "npu-migrate verify --smoke --migrated src_npu --script src_npu/train.py      # starts on an NPU host?",
    ),
)(verify_command)


def main() -> None:
    run(app)
