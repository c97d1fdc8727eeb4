"""What every command shares: the exit codes, a one-line error, and how paths are shown."""

from __future__ import annotations

import os
from pathlib import Path

import typer

EXIT_OK, EXIT_CHANGES, EXIT_ERROR = 0, 1, 2


def fail(message: str) -> typer.Exit:
    """Say what is wrong in one line on stderr; the caller raises what this returns (exit 2)."""
    typer.echo(f"npu-migrate: error: {message}", err=True)
    return typer.Exit(EXIT_ERROR)


def absolute(path: Path) -> Path:
    # Not Path.resolve(): it follows symlinks (and raises on a symlink loop); paths here stay as given.
    return Path(os.path.abspath(path))


def display(path: Path, root: Path) -> str:
    """Paths in diffs and findings: relative to the current folder (so `git apply` works from the
    repository root), else relative to the common root of the inputs."""
    resolved = absolute(path)
    for base in (absolute(Path.cwd()), root):
        try:
            return resolved.relative_to(base).as_posix()
        except ValueError:
            continue
    return path.as_posix()


def relative_to(path: Path, base: Path) -> str:
    try:
        return absolute(path).relative_to(absolute(base)).as_posix()
    except ValueError:
        return path.as_posix()


def common_root(paths: list[Path]) -> Path:
    dirs = [absolute(p) if p.is_dir() else absolute(p).parent for p in paths]
    return Path(os.path.commonpath([str(d) for d in dirs]))
