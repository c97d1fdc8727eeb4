"""Where a package's fused-op helper module goes, and how its files import it.

Kept apart from `helper_modules` (what the module holds, and writing it), which needs the fused rules and
so libcst: the driver asks every file's helper import before the run, and a run whose files no rule wants
must not import them (start-up of `apply --check`).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable
from pathlib import Path

#: The helper module's name, next to the top package's `__init__.py`.
MODULE = "_npu_fused"

#: A folder holding one of these is a project's root, not a package, even with an `__init__.py` in it
#: (then it is mostly a leftover): a relative import that climbed into it could fail.
_PROJECT_ROOT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")


def relative_module(level: int) -> str:
    """How a file `level` packages below the helper module's folder names it: 1 -> `._npu_fused`."""
    return "." * level + MODULE


def _level(module: str) -> int:
    return len(module) - len(module.lstrip("."))


def helper_module(path: Path, stop: Path | None = None) -> str | None:
    """How the Python file `path` imports its package's helper module (`.._npu_fused`), or None where it
    gets the helpers inline: a file whose folder is no package, or a `__main__.py` (`python pkg/` runs it
    without its package). The module goes to the top package: up the chain of folders with an
    `__init__.py`, as long as their names can be imported and none is a project root, and not above
    `stop` (the root of an `--output` tree, which holds nothing above it). That is an upper bound: the
    worker lowers it to what the file proves (`proven_module`)."""
    if path.suffix != ".py" or path.name == "__main__.py":
        return None
    folder = path.absolute().parent
    if not _is_package(folder):
        return None
    level = 1
    while folder != stop and folder.parent != folder and _is_package(folder.parent):
        folder = folder.parent
        level += 1
    return relative_module(level)


@functools.cache
def _is_package(folder: Path) -> bool:
    return (
        (folder / "__init__.py").is_file()
        and folder.name.isidentifier()
        and not any((folder / marker).exists() for marker in _PROJECT_ROOT_MARKERS)
    )


def proven_module(bound: str | None, tree: ast.Module) -> str | None:
    """How the file whose tree is `tree` imports the helper module, given `bound` (`helper_module`, from its
    path alone), or None where it keeps the helpers inline. The folders with an `__init__.py` above a file
    do not say where Python imports it from (a leftover `__init__.py` in `src/`, a folder put on
    `sys.path`), but the file's own relative imports do: `from ..utils import x` at its top level runs only
    where the file is imported two packages deep, so `.._npu_fused` resolves too. Only unconditional
    top-level imports prove it (one in a `try:` or a function may never run), and not the helper import
    itself, which the tool wrote."""
    if bound is None:
        return None
    proven = max(
        (s.level for s in tree.body if isinstance(s, ast.ImportFrom) and s.module != MODULE),
        default=0,
    )
    level = min(_level(bound), proven)
    return relative_module(level) if level else None


def module_file(path: Path, module: str) -> Path:
    """The file of the helper module that `path` imports as `module`."""
    folder = path.absolute().parent
    for _ in range(_level(module) - 1):
        folder = folder.parent
    return folder / f"{MODULE}.py"


def possible_module_files(path: Path, bound: str | None) -> list[Path]:
    """Every helper module file the file `path` may import, given `bound` (`helper_module`): the file
    proves how far up it may go only once migrated (`proven_module`), so each level up to the bound."""
    if bound is None:
        return []
    return [module_file(path, relative_module(level)) for level in range(1, _level(bound) + 1)]


def collect(into: dict[Path, set[str]], path: Path, module: str | None, names: Iterable[str]) -> None:
    """Note that the file `path` imports `names` from its helper `module`."""
    if module is not None and names:
        into.setdefault(module_file(path, module), set()).update(names)
