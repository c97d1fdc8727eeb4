"""Finding the files to migrate under the paths the user gave.

Walks directories without following symbolic links, skips version-control, virtualenv, build and cache
folders, honours `.gitignore` inside a git work tree (through `git check-ignore`, so the rules are
exactly git's), and applies `--exclude` globs. Paths named explicitly are taken as given, except that a
missing path is an error.
"""

from __future__ import annotations

import fnmatch
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

SKIPPED_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        ".venv",
        "venv",
        ".env",
        "env",
        "site-packages",
        "dist-packages",
        "__pycache__",
        "build",
        "dist",
        ".eggs",
        ".tox",
        ".nox",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".npu_migrate_cache",  # our own result cache (engine/cache.py): thousands of entries, never input
        ".hypothesis",
        "node_modules",
        ".ipynb_checkpoints",
    }
)


@dataclass
class Discovery:
    files: list[Path] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    git_ignored: int = 0  # files left out because git ignores them (--no-gitignore takes them)
    excluded: int = 0  # files and folders left out by an exclude glob
    #: (path, reason) of files met while walking and left out for a reason the user should hear: a
    #: broken symbolic link or a symlink loop under a name npu-migrate reads (`train.py` -> nowhere).
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def nothing_found(self, paths: list[Path]) -> str:
        """Why a run found no file, and how to include what it left out."""
        where = ", ".join(str(p) for p in paths) or "."
        reasons = []
        if self.git_ignored:
            reasons.append(f"{self.git_ignored} files ignored by git (pass --no-gitignore to include them)")
        if self.excluded:
            reasons.append(f"{self.excluded} files or folders excluded by --exclude or the configuration's `exclude`")
        why = (
            "; ".join(reasons)
            if reasons
            else ("npu-migrate reads .py, .ipynb, .sh/.bash, Dockerfile, .env, .yaml/.yml and .cu/.cuh files")
        )
        return f"no file to migrate found under {where}: {why}"


def is_skipped_dir(path: Path) -> bool:
    """Folders never walked into: VCS and cache folders, build outputs, virtualenvs under any name."""
    name = path.name
    if name in SKIPPED_DIRS or name.endswith(".egg-info"):
        return True
    # A virtualenv under any name: it holds third-party code that is not the user's to migrate.
    return (path / "pyvenv.cfg").is_file()


def _excluded(path: Path, excludes: list[tuple[str, Path]]) -> bool:
    """Whether a glob excludes `path`. Each glob is relative to its base folder (the current folder for
    --exclude, the configuration's folder for `exclude`); a glob without "/" also matches any single
    path component, so `third_party` skips every folder of that name."""
    for pattern, base in excludes:
        try:
            rel = PurePosixPath(Path(os.path.abspath(path)).relative_to(base).as_posix())
        except ValueError:
            rel = PurePosixPath(path.as_posix())
        if fnmatch.fnmatch(rel.as_posix(), pattern) or rel.match(pattern):
            return True
        if "/" not in pattern and any(fnmatch.fnmatch(part, pattern) for part in rel.parts):
            return True
    return False


def _git_ignored(files: list[Path]) -> set[Path]:
    """The subset of `files` that git ignores; empty when git is missing or a file is outside a work tree."""
    by_root: dict[Path, list[Path]] = {}
    for f in files:
        by_root.setdefault(f.parent, []).append(f)
    ignored: set[Path] = set()
    for folder, group in by_root.items():
        try:
            proc = subprocess.run(
                ["git", "-C", str(folder), "check-ignore", "--stdin", "-z"],
                input=b"\0".join(os.fsencode(p.name) for p in group),
                capture_output=True,
                timeout=60,
            )
        except (OSError, subprocess.TimeoutExpired):
            return set()
        if proc.returncode not in (0, 1):  # 128: not a git work tree
            continue
        names = {os.fsdecode(n) for n in proc.stdout.split(b"\0") if n}
        ignored.update(p for p in group if p.name in names)
    return ignored


def _in_git_work_tree(path: Path) -> bool:
    return in_git_work_tree(path)


def in_git_work_tree(path: Path) -> bool:
    """Whether `path` is inside a git work tree (a `.git` folder or file in it or above it)."""
    path = Path(os.path.abspath(path))
    for parent in [path, *path.parents]:
        if (parent / ".git").exists():
            return True
    return False


def discover(
    paths: list[Path],
    accepts: Callable[[Path], bool],
    *,
    excludes: list[tuple[str, Path]] | None = None,
    respect_gitignore: bool = True,
) -> Discovery:
    """Files under `paths` that `accepts`, sorted, each once.

    `excludes` are (glob, base folder) pairs.
    """
    excludes = [(pattern, Path(os.path.abspath(base))) for pattern, base in excludes or []]
    result = Discovery()
    walked: list[Path] = []
    explicit: list[Path] = []
    for given in paths:
        if given.is_symlink() and not os.path.exists(given):
            result.errors.append((str(given), "broken symbolic link (or a symlink loop)"))
            continue
        if not given.exists():
            result.errors.append((str(given), "no such file or directory"))
            continue
        if not given.is_dir() and not given.is_file():
            # A FIFO, socket or device named on the command line: an error for that path, not silence.
            result.errors.append((str(given), "not a regular file or folder; not read"))
            continue
        if given.is_file():
            # Named explicitly (pre-commit passes file names): taken even if a folder rule would skip it.
            if accepts(given):
                if _excluded(given, excludes):
                    result.excluded += 1
                else:
                    explicit.append(given)
            continue
        for dirpath, dirnames, filenames in os.walk(given, followlinks=False):
            folder = Path(dirpath)
            kept = [d for d in dirnames if not is_skipped_dir(folder / d)]
            dirnames[:] = sorted(d for d in kept if not _excluded(folder / d, excludes))
            result.excluded += len(kept) - len(dirnames)
            for name in filenames:
                candidate = folder / name
                if not accepts(candidate):
                    continue
                if candidate.is_symlink():  # a symlink may lead out of the tree; never read or written through
                    if not os.path.exists(candidate):  # a link to a file is a copy; a broken one is news
                        result.skipped.append((str(candidate), "broken symbolic link (or a symlink loop); skipped"))
                    continue
                if _excluded(candidate, excludes):
                    result.excluded += 1
                else:
                    walked.append(candidate)
    if respect_gitignore and walked and any(_in_git_work_tree(p) for p in paths if p.is_dir()):
        ignored = _git_ignored(walked)
        walked = [p for p in walked if p not in ignored]
        result.git_ignored = len(ignored)
    seen: set[Path] = set()
    for f in sorted(explicit + walked):
        key = Path(os.path.realpath(f))
        if key not in seen:
            seen.add(key)
            result.files.append(f)
    return result


def uncommitted(roots: list[Path], files: list[Path]) -> set[Path]:
    """Those of `files` with uncommitted changes (modified or staged) in the git work trees that hold `roots`.
    An in-place apply over them would mix our rewrite with work git cannot give back. An untracked file has
    no uncommitted *changes*: it is new work the user has not added yet, and refusing it would make every
    first run on a new file need --force."""
    tops: set[Path] = set()
    for root in roots:
        folder = root if root.is_dir() else root.parent
        try:
            proc = subprocess.run(
                ["git", "-C", str(folder), "rev-parse", "--show-toplevel"], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return set()
        if proc.returncode == 0:
            tops.add(Path(proc.stdout.strip()))
    changed: set[Path] = set()
    for top in tops:
        try:
            proc = subprocess.run(
                ["git", "-C", str(top), "status", "--porcelain=v1", "-z", "--untracked-files=no"],
                capture_output=True,
                timeout=120,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise GitStateUnknown(top, str(exc)) from None
        if proc.returncode != 0:  # "dubious ownership", a corrupt index: not knowing is not "clean"
            raise GitStateUnknown(top, os.fsdecode(proc.stderr).strip().splitlines()[-1:] or "git status failed")
        entries = proc.stdout.split(b"\0")
        index = 0
        while index < len(entries):
            entry = entries[index]
            index += 1
            if len(entry) > 3:
                changed.add((top / os.fsdecode(entry[3:])).resolve())
                if b"R" in entry[:2] or b"C" in entry[:2]:  # a rename's or copy's original path follows, bare
                    index += 1
    return {f for f in files if f.resolve() in changed}


class GitStateUnknown(Exception):
    """git is there and the files are in a work tree of it, but it cannot say which have changes."""

    def __init__(self, top: Path, reason) -> None:
        reason = reason[0] if isinstance(reason, list) else reason
        super().__init__(f"cannot tell which files under {top} have uncommitted changes: {reason}")
