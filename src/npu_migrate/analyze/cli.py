"""`npu-migrate analyze`: the command. Thin: it checks the options and hands over to `core.analyse`.

Exit codes: 0 the analysis ran (findings are the report, not a failure); 2 bad usage, a path that does
not exist, an unreadable --api-files CSV, an output folder that cannot be written, or a source file that
could not be read or parsed (each named on stderr; the other files are still analysed and reported).
"""

from __future__ import annotations

import enum
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from npu_migrate.analyze import MODES
from npu_migrate.cli.command import CONTEXT_SETTINGS, Command, examples, run
from npu_migrate.cli.shared import EXIT_ERROR, fail

#: What --mode accepts: the registered modes, and `all` for every one.
MODE_CHOICES = (*MODES, "all")

ANALYZE_EXAMPLES = examples(
    "npu-migrate analyze src/                             # the torch APIs used, and their NPU support",
    "npu-migrate analyze --mode all -o report/ src/       # every analysis; report/report.html to read",
    "npu-migrate analyze --mode third_party,custom_kernels --exclude 'tests/*' src/   # two analyses, no tests",
)


class ReportFormat(str, enum.Enum):
    text = "text"
    markdown = "markdown"
    html = "html"
    csv = "csv"
    json = "json"
    sarif = "sarif"


def analyze_command(
    paths: Annotated[
        list[Path], typer.Argument(help="Files or folders to analyse.", metavar="PATH", show_default=False)
    ],
    mode: Annotated[
        Optional[list[str]],
        typer.Option(
            "--mode",
            "-m",
            metavar="MODES",
            help=f"Analyses to run, comma-separated or repeated (default torch_apis; `all`: every one): "
            f"{', '.join(MODES)}.",
        ),
    ] = None,
    select: Annotated[
        Optional[list[str]],
        typer.Option(
            "--select", metavar="RULES", help="Rule ids or prefixes to report, comma-separated (default: ALL)."
        ),
    ] = None,
    ignore: Annotated[
        Optional[list[str]], typer.Option("--ignore", metavar="RULES", help="Rule ids or prefixes not to report.")
    ] = None,
    exclude: Annotated[
        Optional[list[str]], typer.Option("--exclude", metavar="GLOB", help="Glob of paths to skip (repeatable).")
    ] = None,
    output: Annotated[
        Optional[Path],
        typer.Option(
            "--output", "-o", help="Write the CSVs, report.json, report.sarif, report.md and report.html here."
        ),
    ] = None,
    output_format: Annotated[
        Optional[ReportFormat],
        typer.Option(
            "--format",
            help="What to print on stdout (default text; with --output nothing, unless --format is given).",
            show_default=False,
        ),
    ] = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Print errors only: no report on stdout, no summary, no progress.")
    ] = False,
    torch_npu_version: Annotated[
        Optional[str],
        typer.Option("--torch-npu-version", help="torch_npu version to judge support against (default: newest known)."),
    ] = None,
    env_path: Annotated[
        Optional[list[Path]],
        typer.Option(
            "--env-path",
            help="Library source tree to analyse for third_party (repeatable): writes full_unsupported_results.csv.",
        ),
    ] = None,
    api_files: Annotated[
        Optional[list[Path]],
        typer.Option("--api-files", help="full_unsupported_results.csv of an earlier --env-path run (repeatable)."),
    ] = None,
    instrument: Annotated[
        Optional[Path],
        typer.Option(
            "--instrument", help="dynamic_shape: write an instrumented copy here that records the shapes it sees."
        ),
    ] = None,
    jobs: Annotated[
        Optional[int], typer.Option("--jobs", "-j", min=1, help="Worker processes (default: all cores).")
    ] = None,
    no_gitignore: Annotated[
        bool, typer.Option("--no-gitignore", help="Also analyse files git ignores (a package inside a virtualenv).")
    ] = False,
    config_file: Annotated[
        Optional[Path], typer.Option("--config", help="pyproject.toml to read (default: found from PATHS upwards).")
    ] = None,
    no_cache: Annotated[
        bool,
        typer.Option("--no-cache", help="Neither read nor write .npu_migrate_cache/ (config: cache = false)."),
    ] = False,
) -> None:
    """Analyse a code base for the move to Ascend NPUs: APIs, libraries, kernels, fused ops, shapes, model."""
    # Here, not at the top: every `npu-migrate` run imports this module, and only `analyze` needs the engine.
    from npu_migrate.analyze.core import analyse
    from npu_migrate.analyze.output import render, summary_lines, write_reports
    from npu_migrate.analyze.project import AnalysisError, Project, Settings
    from npu_migrate.cli.config import ConfigError, discover_config, split_codes
    from npu_migrate.engine.cache import cache_root
    from npu_migrate.engine.registry import SelectionError, fused_rule_names, rules_tagged, select_rules
    from npu_migrate.engine.runner import Progress
    from npu_migrate.program.api import NpuApi, UnknownVersionError

    chosen = split_codes(mode) or ["torch_apis"]
    unknown = [m for m in chosen if m not in MODE_CHOICES]
    if unknown:
        raise fail(f"--mode {unknown[0]!r}: unknown analysis (known: {', '.join(MODE_CHOICES)})")
    modes = MODES if "all" in chosen else tuple(m for m in MODES if m in chosen)
    if instrument is not None and "dynamic_shape" not in modes:
        raise fail("--instrument needs --mode dynamic_shape (or --mode all)")
    if (env_path or api_files) and "third_party" not in modes:
        raise fail("--env-path and --api-files need --mode third_party (or --mode all)")
    for given in paths:
        if not given.exists():
            raise fail(f"{given}: no such file or directory")
    try:
        config = discover_config(paths, config_file)
        chosen_ignore = split_codes(ignore) if ignore else list(config.ignore)
        chosen_select = split_codes(select) or list(config.select or ["ALL"])
        enabled = select_rules(*config.with_fused(chosen_select, chosen_ignore, fused_rule_names()))
        opt_in = [r.id for r in rules_tagged("lever") if "opt-in" in r.tags]
        levers = select_rules(opt_in, chosen_ignore) - enabled if opt_in else frozenset()
        version = torch_npu_version or config.torch_npu_version
        NpuApi(version)
    except (ConfigError, SelectionError, UnknownVersionError) as exc:
        raise fail(str(exc)) from None

    settings = Settings(
        modes=modes,
        enabled=enabled,
        levers=levers,
        torch_npu_version=version,
        env_paths=tuple(env_path or ()),
        api_files=tuple(api_files or ()),
        jobs=jobs,
    )
    excludes = [(pattern, config.root) for pattern in config.exclude] + [
        (pattern, Path.cwd()) for pattern in split_codes(exclude)
    ]
    bar = Progress(0, "analysing", enabled=not quiet)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.advance()

    try:
        try:
            analysis = analyse(
                paths,
                settings,
                ignored_for=config.ignored_for,
                excludes=excludes,
                respect_gitignore=not no_gitignore,
                progress=progress,
                cache_root=cache_root(paths, config.path) if config.cache and not no_cache else None,
            )
        finally:
            bar.clear()
        for path, reason in analysis.errors:
            typer.echo(f"{analysis.shown(path)}: error: {reason}", err=True)
        if instrument is not None:
            from npu_migrate.analyze.modes import dynamic_shape

            project = Project(analysis.root, settings, None, analysis.files, list(paths))
            written = dynamic_shape.instrument(project, instrument)
            typer.echo(
                f"instrumented {len(written)} files into {instrument}; run it there, then read "
                f"{dynamic_shape.SHAPES_CSV}",
                err=True,
            )
        if output is not None:
            if output.exists() and not output.is_dir():
                raise AnalysisError(f"--output {output}: exists and is not a folder")
            write_reports(analysis, output)
    except AnalysisError as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"{exc.filename or output}: {exc.strerror or exc}") from None

    # With --output the reports are in the folder: the terminal gets the summary, not the report again
    # (4,000 lines on a large tree), unless a --format asks for it on stdout.
    shown = output_format or (None if output is not None else ReportFormat.text)
    if shown is not None and not quiet:
        sys.stdout.write(render(analysis, shown.value))
    if not quiet:
        # With a machine-readable format stdout is the document alone; the summary goes to stderr.
        for line in summary_lines(analysis):
            typer.echo(line, err=shown is not ReportFormat.text)
        if output is not None:
            typer.echo(f"reports written to {output}", err=True)
    if analysis.errors:
        raise typer.Exit(EXIT_ERROR)


def main() -> None:
    """`python -m npu_migrate.analyze.cli`: the command on its own, before `npu-migrate` registers it."""
    app = typer.Typer(
        add_completion=False, pretty_exceptions_enable=False, context_settings=CONTEXT_SETTINGS, rich_markup_mode=None
    )
    app.command("analyze", cls=Command, epilog=ANALYZE_EXAMPLES)(analyze_command)
    run(app)


if __name__ == "__main__":
    main()
