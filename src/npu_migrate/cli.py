"""The `npu-migrate` command line. Thin: it parses options and hands over to the engine.

Exit codes (all commands): 0 done or nothing to do; 1 changes needed (`apply --check`), or for `verify`
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
from typing import Annotated, Optional

import typer

app = typer.Typer(
    name="npu-migrate",
    help=(
        "Migrate a PyTorch code base from NVIDIA GPUs (CUDA) to Huawei Ascend NPUs (torch_npu).\n\n"
        "Exit codes: 0 done or nothing to do, 1 changes needed (apply --check), 2 error."
    ),
    add_completion=False,
    no_args_is_help=True,
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


@app.command()
def apply(
    paths: Annotated[list[Path], typer.Argument(help="Files or folders to migrate.", show_default=False)],
    diff: Annotated[bool, typer.Option("--diff", help="Print unified diffs; write nothing.")] = False,
    check: Annotated[
        bool, typer.Option("--check", help="Write nothing; exit 1 if any file would change (CI, pre-commit).")
    ] = False,
    output: Annotated[
        Optional[Path],
        typer.Option("--output", "-o", help="Write a migrated copy of the tree here (plus change_list.csv)."),
    ] = None,
    select: Annotated[
        Optional[list[str]], typer.Option("--select", help="Rule ids or prefixes to run (default: ALL).")
    ] = None,
    ignore: Annotated[Optional[list[str]], typer.Option("--ignore", help="Rule ids or prefixes to skip.")] = None,
    exclude: Annotated[
        Optional[list[str]], typer.Option("--exclude", help="Glob of paths to skip (repeatable).")
    ] = None,
    jobs: Annotated[
        Optional[int], typer.Option("--jobs", "-j", min=1, help="Worker processes (default: all cores).")
    ] = None,
    torch_npu_version: Annotated[
        Optional[str], typer.Option("--torch-npu-version", help="torch_npu version to target (default: newest known).")
    ] = None,
    output_format: Annotated[OutputFormat, typer.Option("--format", help="Report format.")] = OutputFormat.text,
    annotate: Annotated[
        bool, typer.Option("--annotate", help="Insert a TODO comment above each finding a human must act on.")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Rewrite files in place even if they have uncommitted git changes.")
    ] = False,
    config_file: Annotated[
        Optional[Path], typer.Option("--config", help="pyproject.toml to read (default: found from PATHS upwards).")
    ] = None,
    no_gitignore: Annotated[bool, typer.Option("--no-gitignore", help="Also migrate files git ignores.")] = False,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.1, help="Seconds one file may take; a slower file fails, untouched.")
    ] = 300.0,
) -> None:
    """Rewrite CUDA code for Ascend NPUs: in place, into --output, or as a --diff / --check dry run.

    With --check the exit code is 1 when a file would change or a finding of severity "error" is open
    (an API with no NPU counterpart), so CI keeps CUDA-only code from creeping back.
    """
    from npu_migrate.discovery import discover, uncommitted
    from npu_migrate.pipeline import Job, Mode, Plan, Status
    from npu_migrate.report import (
        Summary,
        colour_diff,
        format_finding,
        github_annotation,
        sarif_document,
        write_change_list,
        write_json,
    )
    from npu_migrate.runner import run, with_progress

    if output is not None and (diff or check):
        raise _fail("--output cannot be combined with --diff or --check")
    config, enabled, version = _settings(paths, config_file, select, ignore, torch_npu_version)

    excludes = [(p, config.root) for p in config.exclude] + [(p, Path.cwd()) for p in split_codes(exclude)]
    found = discover(paths, _migratable, excludes=excludes, respect_gitignore=not no_gitignore)
    for path, reason in found.errors:
        typer.echo(f"{path}: error: {reason}", err=True)

    root = _common_root(paths) if paths else Path.cwd()
    if output is not None:
        out = _absolute(output)
        for given in paths:
            g = _absolute(given)
            if given.is_dir() and (out == g or g in out.parents):
                raise _fail(f"--output {output} is inside the input tree {given}; choose a folder outside it")
        _copy_tree_skeleton(paths, root, out)

    mode = Mode.OUTPUT if output is not None else (Mode.DIFF if diff or check else Mode.IN_PLACE)
    dirty = (
        uncommitted(paths, found.files) if mode is Mode.IN_PLACE and config.require_clean_git and not force else set()
    )
    plan = Plan(
        enabled,
        version,
        mode,
        annotate=annotate,
        timeout=timeout,
        output_root=_absolute(output) if output is not None else None,
    )
    job_list = [
        Job(
            path=f,
            display=_display(f, root),
            destination=(_absolute(output) / _absolute(f).relative_to(root)) if output is not None else None,
            ignore=config.ignored_for(_relative_to(f, config.root)),
            dirty=f in dirty,
        )
        for f in found.files
    ]

    summary = Summary()
    results, all_findings = [], []
    text = output_format is OutputFormat.text
    colour = text and sys.stdout.isatty() and "NO_COLOR" not in os.environ
    for result in with_progress(run(job_list, plan, jobs), len(job_list), enabled=text):
        summary.add(result)
        all_findings.extend(result.findings)
        results.append(result) if output_format is OutputFormat.json else None
        if result.status is Status.FAILED:
            typer.echo(f"{result.display}: error: {result.error}", err=True)
        if output_format is OutputFormat.github:
            for finding in result.findings:
                typer.echo(github_annotation(finding))
            continue
        if not text:
            continue
        if mode is Mode.DIFF and result.diff:
            sys.stdout.write(colour_diff(result.diff) if colour else result.diff)
        elif result.status is Status.CHANGED and not check:
            typer.echo(f"migrated {result.display}", err=mode is Mode.DIFF)
        # With --diff the patch owns stdout (so it can be saved and `git apply`-ed); findings go to stderr.
        for finding in result.findings:
            if not finding.fixed:
                typer.echo(format_finding(finding), err=mode is Mode.DIFF)

    if output is not None:
        write_change_list(_absolute(output) / "change_list.csv", all_findings)
    if output_format is OutputFormat.json:
        write_json(sys.stdout, "apply", results, summary)
    elif output_format is OutputFormat.sarif:
        json.dump(sarif_document(all_findings), sys.stdout, indent=2)
        sys.stdout.write("\n")
    if output_format is not OutputFormat.json:
        for line in summary.lines(dry_run=mode is Mode.DIFF):
            typer.echo(line, err=True)
    if dirty and summary.failed:
        typer.echo("some files have uncommitted changes and were left as they are; see above", err=True)

    if found.errors or summary.failed:
        raise typer.Exit(EXIT_ERROR)
    if check and (summary.changed or summary.open_errors):
        raise typer.Exit(EXIT_CHANGES)


def _settings(paths, config_file, select, ignore, torch_npu_version):
    """Configuration file merged with the command line (which wins), validated; exits 2 on any error."""
    from npu_migrate.api import NpuApi, UnknownVersionError
    from npu_migrate.config import ConfigError, discover_config
    from npu_migrate.registry import SelectionError, fused_rule_names, select_rules, with_torch_npu_import

    try:
        config = discover_config(paths, config_file)
        chosen_select = split_codes(select) or list(config.select or ["ALL"])
        chosen_ignore = split_codes(ignore) if ignore else list(config.ignore)
        chosen_ignore += config.fused_ignores(fused_rule_names())
        enabled = with_torch_npu_import(select_rules(chosen_select, chosen_ignore), chosen_ignore)
        version = torch_npu_version or config.torch_npu_version
        NpuApi(version)
    except (ConfigError, SelectionError, UnknownVersionError) as exc:
        raise _fail(str(exc)) from None
    return config, enabled, version


def split_codes(values):
    from npu_migrate.registry import split_codes as split

    return split(values)


def _migratable(path: Path) -> bool:
    from npu_migrate.kinds import kind_of

    return kind_of(path) is not None


def _copy_tree_skeleton(paths: list[Path], root: Path, out: Path) -> None:
    """Copy the files npu-migrate does not read into the output tree, so that it is a complete copy."""
    from npu_migrate.discovery import is_skipped_dir

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


@app.command()
def rules(
    rule_id: Annotated[Optional[str], typer.Argument(help="Show the documentation of this rule (id or name).")] = None,
    config_file: Annotated[
        Optional[Path], typer.Option("--config", help="pyproject.toml to read (default: found from here upwards).")
    ] = None,
) -> None:
    """List every rule (and whether the current configuration enables it), or show one rule's documentation."""
    from npu_migrate.registry import all_rules, rule

    config, enabled, _ = _settings([Path.cwd()], config_file, None, None, None)
    if rule_id is None:
        if config.path is not None:
            typer.echo(f"configuration: {config.path}")
        for known in all_rules():
            state = "on" if known.id in enabled else "off"
            typer.echo(f"{known.id}  {state:<3} {known.family:<16} {known.fix_safety.value:<12} {known.summary}")
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
from npu_migrate.analyze.cli import analyze_command  # noqa: E402
from npu_migrate.verify.cli import verify_command  # noqa: E402  (imports no torch: only its workers do)

app.command("analyze")(analyze_command)
app.command("verify")(verify_command)


def main() -> None:
    app()
