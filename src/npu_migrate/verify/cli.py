"""The `npu-migrate verify` command, as a typer-compatible function the main app registers.

Exit codes: 0 the outputs agree and the fused branches ran; 1 they disagree, a fused branch failed or
rejected its arguments, or no fused branch ran at all; 2 bad usage or an error in the user's own code
(the factory, or the original tree). `--smoke` runs the migrated program on a simulated NPU host
instead (`npu_migrate.verify.smoke`), with the same exit-code meanings.
"""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Annotated, Optional

import typer

EXIT_OK, EXIT_FAILED, EXIT_ERROR = 0, 1, 2


class VerifyDtype(str, enum.Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class VerifyFormat(str, enum.Enum):
    text = "text"
    json = "json"


class VerifyMode(str, enum.Enum):
    auto = "auto"
    reference = "reference"
    npu = "npu"


def verify_command(
    migrated: Annotated[Path, typer.Option("--migrated", help="The tree `npu-migrate apply` wrote.")],
    original: Annotated[
        Optional[Path],
        typer.Option(
            "--original",
            help="The tree before migration (put first on sys.path). With --smoke: optional, names the rewrites "
            "behind a crash.",
        ),
    ] = None,
    factory: Annotated[
        Optional[Path],
        typer.Option(
            "--factory", help="A .py file whose build() returns (model, inputs); inputs: a tensor, tuple or dict."
        ),
    ] = None,
    min_cosine: Annotated[
        float, typer.Option("--min-cosine", help="Fail when any output's cosine similarity is below this.")
    ] = 0.99,
    dtype: Annotated[
        VerifyDtype, typer.Option("--dtype", help="Cast the model and its floating-point inputs to this dtype.")
    ] = VerifyDtype.float32,
    output_format: Annotated[VerifyFormat, typer.Option("--format", help="Report format.")] = VerifyFormat.text,
    seed: Annotated[
        int, typer.Option("--seed", help="Seed for weights, inputs and dropout, the same on both sides.")
    ] = 0,
    mode: Annotated[
        VerifyMode,
        typer.Option(
            "--mode",
            help="Where the fused branches run: auto (NPU if present, else the CPU reference), reference, or npu.",
        ),
    ] = VerifyMode.auto,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show tracebacks of failures.")] = False,
    smoke: Annotated[
        bool,
        typer.Option(
            "--smoke",
            help="Run the migrated program's entry (--factory, --module or --script) on a simulated Ascend host "
            "and report crashes, with the rewrites behind them when --original is given.",
        ),
    ] = False,
    module: Annotated[
        Optional[str], typer.Option("--module", help="--smoke: a module of the migrated tree to import.")
    ] = None,
    script: Annotated[
        Optional[Path], typer.Option("--script", help="--smoke: a script to run as __main__ (see --args).")
    ] = None,
    script_args: Annotated[
        str, typer.Option("--args", help="--smoke: the script's arguments, one shell-quoted string.")
    ] = "",
    torch_npu_version: Annotated[
        Optional[str],
        typer.Option("--torch-npu-version", help="--smoke: the torch_npu version the simulated host has."),
    ] = None,
    device_count: Annotated[int, typer.Option("--device-count", help="--smoke: NPUs on the simulated host.")] = 1,
    timeout: Annotated[
        Optional[float], typer.Option("--timeout", help="--smoke: seconds before the run is given up.")
    ] = None,
) -> None:
    """Check that the migrated code computes what the original does, with its fused NPU branches running.

    Imports the factory in two fresh processes, one with --original and one with --migrated first on
    sys.path, seeded alike, and compares one forward pass output by output. Without an NPU the fused
    branches run on a CPU model of the torch_npu ops that also enforces their documented constraints.

    With --smoke: runs the migrated program (a factory, a module or a script) on a simulated Ascend host
    and reports each crash at its file:line, with the rewrites behind it when --original is given.
    """
    if smoke:
        _smoke(
            migrated,
            original,
            factory,
            module,
            script,
            script_args,
            torch_npu_version,
            device_count,
            timeout,
            output_format,
            verbose,
        )
    from npu_migrate.verify.harness import VerifyUsageError, compare

    if original is None or factory is None:
        _usage_error("--original and --factory are required (or --smoke)", output_format)
    if module or script or script_args or torch_npu_version:
        _usage_error("--module, --script, --args and --torch-npu-version go with --smoke", output_format)
    try:
        report = compare(
            original, migrated, factory, min_cosine=min_cosine, dtype=dtype.value, seed=seed, mode=mode.value
        )
    except VerifyUsageError as exc:
        _usage_error(str(exc), output_format, exc.detail, verbose)
    if output_format is VerifyFormat.json:
        typer.echo(report.to_json())
    else:
        typer.echo(report.to_text(verbose=verbose))
    raise typer.Exit(EXIT_OK if report.passed else EXIT_FAILED)


def _usage_error(message: str, output_format: VerifyFormat, detail: str = "", verbose: bool = False):
    typer.echo(f"npu-migrate verify: error: {message}", err=True)
    if verbose and detail:
        typer.echo(detail.rstrip(), err=True)
    if output_format is VerifyFormat.json:
        typer.echo(json.dumps({"passed": False, "error": message}, indent=2))
    raise typer.Exit(EXIT_ERROR) from None


def _smoke(migrated, original, factory, module, script, script_args, version, device_count, timeout, fmt, verbose):
    import shlex

    from npu_migrate.verify.smoke import SmokeUsageError, run

    try:
        args = shlex.split(script_args)
        if args and not script:
            raise SmokeUsageError("--args goes with --script")
        report = run(
            migrated,
            factory=factory,
            module=module,
            script=script,
            args=args,
            original=original,
            torch_npu_version=version,
            device_count=device_count,
            timeout=timeout,
        )
    except ValueError as exc:  # shlex: an unclosed quote
        _usage_error(f"--args: {exc}", fmt)
    except SmokeUsageError as exc:
        _usage_error(str(exc), fmt, exc.detail, verbose)
    typer.echo(report.to_json() if fmt is VerifyFormat.json else report.to_text(verbose=verbose))
    raise typer.Exit(report.exit_code)
