"""Wheels from PyPI, fetched once into a cache and read without installing or importing them.

Both table generators read what a package exposes from its wheels' files (torch_npu cannot be imported
without CANN, and importing eight torches is slow), so both need the same fetch: one pinned version,
no dependencies, a platform whose wheel exists for every version they cover.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

#: The Python whose wheels are fetched: the oldest the project supports.
PYTHON_VERSION = "3.11"


def cached_wheel(cache: Path, package: str, version: str) -> Path | None:
    """The cached wheel of `package==version`, if any. x86 wheels sort before aarch64 ones, which keeps
    the choice stable when both are cached."""
    matches = sorted(cache.glob(f"{package}-{version}-*.whl"), key=lambda p: ("aarch64" in p.name, p.name))
    return matches[0] if matches else None


def download_wheel(cache: Path, package: str, version: str, platform_groups: list[list[str]]) -> Path | None:
    """Fetch one wheel into the cache, trying each group of platforms in turn; None (after a warning on
    stderr) if pip cannot."""
    last_error = ""
    for platforms in platform_groups:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            PYTHON_VERSION,
            "--disable-pip-version-check",
            "--quiet",
            "-d",
            str(cache),
        ]
        for platform in platforms:
            command += ["--platform", platform]
        command.append(f"{package}=={version}")
        completed = subprocess.run(command, capture_output=True, text=True)
        wheel = cached_wheel(cache, package, version)
        if completed.returncode == 0 and wheel is not None:
            return wheel
        last_error = (completed.stderr.strip().splitlines() or ["no output"])[-1]
    print(f"warning: skipping {package} {version}: pip download failed ({last_error})", file=sys.stderr)
    return None
