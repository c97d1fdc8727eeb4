"""The `npu-migrate verify` command, as a typer-compatible function the main app registers.

Exit codes: 0 the outputs agree and the fused branches ran; 1 they disagree, a fused branch failed or
rejected its arguments, or no fused branch ran at all; 2 bad usage or an error in the user's own code
(the factory, or the original tree).
"""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Annotated

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
    original: Annotated[Path, typer.Option("--original", help="The tree before migration (put first on sys.path).")],
    migrated: Annotated[Path, typer.Option("--migrated", help="The tree `npu-migrate apply` wrote.")],
    factory: Annotated[
        Path,
        typer.Option(
            "--factory", help="A .py file whose build() returns (model, inputs); inputs: a tensor, tuple or dict."
        ),
    ],
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
) -> None:
    """Check that the migrated code computes what the original does, with its fused NPU branches running.

    Imports the factory in two fresh processes, one with --original and one with --migrated first on
    sys.path, seeded alike, and compares one forward pass output by output. Without an NPU the fused
    branches run on a CPU model of the torch_npu ops that also enforces their documented constraints.
    """
    from npu_migrate.verify.harness import VerifyUsageError, compare

    try:
        report = compare(
            original, migrated, factory, min_cosine=min_cosine, dtype=dtype.value, seed=seed, mode=mode.value
        )
    except VerifyUsageError as exc:
        typer.echo(f"npu-migrate verify: error: {exc}", err=True)
        if verbose and exc.detail:
            typer.echo(exc.detail.rstrip(), err=True)
        if output_format is VerifyFormat.json:
            typer.echo(json.dumps({"passed": False, "error": str(exc)}, indent=2))
        raise typer.Exit(EXIT_ERROR) from None
    if output_format is VerifyFormat.json:
        typer.echo(report.to_json())
    else:
        typer.echo(report.to_text(verbose=verbose))
    raise typer.Exit(EXIT_OK if report.passed else EXIT_FAILED)
