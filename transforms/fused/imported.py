"""Helpers imported from a sibling module (`from .rope import rotate_half`), read without importing them.

NPU703 recognises a rotary embedding by running the folded function, helpers inlined, on a symbolic
tensor (`evaluator.py`). A helper the file imports from a module next to it is read here, statically: the
module is resolved to a file (`_module_file`), parsed with `ast` (never imported: user code does not run),
and the helper is handed to the inliner (`symbolic.inline_functions`) as if the file defined it. Its own
calls reach the functions of *its* module, and the names it reads (`torch`, `F`) resolve through *its*
imports (`Scope.qualname`); a branch that would read a name of the sibling's that this file does not bind
the same way is declined (`Scope.unbound`). The rewrite stays at the call site, in the file being
migrated; the imported helper stays what the original code calls.

A call reaches a helper four ways: by a name a top-level `from .rope import rotate_half` binds; as
`rope.rotate_half` of a module bound by `from . import rope` or `import pkg.rope as rope` (the package's
`__init__.py` is read too: what it binds to `rope` is what the import gets); by a name an import at the
top of the function's body binds (`_local_imports`: the branch goes after those imports); and, from a
sibling's helper, by a name *its* module imports (`Scope.functions_of`: a scope per module, `MAX_DEPTH`
imports beyond the file's own, sharing what was read).

Bounded and deterministic: only names bound once by an import are followed, at most `MAX_MODULES`
modules of at most `MAX_BYTES` each per file, `MAX_DEPTH` levels. A name (of the file, or a module's def)
that a later top-level `from X import *`, a function's `global`, another binding (a `try` import's
fallback) or, in a function, a later assignment may rebind is not followed: what a call reaches at run
time is not known, and `why` says so (NPU703 turns it into a declined finding, never silence). A module
resolves to one file by fixed rules, the package (`x/__init__.py`) before a module `x.py` beside it, as
Python does:

* relative (`from .rope import f`, `from ..layers import f`): through the package, from the file's folder;
* absolute (`from model_utils import f`): from the file's folder when it is no package (a script's folder
  is on `sys.path`), else from the package root (the folder above its topmost `__init__.py`).

Every file read or looked for is recorded for the result cache (`npu_migrate.engine.depends`): the file's
result depends on it, and a cached result is only reused while each reads the same.
"""

from __future__ import annotations

import ast
import collections
import copy
import dataclasses
import functools
import hashlib
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from npu_migrate.engine import depends
from npu_migrate.program.names import Names

if TYPE_CHECKING:
    from npu_migrate.transforms.fused.symbolic import Function

#: A sibling module larger than this is not read (a generated file is no place for a rotary helper).
MAX_BYTES = 512 * 1024
#: Sibling modules read per file: the rest are declined as unreadable.
MAX_MODULES = 4
#: Why an imported helper is not followed when the file's place on disk is not known (stdin).
NO_FILE = "imported from a module the tool cannot read (the file's place on disk is not known)"
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _bound_once_by_import(tree: ast.Module) -> dict[str, ast.ImportFrom]:
    """The module-level names one top-level `from X import name` binds and nothing else binds (a name a
    later `from X import *` may rebind included: `Scope.lookup` declines it with that reason)."""
    imported, _, counts, _ = _bindings(tree)
    return {name: stmt for name, stmt in imported.items() if counts.get(name) == 1}


def _bound_once_to_a_module(tree: ast.Module) -> dict[str, ast.ImportFrom]:
    """The module-level names bound once, by a top-level import, to what may be a module of the project:
    `from . import rope` and `from pkg import rope` (the import itself, read later as a submodule), `import
    pkg.rope as rope` and `import rope` (as the `ast.ImportFrom` of that module with no names). Nothing else
    may bind the name (as `_bound_once_by_import`)."""
    imported, _, counts, _ = _bindings(tree)
    found: dict[str, ast.ImportFrom] = {name: stmt for name, stmt in imported.items() if counts.get(name) == 1}
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                # `import pkg.rope` binds `pkg`, not the module: only a dotted name with `as` names it.
                name = alias.asname or alias.name
                if "." not in name and counts.get(name) == 1:
                    found[name] = ast.ImportFrom(module=alias.name, names=[], level=0)
    return found


def _module_functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """The functions a module defines once, at top level, and binds no other way (as the fused checker's
    own `_ModuleFunctions`): which definition a call of any other reaches is not known."""
    _, defs, counts, starred = _bindings(tree)
    return {name: node for name, node in defs.items() if counts.get(name) == 1 and name not in starred}


def _bindings(
    tree: ast.Module,
) -> tuple[dict[str, ast.ImportFrom], dict[str, ast.FunctionDef], dict[str, int], dict[str, str]]:
    """(names bound by a top-level `from ... import`, top-level defs, how often each module-level name is
    bound, the names bound before a later top-level `from X import *` -> that X). Kept on the tree: a
    file's scopes ask for it several times (its imports, its modules, its stars)."""
    found = getattr(tree, "_npu_bindings", None)
    if found is None:
        found = tree._npu_bindings = _read_bindings(tree)  # type: ignore[attr-defined]
    return found


def _read_bindings(
    tree: ast.Module,
) -> tuple[dict[str, ast.ImportFrom], dict[str, ast.FunctionDef], dict[str, int], dict[str, str]]:
    counts: dict[str, int] = {}
    imported: dict[str, ast.ImportFrom] = {}
    defs: dict[str, ast.FunctionDef] = {}
    starred: dict[str, str] = {}

    def bind(name: str) -> None:
        counts[name] = counts.get(name, 0) + 1

    def star(stmt: ast.ImportFrom) -> None:
        # `from X import *` binds whatever X defines (or lists in `__all__`), which is not read here: any
        # name bound before it may be rebound, and the last binding is what a call at run time reaches. A
        # name bound after it is that binding (statements at module level run in order).
        starred.update(dict.fromkeys(counts, _spelled(stmt)))

    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                if alias.name == "*":
                    star(stmt)
                else:
                    bind(alias.asname or alias.name)
                    imported[alias.asname or alias.name] = stmt
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                bind(alias.asname or alias.name.split(".")[0])
        elif isinstance(stmt, (*_DEFS, ast.ClassDef)):
            bind(stmt.name)
            if isinstance(stmt, _DEFS):
                defs[stmt.name] = stmt
        else:  # assignments, and whatever a block at module level binds (a try-import's fallback)
            for node in ast.walk(stmt):
                if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                    bind(node.id)
                elif isinstance(node, (*_DEFS, ast.ClassDef)):
                    bind(node.name)
                elif isinstance(node, (ast.Import, ast.ImportFrom)):
                    for alias in node.names:
                        if alias.name == "*":  # a try-import's `from .fast import *`
                            star(node)
                        else:
                            bind(alias.asname or alias.name.split(".")[0])
    return imported, defs, counts, starred


def declared_global(tree: ast.AST) -> set[str]:
    """The names a `global` statement in a function (or class) of the module declares: the function may
    assign one, and a call of it then reaches that (whether it does is not read: a declaration counts)."""
    # `global` is a statement: only the blocks of statements are walked, not the expressions, a tenth of
    # the nodes (it was asked of every file that follows an import, a whole-file `ast.walk`: #26).
    found: set[str] = set()
    todo = [tree]
    while todo:
        node = todo.pop()
        if type(node) is ast.Global:
            found.update(node.names)
            continue
        for block in ("body", "orelse", "finalbody", "handlers", "cases"):
            value = getattr(node, block, None)
            if type(value) is list:
                todo.extend(value)
    return found


def _spelled(stmt: ast.ImportFrom) -> str:
    return "." * stmt.level + (stmt.module or "")


def _module_file(file: Path, stmt: ast.ImportFrom) -> list[Path]:
    """The files `stmt`'s module may be, in the order Python's path finder tries them: the package
    (`x/__init__.py`) before the module (`x.py`) when a folder holds both."""
    parts = stmt.module.split(".") if stmt.module else []
    if stmt.level:
        base = file.parent
        for _ in range(stmt.level - 1):
            base = base.parent
    elif (file.parent / "__init__.py").is_file():
        base = file.parent
        while (base / "__init__.py").is_file() and base.parent != base:
            base = base.parent
    else:
        base = file.parent
    if not parts:
        return [base / "__init__.py"]
    where = base.joinpath(*parts)
    return [where / "__init__.py", where.with_name(where.name + ".py")]


#: Sibling modules parsed in this process, by path and content: the files of one package import the same
#: few modules, and each is parsed once, not once per file (`ast` trees are never modified here). A
#: modeling file's tree is megabytes: 8 of them hold a folder's shared modules (32 cost transformers' run
#: 30 MB more peak memory for 4% less time, #26).
_PARSED: collections.OrderedDict[tuple[str, bytes], _Module | None] = collections.OrderedDict()
_PARSED_KEEP = 8


def _parsed(path: Path, data: bytes) -> _Module | None:
    key = (str(path), hashlib.sha1(data).digest())
    if key in _PARSED:
        _PARSED.move_to_end(key)
        return _PARSED[key]
    try:
        module = _Module(path, ast.parse(data, filename=str(path)))
    except (SyntaxError, ValueError, RecursionError):
        module = None
    _PARSED[key] = module
    if len(_PARSED) > _PARSED_KEEP:
        _PARSED.popitem(last=False)
    return module


class _Module:
    """A sibling module, parsed: its functions and how its names resolve."""

    def __init__(self, path: Path, tree: ast.Module) -> None:
        self.path, self.tree = path, tree
        self.names = Names.of(tree)
        #: The Name nodes of the module: a name of a folded expression is the sibling's when it is one of these.
        self.name_ids: set[int] = set()
        #: Names a function of the module may rebind (`global rotate_half`).
        self.declared: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                self.name_ids.add(id(node))
            elif isinstance(node, ast.Global):
                self.declared.update(node.names)
        self.functions = {k: v for k, v in _module_functions(tree).items() if k not in self.declared}
        #: Names a later `from X import *` of the module may rebind -> X.
        self.starred = _bindings(tree)[3]


#: Libraries a module-level import may name: never a module next to the file.
_LIBRARIES = ("torch", "einops", "numpy", "math")
#: How many imports deep a helper is followed beyond the file's own: a sibling helper's call of a name its
#: module imports from a third module is read (one more level), that module's imports are not.
MAX_DEPTH = 1


def _init_binds(tree: ast.Module, name: str) -> str | None:
    """Why a package whose `__init__.py` is `tree` may not give its submodule for `from pkg import name`
    (None: nothing binds `name` there but the import of that submodule): Python reads the package's
    attribute first, and whatever `__init__.py` binds to `name` is what the import gets."""
    imported, _, counts, _ = _bindings(tree)
    if any(isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names) for n in ast.walk(tree)):
        return "has a `from X import *`, which may bind it"
    if name in declared_global(tree):
        return f"has `global {name}` in a function, which may bind it"
    if not counts.get(name):
        return None
    stmt = imported.get(name)
    if (
        counts[name] == 1
        and stmt is not None
        and stmt.level == 1
        and not stmt.module
        and any(a.name == name and a.asname in (None, name) for a in stmt.names)
    ):
        return None  # `from . import rope`: the submodule itself
    return f"binds `{name}` itself"


class Scope:
    """The imported helpers of one file being migrated, read on first use; with the file's own module
    functions (`Namespace`), what `Function.functions` and `Function.qualname` are for NPU703.

    A helper is found by the name a call spells: `rotate_half` (imported by name), `rope.rotate_half` (a
    module the file imports, `from . import rope` / `import pkg.rope as rope`). The scope of a sibling
    module (`child`) follows that module's own imports the same way, `MAX_DEPTH` levels in all; every
    scope of one file shares what was read (and counts it against `MAX_MODULES`)."""

    def __init__(
        self,
        tree: ast.Module,
        file: Path | None,
        shared: Scope | None = None,
        depth: int = 0,
        declared: set[str] | frozenset[str] | None = None,
    ) -> None:
        self.tree, self._file, self.depth = tree, file, depth
        if declared is not None:  # known already (the checker's walk, a parsed module's): not walked again
            self.declared = declared
        if shared is None:
            self._texts: dict[str, bytes | None] = {}  # path -> its bytes (None: no readable file)
            self._modules: dict[str, _Module | None] = {}  # path -> module parsed (None: it does not parse)
            self._owners: dict[int, _Module] = {}  # id of a Name node of a parsed module -> that module
            self._children: dict[str, Scope] = {}  # path of a parsed module -> the scope of its imports
        else:
            self._texts, self._modules = shared._texts, shared._modules
            self._owners, self._children = shared._owners, shared._children
        self._found: dict[str, tuple[ast.FunctionDef, _Module] | None] = {}
        #: Imported name -> why it is not followed, once looked up and not found.
        self.why: dict[str, str] = {}

    @functools.cached_property
    def imports(self) -> dict[str, ast.ImportFrom]:
        """The names to follow (asked once per file, by the first function NPU703 looks at)."""
        return _bound_once_by_import(self.tree)

    @functools.cached_property
    def modules(self) -> dict[str, ast.ImportFrom]:
        """The names that may be a module of the project (`rope` of `rope.rotate_half(x)`)."""
        return _bound_once_to_a_module(self.tree)

    @functools.cached_property
    def follows(self) -> bool:
        """Whether the file imports anything a call could be followed into."""
        return bool(self.imports or self.modules)

    def with_local(self, local: dict[str, ast.ImportFrom]) -> Scope:
        """This scope seen from a function whose body begins by importing `local` (`def apply(...): from
        .rope import rotate_half`): those names are the function's, whatever the module binds them to."""
        scope = Scope(self.tree, self._file, self, self.depth, self.declared)
        scope.imports = {**self.imports, **local}
        scope.modules = {**{k: v for k, v in self.modules.items() if k not in local}, **local}
        return scope

    @functools.cached_property
    def starred(self) -> dict[str, str]:
        """The file's names a later `from X import *` may rebind -> X."""
        return _bindings(self.tree)[3]

    @functools.cached_property
    def declared(self) -> set[str]:
        """The file's names a function may rebind (`global rotate_half`): asked only of a name about to be
        followed, or declined, as a walk of the whole file."""
        return declared_global(self.tree)

    @functools.cached_property
    def patched(self) -> dict[str, set[str | None]]:
        """Module attributes the file assigns or deletes (`rope.rotate_half = swap`, `setattr(rope, ...)`):
        name -> the attributes (None: any, a `setattr` with a computed name). Asked only of a file that
        calls a function of an imported module."""
        found: dict[str, set[str | None]] = {}
        for node in ast.walk(self.tree):
            targets: list[ast.expr] = []
            if isinstance(node, (ast.Assign, ast.Delete)):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("setattr", "delattr")
                and node.args
                and isinstance(node.args[0], ast.Name)
            ):
                attr = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else None
                found.setdefault(node.args[0].id, set()).add(attr if isinstance(attr, str) else None)
            for target in targets:
                for part in ast.walk(target):
                    if isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name):
                        found.setdefault(part.value.id, set()).add(part.attr)
        return found

    def rebinding(self, name: str) -> str | None:
        """Why the file's module-level `name` may not be what a call of it reaches (None: nothing says so)."""
        where = "this file" if self.depth == 0 else f"`{self._file.name}`"
        if name in self.starred:
            return f"a later `from {self.starred[name]} import *` of {where} may rebind it"
        if name in self.declared:
            return f"`global {name}` in a function of {where} may rebind it"
        return None

    @functools.cached_property
    def file(self) -> Path | None:
        """The file on disk; None where it is not one (stdin, a test's `<string>`)."""
        return self._file if self._file is not None and self._file.is_file() else None

    def lookup(self, name: str) -> tuple[ast.FunctionDef, _Module] | None:
        if name not in self._found:
            if self.depth > MAX_DEPTH:
                self._found[name] = self._past(name)
            else:
                self._found[name] = self._look_up(name) if "." not in name else self._look_up_attribute(name)
        return self._found[name]

    def _past(self, name: str) -> None:
        """Nothing, beyond `MAX_DEPTH`: an imported name says why (the chain of imports is not followed)."""
        head = name.partition(".")[0]
        stmt = self.imports.get(name) if "." not in name else self.modules.get(head)
        if stmt is not None and not (stmt.level == 0 and (stmt.module or "").split(".")[0] in _LIBRARIES):
            self.why[name] = (
                f"imported from `{_spelled(stmt)}` by `{self._file.name}`, {self.depth} imports away from the "
                f"file migrated: past the {MAX_DEPTH + 1} levels of imports followed"
            )

    @functools.cached_property
    def bound_twice(self) -> dict[str, int]:
        """Module-level names an import binds that something else binds too (a `try`'s `except ImportError`
        fallback, a redefinition), with how many times they are bound."""
        counts = _bindings(self.tree)[2]
        imported = {
            (alias.asname or alias.name).split(".")[0]
            for stmt in self.tree.body
            if not isinstance(stmt, (*_DEFS, ast.ClassDef))
            for node in ast.walk(stmt)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names
        }
        return {name: counts[name] for name in imported if counts.get(name, 0) > 1}

    def _look_up(self, name: str) -> tuple[ast.FunctionDef, _Module] | None:
        stmt = self.imports.get(name)
        if stmt is None:
            if name in self.bound_twice:
                self.why[name] = (
                    f"imported by `{self._file.name if self._file else 'this file'}` and bound "
                    f"{self.bound_twice[name]} times at module level (a fallback of a `try` import, or a "
                    "redefinition): which one a call reaches is only known at run time"
                )
            return None
        spelled = _spelled(stmt)
        if stmt.level == 0 and (stmt.module or "").split(".")[0] in _LIBRARIES:
            self.why[name] = f"imported from `{spelled}`, a library, not a module next to this file"
            return None
        if name in self.starred:
            self.why[name] = f"imported from `{spelled}`, but {self.rebinding(name)}"
            return None
        if self.file is None:
            self.why[name] = NO_FILE
            return None
        original = stmt.names[[a.asname or a.name for a in stmt.names].index(name)].name
        return self._read_function(name, name, spelled, _module_file(self.file, stmt), original)

    def _look_up_attribute(self, name: str) -> tuple[ast.FunctionDef, _Module] | None:
        """`rope.rotate_half`: the function `rotate_half` of the module the file binds to `rope`."""
        head, _, attr = name.partition(".")
        stmt = self.modules.get(head)
        if stmt is None or "." in attr:
            return None
        if stmt.level == 0 and (stmt.module or "").split(".")[0] in _LIBRARIES:
            return None  # `torch.cat`, `F.silu`: no reason to give, nothing of the project is called
        if stmt.names:  # `from pkg import rope`: the submodule `pkg.rope`
            alias = next(a for a in stmt.names if (a.asname or a.name) == head)
            parent, child = stmt.module, alias.name
            module = ast.ImportFrom(module=f"{parent}.{child}" if parent else child, names=[], level=stmt.level)
        else:  # `import pkg.rope as rope`
            module = stmt
            parent, _, child = (stmt.module or "").rpartition(".")
        spelled = _spelled(module)
        patched = self.patched.get(head, set())
        if attr in patched or None in patched:
            where = "this file" if self.depth == 0 else f"`{self._file.name}`"
            self.why[name] = (
                f"imported from `{spelled}`, but {where} assigns `{head}`'s attributes, which may rebind it"
            )
            return None
        if head in self.starred or head in self.declared:
            self.why[name] = f"imported from `{spelled}`, but {self.rebinding(head).replace(' it', f' `{head}`', 1)}"
            return None
        if self.file is None:
            self.why[name] = NO_FILE
            return None
        if stmt.level or parent:
            # Python takes the package's attribute first: what its `__init__.py` binds to the name, if anything.
            package = ast.ImportFrom(module=parent or None, names=[], level=stmt.level)
            init = _module_file(self.file, package)[0]
            data = self._read(init)
            if data is None and init.is_file():
                self.why[name] = (
                    f"imported from `{spelled}`, whose package's `__init__.py` is no readable Python file (at most "
                    f"{MAX_BYTES // 1024} KiB)"
                )
                return None
            if data is not None:
                tree = self._parse(init, data)
                why = _init_binds(tree.tree, child) if tree is not None else "does not parse"
                if why is not None:
                    self.why[name] = (
                        f"imported from `{spelled}`, but the package's `__init__.py` (whose `{child}` the import "
                        f"gets first) {why}"
                    )
                    return None
        return self._read_function(name, head, spelled, _module_file(self.file, module), attr)

    def _read(self, path: Path) -> bytes | None:
        key = str(path)
        if key not in self._texts:
            self._texts[key] = depends.read(path, MAX_BYTES)
        return self._texts[key]

    def _parse(self, path: Path, data: bytes) -> _Module | None:
        key = str(path)
        if key not in self._modules:
            self._modules[key] = _parsed(path, data)
            if self._modules[key] is not None:
                self._owners.update(dict.fromkeys(self._modules[key].name_ids, self._modules[key]))
        return self._modules[key]

    def _read_function(
        self, name: str, bound: str, spelled: str, candidates: list[Path], original: str
    ) -> tuple[ast.FunctionDef, _Module] | None:
        """The function `original` of the module at the first of `candidates` that exists, as the call
        `name` reaches it through this file's name `bound` (None, with the reason in `why`, where not)."""
        data = path = None
        for candidate in candidates:
            data, path = self._read(candidate), candidate
            # The first that exists is the module, readable or not: a package too large to read does not
            # make Python import the `x.py` beside it.
            if data is not None or candidate.is_file():
                break
        if data is None:
            self.why[name] = (
                f"imported from `{spelled}`, which is no readable Python file next to this one (at most "
                f"{MAX_BYTES // 1024} KiB)"
            )
            return None
        # Most imported names a model calls are classes and utilities (`BaseModelOutputWithPast`, a mask
        # builder): a module without a top-level `def <name>(` is not parsed for them.
        spelled_def = b"def " + original.encode()
        if spelled_def not in data or not re.search(
            rb"^(?:async[ \t]+)?def[ \t]+" + re.escape(original.encode()) + rb"[ \t]*\(", data, re.M
        ):
            self.why[name] = f"imported from `{spelled}`, where `{original}` is not a function defined at module level"
            return None
        if str(path) not in self._modules and len(self._modules) >= MAX_MODULES:
            self.why[name] = f"imported from `{spelled}`, past the {MAX_MODULES} sibling modules read per file"
            return None
        module = self._parse(path, data)
        if module is None:
            self.why[name] = f"imported from `{spelled}`, which does not parse"
            return None
        if original in module.starred:
            self.why[name] = (
                f"imported from `{spelled}`, where a later `from {module.starred[original]} import *` may rebind "
                f"`{original}`"
            )
            return None
        if original in module.declared:
            self.why[name] = f"imported from `{spelled}`, where `global {original}` in a function may rebind it"
            return None
        if original not in module.functions:
            self.why[name] = (
                f"imported from `{spelled}`, where `{original}` is not one function defined once at module level"
            )
            return None
        # Last, as it walks the whole file: a function here may rebind the name (`global rotate_half`).
        if bound in self.declared:
            self.why[name] = f"imported from `{spelled}`, but {self.rebinding(bound)}"
            return None
        return module.functions[original], module

    def functions_of(self, module: _Module) -> Mapping[str, ast.FunctionDef]:
        """The functions a helper of `module` may call: its module's, and within `MAX_DEPTH`, the helpers
        that module imports (read by a scope of its own, sharing what this one read)."""
        key = str(module.path)
        if key not in self._children:
            self._children[key] = Scope(module.tree, module.path, self, self.depth + 1, module.declared)
        child = self._children[key]
        return Namespace(module.functions, child) if child.follows else module.functions

    def qualname(self, own: Callable[[ast.expr], str | None]) -> Callable[[ast.expr], str | None]:
        """The resolver of a folded expression that may hold the sibling's nodes: a name chain resolves in
        the module its first name was written in (`torch.cat` of `rope.py` through `rope.py`'s imports)."""

        owners = self._owners  # filled as modules are parsed

        def resolve(node: ast.expr) -> str | None:
            if not owners:
                return own(node)
            base = node
            while isinstance(base, ast.Attribute):
                base = base.value
            module = owners.get(id(base))
            return (module.names.resolve if module is not None else own)(node)

        resolve.scope = self  # type: ignore[attr-defined]
        resolve.own = own  # type: ignore[attr-defined]
        return resolve

    def _owner(self, node: ast.AST) -> _Module | None:
        return self._owners.get(id(node)) if isinstance(node, ast.Name) else None

    def unbound(self, exprs: list[ast.AST], own: Callable[[ast.expr], str | None]) -> tuple[str, Path] | None:
        """The first name of `exprs` written in a sibling module that this file does not bind to the same
        thing (`torch` imported there and here is the same; a constant of `rope.py` is not), with its module."""
        if not self._owners:
            return None
        for expr in exprs:
            for node in _walk(expr):
                module = self._owner(node)
                if module is None:
                    continue
                theirs = module.names.resolve(node)
                if theirs is None or own(ast.Name(node.id, ast.Load())) != theirs:
                    return node.id, module.path
        return None


def _walk(node: ast.AST) -> Iterator[ast.AST]:
    yield node
    for child in ast.iter_child_nodes(node):
        yield from _walk(child)


class Namespace(Mapping):
    """A file's module functions and the helpers it imports from sibling modules (read when first asked
    for): `Function.functions` for NPU703. `scope(name)` is the functions the helper `name` calls."""

    def __init__(self, local: Mapping[str, ast.FunctionDef], scope: Scope) -> None:
        self.local, self.imported = local, scope

    def _found(self, name: str):
        return None if name in self.local else self.imported.lookup(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self.local or self._found(name) is not None)

    def __getitem__(self, name: str) -> ast.FunctionDef:
        if name in self.local:
            return self.local[name]
        found = self._found(name)
        if found is None:
            raise KeyError(name)
        return found[0]

    def __iter__(self):
        # The local functions only: listing the imported ones would read every sibling module.
        return iter(self.local)

    def __len__(self) -> int:
        return len(self.local) + len(self.imported.imports)

    def scope(self, name: str) -> Mapping[str, ast.FunctionDef]:
        """The functions `name`'s body may call: its own module's (and what that module imports, within
        `MAX_DEPTH`: `Scope.functions_of`)."""
        found = None if name in self.local else self.imported.lookup(name)
        return self if found is None else self.imported.functions_of(found[1])

    def with_function(self, name: str, node: ast.FunctionDef) -> Namespace:
        """With a helper nested in the function's body (`symbolic._nested_function`), nothing read."""
        return Namespace({**self.local, name: node}, self.imported)


def following(fn: Function) -> Function:
    """`fn` seeing the helpers its file imports from sibling modules as if the file defined them: its
    functions extended (`Namespace`), its names resolved where each was written (`Scope.qualname`)."""
    scope = fn.imported
    if not isinstance(scope, Scope) or isinstance(fn.functions, Namespace):
        return fn
    found = _local_imports(fn, scope)
    if found is not None:
        tree, local = found
        scope = scope.with_local(local)
        functions = {k: v for k, v in fn.functions.items() if k not in local}
        return dataclasses.replace(
            fn, tree=tree, functions=Namespace(functions, scope), qualname=scope.qualname(fn.qualname), imported=scope
        )
    if not scope.follows:
        return fn
    return dataclasses.replace(fn, functions=Namespace(fn.functions, scope), qualname=scope.qualname(fn.qualname))


def _local_imports(fn: Function, scope: Scope) -> tuple[ast.FunctionDef, dict[str, ast.ImportFrom]] | None:
    """`fn`'s tree without the imports its body begins with (`def apply(q, cos, sin): from .rope import
    rotate_half`), and the names they bind, as `Scope.with_local` takes them; None where the body begins
    with none, or they may not be followed: a name of theirs that the function binds again (a parameter,
    an assignment, a `global` or `nonlocal`, a nested def), that the module binds too (a name of the
    function then reads as the module's elsewhere), or `import pkg.rope` (binds `pkg`, not the module).
    The branch goes after them (`after_imports`): they run first, as in the original."""
    body = fn.tree.body
    start = 1 if body and _docstring(body[0]) else 0
    end = start
    while end < len(body) and isinstance(body[end], (ast.Import, ast.ImportFrom)):
        end += 1
    if end == start or end == len(body):
        return None
    local: dict[str, ast.ImportFrom] = {}
    for stmt in body[start:end]:
        for alias in stmt.names:
            name = alias.asname or alias.name
            if alias.name == "*" or isinstance(stmt, ast.Import) and "." in alias.name and not alias.asname:
                return None
            if name in local:
                return None
            local[name] = stmt if isinstance(stmt, ast.ImportFrom) else ast.ImportFrom(alias.name, [], 0)
    args = fn.tree.args
    bound = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg) if a}
    for stmt in body[end:]:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                bound.add(node.id)
            elif isinstance(node, (*_DEFS, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                bound.update(node.names)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                bound.update((a.asname or a.name).split(".")[0] for a in node.names)
    module_level = _bindings(scope.tree)[2]
    if any(name in bound or name in module_level for name in local):
        return None
    tree = copy.copy(fn.tree)
    tree.body = [*body[:start], *body[end:]]
    tree.npu_after_imports = body[end]  # type: ignore[attr-defined]
    return tree, local


def after_imports(fn: Function) -> ast.stmt | None:
    """The first statement after the imports `fn`'s body begins with, where `following` read them."""
    return getattr(fn.tree, "npu_after_imports", None)


def _docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def why_unfollowed_call(fn: Function, call: ast.Call) -> str | None:
    """Why the helper `call` reaches was not read, in the scope of the module the call is written in (the
    file, or a sibling whose helper was inlined: `rotate_half` that `layers.py` imports); None where it
    was read, or is nothing imported."""
    scope = getattr(fn.qualname, "scope", None)
    if not isinstance(scope, Scope):
        return None
    func = call.func
    if isinstance(func, ast.Name):
        name, base = func.id, func
    elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        name, base = f"{func.value.id}.{func.attr}", func.value
    else:
        return None
    owner = scope._owner(base)
    if owner is not None:
        scope = scope._children.get(str(owner.path))
        if scope is None:
            return None
    scope.lookup(name)
    why = scope.why.get(name)
    if why is None:
        return None
    where = f"`{name}`" if owner is None else f"`{name}`, which `{owner.path.name}` calls,"
    return f"{where} is {why}"


def unbound_name(fn: Function, exprs: list[ast.AST]) -> tuple[str, Path] | None:
    """What `Scope.unbound` says of `exprs`, the code a branch of `fn` would hold (None: `fn` follows no import)."""
    scope = getattr(fn.qualname, "scope", None)
    return scope.unbound(exprs, fn.qualname.own) if isinstance(scope, Scope) else None


def why_not_followed(fn: Function, name: str) -> str | None:
    """Why the imported helper `name` was not read (None: it is no imported name, or it was read)."""
    scope = fn.imported
    return scope.why.get(name) if isinstance(scope, Scope) else None


def rebinding(fn: Function, name: str) -> str | None:
    """Why a module-level `name` of `fn`'s file may not be what a call reaches: a later `from X import *`,
    or a function's `global name` (None: neither)."""
    scope = fn.imported
    return scope.rebinding(name) if isinstance(scope, Scope) else None
