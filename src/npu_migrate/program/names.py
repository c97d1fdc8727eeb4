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
    #: Shadowed names that only a function, class body, lambda or comprehension rebinds (diffusers'
    #: `F, H, W = size[i]` beside `import torch.nn.functional as F`): the import's qualified name and the
    #: spans where the local binding hides it. `resolve` resolves them outside those spans; `bindings` and
    #: `shadowed` stay file-wide, as the libcst table (no positions) keeps them.
    #: Computed on the first `resolve` of such a name (a walk of the whole tree: most files never need it).
    scoped: dict[str, tuple[str, tuple[Span, ...]]] = field(default_factory=dict)
    #: (the tree, its shadowed names one module-level import binds, with that import) until `scoped` is computed.
    _pending: tuple[ast.Module, dict[str, str]] | None = field(default=None, repr=False, compare=False)

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
        # Only a name one import binds, at module level, can be the import wherever no local binding hides it.
        candidates = {local: imported[local][0] for local in table.shadowed if len(set(imported[local])) == 1}
        if candidates:
            # Most are rebound at module level (`except ImportError: name = None`): seen without a walk.
            for name in _module_statement_bindings(tree.body) & set(candidates):
                del candidates[name]
        if candidates:
            table._pending = (tree, candidates)
        return table

    def resolve(self, node: ast.AST) -> str | None:
        """The qualified name of a Name/Attribute chain whose root is a trusted import, else None."""
        name = dotted(node)
        if name is None:
            return None
        root, _, rest = name.partition(".")
        qualified = self.bindings.get(root)
        if qualified is None:
            qualified = self._scoped(root, node)
        if qualified is None:
            return None
        return f"{qualified}.{rest}" if rest else qualified

    def _scoped(self, root: str, node: ast.AST) -> str | None:
        """The import a locally shadowed `root` names at `node`: None inside a scope that rebinds it, or
        where `node` has no position (built by a rule: where it was written is not known)."""
        if self._pending is not None:
            if root not in self._pending[1]:
                return None
            tree, candidates = self._pending
            self._pending = None
            module_level, spans = local_rebinding(tree, set(candidates))
            self.scoped = {
                local: (qualname, tuple(spans.get(local, ())))
                for local, qualname in candidates.items()
                if local not in module_level
            }
        found = self.scoped.get(root)
        if found is None:
            return None
        while isinstance(node, ast.Attribute):
            node = node.value
        line = getattr(node, "lineno", None)
        if line is None:
            return None
        at = (line, node.col_offset)
        if any((span[0], span[1]) <= at < (span[2], span[3]) for span in found[1]):
            return None
        return found[0]


def _module_statement_bindings(body: list[ast.stmt]) -> set[str]:
    """Names the module scope's statements bind (not in a def or class body; imports aside, and `:=`)."""
    bound: set[str] = set()
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(stmt.name)
            continue
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                _bind(target, bound)
        elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor)):
            _bind(stmt.target, bound)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                if item.optional_vars is not None:
                    _bind(item.optional_vars, bound)
        for attr in ("body", "orelse", "finalbody"):
            block = getattr(stmt, attr, None)
            if isinstance(block, list):
                bound |= _module_statement_bindings(block)
        for handler in getattr(stmt, "handlers", ()):
            if handler.name:
                bound.add(handler.name)
            bound |= _module_statement_bindings(handler.body)
    return bound


#: (line, column, end line, end column) of a node.
Span = tuple[int, int, int, int]
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _span(node: ast.AST) -> Span:
    return (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)


def local_rebinding(tree: ast.Module, names: set[str]) -> tuple[set[str], dict[str, list[Span]]]:
    """Of `names` (imported at module level, bound some other way too): those the module scope rebinds
    (at module level, or in a function that declares them `global`), and for the others the spans where a
    local binding hides the import, by Python's scoping: a function's binding holds in all of the function
    (its nested functions too, which see it as a closure), a class body's in its own statements but not
    in its methods, a comprehension's or a lambda's in itself. `nonlocal` binds in the enclosing function,
    whose span already holds it. Spans are generous where that is simpler (a whole `def`, its defaults
    included): a name left unresolved is only code left alone."""
    module_level: set[str] = set()
    spans: dict[str, list[Span]] = {}
    imported_here: set[str] = set()  # imported by a statement of the module scope

    def visit(scope: ast.AST, parts: list[ast.AST]) -> None:
        bound: set[str] = set()
        declared_global: set[str] = set()
        declared_nonlocal: set[str] = set()
        nested: list[ast.AST] = []
        stack = list(parts)
        while stack:
            node = stack.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                if not isinstance(node, ast.Lambda):
                    bound.add(node.name)
                    stack.extend(node.decorator_list)
                nested.append(node)
                if isinstance(node, ast.ClassDef):
                    stack.extend((*node.bases, *node.keywords))
                else:  # defaults and annotations are evaluated where the function is defined
                    args = node.args
                    stack.extend((*args.defaults, *(d for d in args.kw_defaults if d is not None)))
                    if not isinstance(node, ast.Lambda):
                        every = (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg)
                        stack.extend(a.annotation for a in every if a is not None and a.annotation is not None)
                        if node.returns is not None:
                            stack.append(node.returns)
                continue
            if isinstance(node, _COMPREHENSIONS):
                nested.append(node)
                stack.append(node.generators[0].iter)  # evaluated in the enclosing scope
                # `:=` in a comprehension binds in the enclosing scope.
                bound.update(
                    n.target.id
                    for n in ast.walk(node)
                    if isinstance(n, ast.NamedExpr) and isinstance(n.target, ast.Name)
                )
                continue
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                bound.add(node.id)
            elif isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
                bound.add(node.target.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                # At module level the import itself; elsewhere a local binding like any other.
                local = {a.asname or a.name.split(".")[0] for a in node.names}
                (imported_here if scope is tree else bound).update(local)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                bound.add(node.name)
            elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
                bound.add(node.name)
            elif isinstance(node, ast.MatchMapping) and node.rest:
                bound.add(node.rest)
            elif isinstance(node, ast.Global):
                declared_global.update(node.names)
            elif isinstance(node, ast.Nonlocal):
                declared_nonlocal.update(node.names)  # the enclosing function's: its span holds this one
            stack.extend(ast.iter_child_nodes(node))
        bound -= declared_nonlocal
        hits = bound & names
        if scope is tree:
            # Imported only inside functions: outside them the name is not the import.
            module_level.update(hits | (names - imported_here))
        else:
            module_level.update(hits & declared_global)
            for name in hits - declared_global:
                spans.setdefault(name, []).extend(_scope_spans(scope))
        for inner in nested:
            visit(inner, _scope_parts(inner))

    visit(tree, list(tree.body))
    return module_level, spans


def _scope_parts(scope: ast.AST) -> list[ast.AST]:
    """What runs in `scope` itself: a function's parameters and body, a class's body, a comprehension's
    targets, conditions, element and every iterable but the first."""
    if isinstance(scope, _FUNCTIONS):
        args = scope.args
        every = (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg)
        params = [ast.Name(a.arg, ast.Store()) for a in every if a is not None]
        return [*params, *(scope.body if isinstance(scope.body, list) else [scope.body])]
    if isinstance(scope, ast.ClassDef):
        return list(scope.body)
    parts: list[ast.AST] = []
    for index, generator in enumerate(scope.generators):
        parts.append(generator.target)
        parts.extend(generator.ifs)
        if index:
            parts.append(generator.iter)
    parts.extend([scope.key, scope.value] if isinstance(scope, ast.DictComp) else [scope.elt])
    return parts


def _scope_spans(scope: ast.AST) -> list[Span]:
    """Where a binding of `scope` hides the module's: all of a function, lambda or comprehension (nested
    scopes see a function's locals); a class body's own statements, not its methods' bodies."""
    if not isinstance(scope, ast.ClassDef):
        return [_span(scope)]
    spans = []
    for stmt in scope.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            # Its decorators, defaults and bases run in the class body; its own body does not see it.
            spans.extend(_span(d) for d in stmt.decorator_list)
            if isinstance(stmt, ast.ClassDef):
                spans.extend(_span(b) for b in (*stmt.bases, *stmt.keywords))
            else:
                args = stmt.args
                spans.extend(_span(d) for d in (*args.defaults, *args.kw_defaults) if d is not None)
                every = (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg)
                spans.extend(_span(a.annotation) for a in every if a is not None and a.annotation is not None)
                if stmt.returns is not None:
                    spans.append(_span(stmt.returns))
        else:
            spans.append(_span(stmt))
    return spans


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
