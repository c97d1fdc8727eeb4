"""What the names of a file refer to, on CPython's `ast` instead of libcst.

`analyze` reads every Python file of a tree (the `transformers` package: 2,900 files), most of which the
rules' prefilter never parses, and the fused-operator rules decide on the `ast` alone; `ast` parses an
order of magnitude faster than libcst. The rules for trusting a name are those of
`npu_migrate.program.imports.ImportTable` (`split_trusted`, shared), so a name resolves here exactly as the libcst
rules resolve it: an imported name that the file also binds another way is not trusted. Both tables see
the same statements, and tests/test_name_resolvers.py checks that they agree. Relative imports resolve
when the file's package is known (a library tree given to `third_party`); the libcst table, which has no
package, leaves them out.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

_Import = TypeVar("_Import")


def split_trusted(
    imported: Mapping[str, Sequence[_Import]], rebound: set[str], qualname: Callable[[_Import], str]
) -> tuple[dict[str, _Import], dict[str, str]]:
    """The imports of a file (local name -> each import that binds it) split into the trusted ones (the
    only way the file binds that name, to one target) and the shadowed ones (local name -> the first of
    its targets): without scope analysis, a name bound twice may be either at any given use."""
    trusted: dict[str, _Import] = {}
    shadowed: dict[str, str] = {}
    for local, found in imported.items():
        targets = {qualname(item) for item in found}
        if local in rebound or len(targets) > 1:
            shadowed[local] = sorted(targets)[0]
        else:
            trusted[local] = found[0]
    return trusted, shadowed


def dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _absolute(module: str | None, level: int, package: str | None) -> str | None:
    if level == 0:
        return module
    if package is None:
        return None
    parts = package.split(".")
    if level - 1 > len(parts) - 1:
        return None
    base = parts[: len(parts) - (level - 1)]
    return ".".join([*base, module] if module else base)


@dataclass
class Names:
    bindings: dict[str, str] = field(default_factory=dict)  # local name -> qualified name
    #: Imported names that are bound in another way too, with what the import would make them.
    shadowed: dict[str, str] = field(default_factory=dict)
    #: Every target the imports bind a shadowed name to (`shadowed` names the first only).
    alternatives: dict[str, frozenset[str]] = field(default_factory=dict)
    modules: set[str] = field(default_factory=set)  # every module an import statement loads
    #: (qualified module, line) of each import statement, for the third-party package check.
    imports: list[tuple[str, ast.stmt]] = field(default_factory=list)

    @classmethod
    def of(cls, tree: ast.Module, package: str | None = None) -> Names:
        table = cls()
        imported: dict[str, list[str]] = {}
        rebound: set[str] = set()
        for node in _statements(tree.body):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    table.modules.add(alias.name)
                    table.imports.append((alias.name, node))
                    if alias.asname:
                        imported.setdefault(alias.asname, []).append(alias.name)
                    else:
                        top = alias.name.split(".")[0]
                        imported.setdefault(top, []).append(top)
            elif isinstance(node, ast.ImportFrom):
                module = _absolute(node.module, node.level, package)
                if module is None:
                    continue
                table.modules.add(module)
                table.imports.append((module, node))
                for alias in node.names:
                    if alias.name == "*":
                        continue
                    imported.setdefault(alias.asname or alias.name, []).append(f"{module}.{alias.name}")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                rebound.add(node.name)
                args = node.args
                for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
                    if arg is not None:
                        rebound.add(arg.arg)
            elif isinstance(node, ast.ClassDef):
                rebound.add(node.name)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    _bind(target, rebound)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor)):
                _bind(node.target, rebound)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if item.optional_vars is not None:
                        _bind(item.optional_vars, rebound)
            elif isinstance(node, (ast.Try, ast.TryStar)):
                rebound.update(handler.name for handler in node.handlers if handler.name)
            elif isinstance(node, ast.Match):
                for case in node.cases:
                    _bind_captures(case.pattern, rebound)
        table.bindings, table.shadowed = split_trusted(imported, rebound, lambda qualname: qualname)
        table.alternatives = {local: frozenset(imported[local]) for local in table.shadowed}
        return table

    def resolve(self, node: ast.AST) -> str | None:
        """The qualified name of a Name/Attribute chain whose root is a trusted import, else None."""
        name = dotted(node)
        if name is None:
            return None
        root, _, rest = name.partition(".")
        qualified = self.bindings.get(root)
        if qualified is None:
            return None
        return f"{qualified}.{rest}" if rest else qualified


def _statements(body: list[ast.stmt]):
    """Every statement, nested ones included: the only nodes that import or bind (walking the
    expressions too, as `ast.walk` does, costs three times as much for nothing)."""
    for stmt in body:
        yield stmt
        for attr in ("body", "orelse", "finalbody"):
            block = getattr(stmt, attr, None)
            if isinstance(block, list):
                yield from _statements(block)
        for handler in getattr(stmt, "handlers", ()):
            yield from _statements(handler.body)
        for case in getattr(stmt, "cases", ()):
            yield from _statements(case.body)


def _bind(target: ast.AST, rebound: set[str]) -> None:
    if isinstance(target, ast.Name):
        rebound.add(target.id)
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            _bind(element, rebound)
    elif isinstance(target, ast.Starred):
        _bind(target.value, rebound)


def _bind_captures(pattern: ast.pattern, rebound: set[str]) -> None:
    """The names a match pattern captures (`case [x, *rest]`, `case {**rest}`, `case P() as x`)."""
    for node in ast.walk(pattern):
        if isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            rebound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            rebound.add(node.rest)
