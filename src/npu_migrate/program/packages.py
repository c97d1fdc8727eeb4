"""Where a package's fused-op helper module goes, and how its files import it.

A package's files import it relatively (`from .._npu_fused import ...`), from its top package as far up as
their own relative imports prove (`helper_module`, `proven_module`). A folder that is no package gets one
too where its own files prove the folder is on `sys.path` whenever they run (`sibling_modules`: a script
project whose files import each other as `from model import GPT`); its files import it as a top-level
module, `from _npu_fused import ...`. `_npu_fused` is then one global name, so only where nothing can
import another folder's module in its place (`run_sibling_modules`: one such folder in the run, and no
file of its script folders touching `sys.path`). A `_npu_fused.py` that npu-migrate did not write is
never used nor edited (`foreign_modules`): appended to, it would lack our prelude (`import torch`,
`_is_npu`) or shadow it with the user's own. Every other file keeps its helpers inline.

Kept apart from `helper_modules` (what the module holds, and writing it), which needs the fused rules and
so libcst: the driver asks every file's helper import before the run, and a run whose files no rule wants
must not import them (start-up of `apply --check`).
"""

from __future__ import annotations

import ast
import functools
import re
import sys
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


def is_sibling(module: str) -> bool:
    """Whether `module` (a file's helper module) is a sibling one, imported by its top-level name."""
    return not module.startswith(".")


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
    if is_sibling(bound):
        return bound  # `sibling_modules` proved it from the folder's files, this one's imports included
    proven = max(
        (s.level for s in tree.body if isinstance(s, ast.ImportFrom) and s.module != MODULE),
        default=0,
    )
    level = min(_level(bound), proven)
    return relative_module(level) if level else None


def runs_as_script(tree: ast.Module) -> bool:
    """Whether the file has an `if __name__ == "__main__":` block: run as `python pkg/train.py` it has no
    package to import relatively from."""
    for stmt in tree.body:
        if isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Compare) and len(stmt.test.comparators) == 1:
            sides = [stmt.test.left, stmt.test.comparators[0]]
            if any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and any(
                isinstance(s, ast.Constant) and s.value == "__main__" for s in sides
            ):
                return True
    return False


def usable_module(bound: str | None, tree: ast.Module) -> str | None:
    """The helper module the file whose tree is `tree` imports its helpers from (`proven_module`), or None
    where it keeps them inline: also a package's file run as a script (its relative import would fail), not
    a script folder's, whose folder is sys.path[0] when it runs."""
    module = proven_module(bound, tree)
    if module is None or is_sibling(module) or not runs_as_script(tree):
        return module
    return None


def module_file(path: Path, module: str) -> Path:
    """The file of the helper module that `path` imports as `module` (a sibling one: in its own folder)."""
    folder = path.absolute().parent
    for _ in range(_level(module) - 1):
        folder = folder.parent
    return folder / f"{MODULE}.py"


def possible_module_files(path: Path, bound: str | None) -> list[Path]:
    """Every helper module file the file `path` may import, given `bound` (`helper_module`): the file
    proves how far up it may go only once migrated (`proven_module`), so each level up to the bound."""
    if bound is None:
        return []
    if is_sibling(bound):
        return [module_file(path, bound)]
    return [module_file(path, relative_module(level)) for level in range(1, _level(bound) + 1)]


def collect(into: dict[Path, set[str]], path: Path, module: str | None, names: Iterable[str]) -> None:
    """Note that the file `path` imports `names` from its helper `module`."""
    if module is not None and names:
        into.setdefault(module_file(path, module), set()).update(names)


# -- script folders ---------------------------------------------------------------------------------------

#: A line that may start a top-level import: only such files are parsed (most files of a folder import no
#: sibling, and a run must not parse every script of a large tree twice).
_IMPORT_LINE = re.compile(rb"^(?:import|from)[ \t][^\n]*", re.M)
_WORD = re.compile(rb"[A-Za-z_]\w*")
#: Names that are never a sibling import: the running script, a package's own file, and the standard
#: library's modules, which a sibling of the same name shadows only where the folder is on sys.path
#: already, so importing one proves nothing.
_NOT_SIBLINGS = frozenset({"__main__", "__init__", MODULE, *sys.stdlib_module_names, *sys.builtin_module_names})


def sibling_modules(files: Iterable[Path]) -> dict[Path, str]:
    """The Python files among `files` that get a sibling helper module (`_npu_fused.py` in their own folder,
    imported as `from _npu_fused import ...`), each mapped to that module's name. A file qualifies where its
    folder is no package (`helper_module` gave None) and the folder's own files prove it is on `sys.path`
    whenever the file runs:

    * the file imports a sibling module by its top-level name (`from model import GPT`, `model.py` beside
      it): it cannot run unless its folder is on sys.path; or
    * a sibling imports the file by its top-level name: the project runs it with its folder on sys.path.

    A sibling package does not count (`from mypkg import x` beside `mypkg/`): installed, it imports from
    anywhere. Nor does a module that a package of the same name beside it shadows.

    Only unconditional imports at a file's top level count (one in a `try:` or a function may never run),
    never the helper import itself; notebooks neither get the module nor count (a notebook travels alone).
    The siblings are read from disk whether or not the run includes them: a file given alone is decided
    as in a run of its folder. What this cannot see is an importer outside the folder that names the file
    another way (`from project.model import GPT` through a namespace package): the project's own imports
    say that is not how it runs. Every file that qualifies keeps the module when migrated again, which
    keeps a second run unchanged."""
    found: dict[Path, str] = {}
    folders: dict[Path, dict[str, set[str]]] = {}
    for path in files:
        if path.suffix != ".py" or path.stem == MODULE or helper_module(path) is not None:
            continue
        folder = path.absolute().parent
        if folder not in folders:
            folders[folder] = _sibling_imports(folder)
        imports = folders[folder]
        if imports.get(path.stem) or any(path.stem in names for names in imports.values()):
            found[path] = MODULE
    return found


def _sibling_imports(folder: Path) -> dict[str, set[str]]:
    """For each `.py` file of `folder`, by its stem: the sibling modules (other `.py` files of `folder`) that
    it imports by their top-level names, unconditionally at its top level."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return {}
    modules = {p.stem: p for p in entries if p.suffix == ".py" and p.stem.isidentifier() and p.is_file()}
    if len(modules) < 2:
        return {}
    # `import model` finds `model/` before `model.py` in the same folder: that import says nothing of it.
    siblings = {stem for stem in modules if not (folder / stem / "__init__.py").is_file()} - _NOT_SIBLINGS
    found = {}
    for stem, path in modules.items():
        names = _top_level_imports(path, siblings - {stem})
        if names:
            found[stem] = names
    return found


def _top_level_imports(path: Path, siblings: set[str]) -> set[str]:
    """Which of `siblings` the file `path` imports by top-level name, unconditionally at its top level."""
    try:
        raw = path.read_bytes()
    except OSError:
        return set()
    end = 0
    for line in _IMPORT_LINE.finditer(raw):
        if siblings.intersection(w.decode() for w in _WORD.findall(line.group())):
            end = line.end()
    if not end:
        return set()
    # Parsed only up to that line: a prefix that parses is made of the whole file's own top-level statements
    # (one cut inside a string, a bracket or a block does not parse), and a module's imports are its head.
    tree = _parsed(raw[:end]) or _parsed(raw)
    if tree is None:
        return set()
    found = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            found.update(alias.name.split(".")[0] for alias in stmt.names)
        elif isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module:
            found.add(stmt.module.split(".")[0])
    return found & siblings


def _parsed(raw: bytes) -> ast.Module | None:
    try:
        return ast.parse(raw)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


# -- what keeps the helpers inline after all ---------------------------------------------------------------

#: The first line of the docstring of every helper module npu-migrate wrote (templates/fused/
#: module_header.py.j2, this version's and earlier ones'): only such a module is appended to.
_GENERATED = re.compile(
    rb'\A(?:#[^\n]*\n|\s)*(?:[rR]?"""|[rR]?\'\'\')Fused torch_npu helpers [^\n]*: generated by npu-migrate\.'
)


def is_generated(path: Path) -> bool:
    """Whether the helper module file `path` is one npu-migrate wrote (its header says so). A user's own
    `_npu_fused.py` is never edited: appending helpers to it would run them without the prelude they
    need (`import torch`, `_is_npu`), or with the user's own `_is_npu` in place of ours."""
    try:
        with path.open("rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return _GENERATED.match(head) is not None


def foreign_modules(bounds: dict[Path, str | None]) -> tuple[dict[Path, str | None], list[Path]]:
    """`bounds` (file -> `helper_module`, or a sibling module), less every file that may import a helper
    module (`possible_module_files`) which exists and which npu-migrate did not write (`is_generated`):
    those keep their helpers inline. Also the user's modules so found, to say why."""
    found: set[Path] = set()
    kept: dict[Path, str | None] = {}
    for path, bound in bounds.items():
        foreign = [m for m in possible_module_files(path, bound) if m.is_file() and not is_generated(m)]
        found.update(foreign)
        kept[path] = None if foreign else bound
    return kept, sorted(found)


def run_sibling_modules(files: Iterable[Path], others: Iterable[Path]) -> tuple[dict[Path, str], str]:
    """`sibling_modules(files)` (the files of no package), unless a top-level `_npu_fused` could be
    ambiguous when they run: then none, and why. `_npu_fused` is one top-level name: two script folders
    that each hold one collide as soon as both are on sys.path (`tools/eval.py` doing
    `sys.path.insert(0, "..")` imports the first one found, which lacks the other's helpers). So a folder
    gets its module only where no other folder of no package among the run's files (`files`, `others`:
    the package files) holds one or would get one, and no file of the run's script folders touches
    `sys.path` (it may reach a folder outside the run). Conservative: a plain text search."""
    files = list(files)
    found = sibling_modules(files)
    if not found:
        return found, ""
    folders = {p.absolute().parent for p in found}
    holders = {
        p.absolute().parent
        for p in [*files, *others]
        if p.name == f"{MODULE}.py" and helper_module(p) is None and p.is_file()
    }
    if len(folders | holders) > 1:
        return {}, f"more than one folder of no package would hold a top-level {MODULE}.py, and they would collide"
    for folder in sorted({p.absolute().parent for p in files if p.suffix == ".py"}):
        for script in sorted(folder.glob("*.py")):
            if script.stem != MODULE and _touches_sys_path(script):
                where = f"{folder.name}/{script.name}" if folder.name else script.name
                return {}, f"{where} changes sys.path, which could import another folder's {MODULE}.py"
    return found, ""


def _touches_sys_path(path: Path) -> bool:
    """Whether the file `path` names `sys.path` in its code (`sys.path.insert(...)`, `from sys import
    path`): a text search, then the tree, so that a docstring that mentions sys.path does not count. A file
    that does not parse counts (nothing proves it does not)."""
    try:
        raw = path.read_bytes()
    except OSError:
        return False
    if b"sys.path" not in raw and not re.search(rb"from\s+sys\s+import", raw):
        return False
    tree = _parsed(raw)
    if tree is None:
        return True
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name):
            if node.value.id == "sys":
                return True
        elif isinstance(node, ast.ImportFrom) and node.module == "sys":
            return True
    return False
