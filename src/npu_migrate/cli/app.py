"""The `npu-migrate` command line. Thin: it parses options and hands over to the engine.

Exit codes (all commands): 0 done or nothing to do; 1 for `apply` a file `--check` would change, or an
open finding at or above `--fail-on` (unless `--exit-zero`), or for `verify`
the outputs differ, a fused op rejected its arguments, or no fused branch ran; 2 error (bad usage, a path
that does not exist, a file that could not be read or parsed, an error in the user's own code).
"""

from __future__ import annotations

import enum
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from npu_migrate.cli.command import CONTEXT_SETTINGS, Command, Group, examples, run
from npu_migrate.cli.config import split_codes
from npu_migrate.cli.shared import fail

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


class OutputFormat(str, enum.Enum):
    text = "text"
    json = "json"
    sarif = "sarif"
    github = "github"


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


class Target(str, enum.Enum):
    npu = "npu"
    portable = "portable"


class MinSeverity(str, enum.Enum):
    info = "info"
    warning = "warning"
    error = "error"


class Color(str, enum.Enum):
    auto = "auto"
    always = "always"
    never = "never"


def _colour(choice: Color | None) -> bool:
    """`--color`: auto colours a terminal unless NO_COLOR is set (https://no-color.org), as ruff and git do."""
    if choice is Color.always:
        return True
    if choice is Color.never:
        return False
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ


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
    min_severity: Annotated[
        MinSeverity | None,
        typer.Option(
            "--min-severity",
            "--severity",
            help="Print the open findings of this severity or worse: `error` (fails on an NPU), `warning` (a "
            "human checks it), `info` (also the notes: optional fused kernels not used). Default: warning for "
            "text and github, info for json and sarif (config: min-severity). The summary counts all.",
            show_default=False,
        ),
    ] = None,
    color: Annotated[
        Color | None,
        typer.Option(
            "--color", help="Colour the diff: auto (a terminal without NO_COLOR), always, never.", show_default=False
        ),
    ] = None,
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
    from npu_migrate.cli.apply import ApplyOptions
    from npu_migrate.cli.apply import run as run_apply

    options = ApplyOptions(
        paths=paths,
        diff=diff,
        check=check,
        output=output,
        select=select,
        ignore=ignore,
        exclude=exclude,
        fail_on=fail_on.value if fail_on is not None else None,
        exit_zero=exit_zero,
        quiet=quiet,
        statistics=statistics,
        min_severity=min_severity.value if min_severity is not None else None,
        colour=output_format is OutputFormat.text and _colour(color),
        show_fixes=show_fixes,
        interactive=interactive,
        stdin_filename=stdin_filename,
        jobs=jobs,
        torch_npu_version=torch_npu_version,
        target=target.value if target is not None else None,
        torch_version=torch_version,
        output_format=output_format.value,
        annotate=annotate,
        force=force,
        config_file=config_file,
        no_gitignore=no_gitignore,
        timeout=timeout,
        no_cache=no_cache,
    )
    raise typer.Exit(run_apply(options, _settings))


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
        raise fail(str(exc)) from None
    return config, enabled, version


def _selected(config, chosen_select: list[str], chosen_ignore: list[str], target: str) -> frozenset[str]:
    from npu_migrate.engine.registry import SelectionError, fused_rule_names, select_rules, with_torch_npu_import

    try:
        chosen_select, chosen_ignore = config.with_fused(chosen_select, chosen_ignore, fused_rule_names())
        return with_torch_npu_import(select_rules(chosen_select, chosen_ignore, target), chosen_ignore)
    except SelectionError as exc:
        raise fail(str(exc)) from None


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
        str | None,
        typer.Argument(
            help="Show the documentation of this rule (id or name), or list a prefix's rules (NPU9).", metavar="RULE"
        ),
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
    listed = all_rules()
    if rule_id is not None and rule_id.upper() not in {r.id for r in listed}:
        # A prefix (`NPU9`, `NPU70`) lists that family, as --select takes it; a name or id shows one rule.
        family = [r for r in listed if r.id.startswith(rule_id.upper())]
        if family and rule_id[:3].upper() == "NPU":
            listed, rule_id = family, None
    if rule_id is None:
        if config.path is not None:
            typer.echo(f"configuration: {config.path}")
        for known in listed:
            state = "on" if known.id in enabled else "off"
            targets = ",".join(sorted(known.targets))
            typer.echo(
                f"{known.id}  {state:<3} {known.family:<16} {targets:<12} {known.fix_safety.value:<12} {known.summary}"
            )
        return
    try:
        found = rule(rule_id)
    except KeyError:
        raise fail(f"unknown rule {rule_id!r}; `npu-migrate rules` lists them") from None
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
