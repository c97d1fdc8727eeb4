"""Name resolution without scope analysis, and the import edits the engine makes.

libcst's QualifiedNameProvider costs about six parses per file; the rules only need to know what the
imported names of a file refer to. `ImportTable` walks the statements once (never expressions), records
every import binding (`import torch as th`, `from torch import cuda`, `from torch.cuda import
synchronize as sync`) and every other way the file binds a name (assignments, parameters, loops, defs,
`with ... as`, `except ... as`, match captures). A name that is both imported and rebound is not
trusted: the rules leave code through it alone. `npu_migrate.program.names.Names` does the same on the `ast`
and agrees with this table on every file (tests/test_name_resolvers.py).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field

import libcst as cst
from libcst.helpers import get_full_name_for_node

from npu_migrate.program.names import split_trusted

#: What a handler catches a failed import with: one that catches these (or everything) and goes on makes the
#: import in its `try` body optional. Read by the flash_attn import rule and the guard-flip check alike.
IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})


def handler_catches_import_error(handler: cst.ExceptHandler) -> bool:
    """Whether the handler's type catches a failed import: a bare `except:`, or a type (or a tuple's
    element) whose last dotted name is in IMPORT_ERRORS. A type with no dotted name (`(ImportError,) +
    EXTRA`, a call) is not known to, and must not crash the rule that asks: `get_full_name_for_node`
    returns None for it."""
    if handler.type is None:
        return True
    kinds = [e.value for e in handler.type.elements] if isinstance(handler.type, cst.Tuple) else [handler.type]
    return any((get_full_name_for_node(kind) or "").rsplit(".", 1)[-1] in IMPORT_ERRORS for kind in kinds)


def identifier(name: str) -> str:
    """`name` as Python reads it: identifiers are NFKC-normalized (PEP 3131), so `ｔorch` is `torch`, and
    the `ast`, which `Names` reads, holds them so."""
    return name if name.isascii() else unicodedata.normalize("NFKC", name)


def dotted_name(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted_name(node.value)
        return None if base is None else f"{base}.{node.attr.value}"
    return None


def dotted_node(name: str) -> cst.Attribute | cst.Name:
    parts = name.split(".")
    node: cst.Attribute | cst.Name = cst.Name(parts[0])
    for part in parts[1:]:
        node = cst.Attribute(value=node, attr=cst.Name(part))
    return node


@dataclass(eq=False)
class Binding:
    """A name bound by an import statement."""

    local: str
    qualname: str
    line: cst.SimpleStatementLine | cst.SimpleStatementSuite  # the suite of a one-line block (`if x: import y`)
    stmt: cst.Import | cst.ImportFrom
    index: int  # position of the alias in the statement

    @property
    def is_from_import(self) -> bool:
        return isinstance(self.stmt, cst.ImportFrom)


@dataclass
class ImportTable:
    bindings: dict[str, Binding] = field(default_factory=dict)
    #: Imported names that are bound in another way too: not resolvable without real scope analysis.
    shadowed: dict[str, str] = field(default_factory=dict)
    modules: set[str] = field(default_factory=set)  # every module an import statement loads
    functions: set[str] = field(default_factory=set)  # names of every def, methods included
    top_level_imports: list[tuple[int, cst.SimpleStatementLine]] = field(default_factory=list)

    @classmethod
    def of(cls, module: cst.Module) -> ImportTable:
        table = cls()
        rebound: set[str] = set()
        imported: dict[str, list[Binding]] = {}
        _walk(module.body, table, rebound, imported, top=True)
        table.bindings, table.shadowed = split_trusted(imported, rebound, lambda binding: binding.qualname)
        return table

    def binding(self, name: str) -> Binding | None:
        """The trusted import that binds the name spelled `name`, if any."""
        # Keys are normalized; a name spelled in ASCII (nearly every one) is already, and costs no call.
        found = self.bindings.get(name)
        if found is None and not name.isascii():
            found = self.bindings.get(identifier(name))
        return found

    def resolve(self, expr: cst.BaseExpression) -> tuple[str | None, Binding | None]:
        """Qualified name of a Name/Attribute chain and the import binding at its root, if resolvable."""
        if isinstance(expr, cst.Name):
            binding = self.binding(expr.value)
            return (binding.qualname, binding) if binding else (None, None)
        if isinstance(expr, cst.Attribute):
            base, binding = self.resolve(expr.value)
            if base is not None:
                attr = expr.attr.value
                return f"{base}.{attr if attr.isascii() else identifier(attr)}", binding
        return None, None

    def shadowed_root(self, expr: cst.BaseExpression) -> str | None:
        """The qualified name an expression would have if its untrusted root name were the import."""
        if isinstance(expr, cst.Name):
            return self.shadowed.get(identifier(expr.value))
        if isinstance(expr, cst.Attribute):
            base = self.shadowed_root(expr.value)
            return None if base is None else f"{base}.{identifier(expr.attr.value)}"
        return None

    @property
    def uses_torch(self) -> bool:
        return any(m == "torch" or m.startswith("torch.") for m in self.modules)

    @property
    def imports_torch_npu(self) -> bool:
        return any(m == "torch_npu" or m.startswith("torch_npu.") for m in self.modules)


def _bind_names(target: cst.BaseExpression, rebound: set[str]) -> None:
    if isinstance(target, cst.Name):
        rebound.add(identifier(target.value))
    elif isinstance(target, (cst.Tuple, cst.List)):
        for element in target.elements:
            _bind_names(element.value, rebound)
    elif isinstance(target, cst.StarredElement):
        _bind_names(target.value, rebound)


def _record_import(stmt, line, table, imported) -> None:
    if isinstance(stmt, cst.Import):
        for index, alias in enumerate(stmt.names):
            full = _dotted_identifier(alias.name)
            if full is None:
                continue
            table.modules.add(full)
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                local, qualname = identifier(alias.asname.name.value), full
            else:
                local = qualname = full.split(".")[0]
            imported.setdefault(local, []).append(Binding(local, qualname, line, stmt, index))
    elif isinstance(stmt, cst.ImportFrom):
        if stmt.relative or stmt.module is None:
            return
        module = _dotted_identifier(stmt.module)
        if module is None:
            return
        table.modules.add(module)
        if isinstance(stmt.names, cst.ImportStar):
            return
        for index, alias in enumerate(stmt.names):
            name = _dotted_identifier(alias.name)
            if name is None:
                continue
            asname = alias.asname.name if alias.asname else None
            local = identifier(asname.value) if isinstance(asname, cst.Name) else name
            imported.setdefault(local, []).append(Binding(local, f"{module}.{name}", line, stmt, index))


def _dotted_identifier(node: cst.BaseExpression) -> str | None:
    name = dotted_name(node)
    return None if name is None else identifier(name)


def _walk(body, table: ImportTable, rebound: set[str], imported, *, top: bool) -> None:
    for position, stmt in enumerate(body):
        if isinstance(stmt, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            for small in stmt.body:
                if isinstance(small, (cst.Import, cst.ImportFrom)):
                    _record_import(small, stmt, table, imported)
                    if top:
                        table.top_level_imports.append((position, stmt))
                elif isinstance(small, cst.Assign):
                    for target in small.targets:
                        _bind_names(target.target, rebound)
                elif isinstance(small, (cst.AnnAssign, cst.AugAssign)):
                    _bind_names(small.target, rebound)
            continue
        if isinstance(stmt, cst.FunctionDef):
            table.functions.add(identifier(stmt.name.value))
            _bind_names(stmt.name, rebound)
            params = stmt.params
            for param in (*params.posonly_params, *params.params, *params.kwonly_params):
                _bind_names(param.name, rebound)
            for star in (params.star_arg, params.star_kwarg):
                if isinstance(star, cst.Param):
                    _bind_names(star.name, rebound)
        elif isinstance(stmt, cst.ClassDef):
            _bind_names(stmt.name, rebound)
        elif isinstance(stmt, cst.For):
            _bind_names(stmt.target, rebound)
        elif isinstance(stmt, cst.With):
            for item in stmt.items:
                if item.asname is not None:
                    _bind_names(item.asname.name, rebound)
        elif isinstance(stmt, (cst.Try, cst.TryStar)):
            for handler in stmt.handlers:
                if handler.name is not None:
                    _bind_names(handler.name.name, rebound)
        elif isinstance(stmt, cst.Match):
            for case in stmt.cases:
                _bind_captures(case.pattern, rebound)
        # Recurse into every nested block: imports inside functions and try/except count too.
        for child in _blocks(stmt):
            _walk(child, table, rebound, imported, top=False)


def _bind_captures(pattern: cst.CSTNode, rebound: set[str]) -> None:
    """The names a match pattern captures (`case [x, *rest]`, `case {**rest}`, `case P() as x`)."""
    for name in (getattr(pattern, "name", None), getattr(pattern, "rest", None)):
        if isinstance(name, cst.Name):
            _bind_names(name, rebound)
    for child in pattern.children:
        _bind_captures(child, rebound)


def _blocks(stmt: cst.BaseCompoundStatement):
    """The statement lists directly nested in a compound statement; a one-line body (`if x: import y`)
    is a list of its suite, which holds small statements as a line does."""
    body = getattr(stmt, "body", None)  # a `match` has cases instead
    if body is not None:
        yield _statements(body)
    orelse = getattr(stmt, "orelse", None)
    if isinstance(orelse, cst.If):  # an `elif`: its body, and the `elif` or `else` after it
        yield from _blocks(orelse)
    elif orelse is not None:
        yield _statements(orelse.body)
    finalbody = getattr(stmt, "finalbody", None)
    if finalbody is not None:
        yield _statements(finalbody.body)
    for handler in getattr(stmt, "handlers", ()):
        yield _statements(handler.body)
    for case in getattr(stmt, "cases", ()):
        yield _statements(case.body)


def _statements(suite: cst.BaseSuite):
    return suite.body if isinstance(suite, cst.IndentedBlock) else (suite,)


# --- edits -------------------------------------------------------------------------------------------


#: `torch.npu` is registered in sys.modules by `import torch_npu`, but its submodules are not: importing
#: `torch.npu.memory` would load a second copy of the module. Import statements name the real package.
def import_path(module: str) -> str:
    if module.startswith("torch.npu."):
        return "torch_npu.npu." + module[len("torch.npu.") :]
    return module


def rebind_import(line: cst.SimpleStatementLine, stmt_index: int, targets: dict[int, str]):
    """Rewrite the aliases `targets` (alias index -> new qualified name) of one import statement.

    The local names stay the same (`from torch.cuda import CUDAGraph` becomes
    `from torch.npu import NPUGraph as CUDAGraph`), so no use site needs to change.
    """
    stmt = line.body[stmt_index]
    if isinstance(stmt, cst.Import):
        names = list(stmt.names)
        for index, qualname in targets.items():
            names[index] = names[index].with_changes(name=dotted_node(import_path(qualname)))
        return line.with_changes(
            body=[*line.body[:stmt_index], stmt.with_changes(names=names), *line.body[stmt_index + 1 :]]
        )

    old_module = dotted_name(stmt.module)
    groups: list[tuple[str, list[cst.ImportAlias]]] = []
    for index, alias in enumerate(stmt.names):
        if index in targets:
            parent, _, name = targets[index].rpartition(".")
            parent = import_path(parent)
            local = alias.asname.name.value if alias.asname else dotted_name(alias.name)
            alias = alias.with_changes(
                name=cst.Name(name),
                asname=None if local == name else cst.AsName(name=cst.Name(local)),
            )
        else:
            parent = old_module
        if groups and groups[-1][0] == parent:
            groups[-1][1].append(alias)
        else:
            groups.append((parent, [alias]))
    new_stmts = []
    for parent, aliases in groups:
        aliases[-1] = aliases[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT) if len(groups) > 1 else aliases[-1]
        new_stmts.append(stmt.with_changes(module=dotted_node(parent), names=aliases))
    # A line of several statements, or a one-line body (`if x: from a import b`), stays one line.
    if len(new_stmts) == 1 or len(line.body) > 1 or isinstance(line, cst.SimpleStatementSuite):
        return line.with_changes(body=[*line.body[:stmt_index], *new_stmts, *line.body[stmt_index + 1 :]])
    lines = [line.with_changes(body=[new_stmts[0]])]
    lines += [cst.SimpleStatementLine(body=[s], trailing_whitespace=line.trailing_whitespace) for s in new_stmts[1:]]
    return cst.FlattenSentinel(lines)


def insertion_index(module: cst.Module) -> int:
    """Where an import may go: after the module docstring and any `from __future__` imports."""
    index = 0
    body = module.body
    if body and isinstance(body[0], cst.SimpleStatementLine) and len(body[0].body) == 1:
        first = body[0].body[0]
        if isinstance(first, cst.Expr) and isinstance(first.value, (cst.SimpleString, cst.ConcatenatedString)):
            index = 1
    while index < len(body):
        stmt = body[index]
        if isinstance(stmt, cst.SimpleStatementLine) and all(
            isinstance(s, cst.ImportFrom) and s.module is not None and dotted_name(s.module) == "__future__"
            for s in stmt.body
        ):
            index += 1
        else:
            break
    return index


def add_module_import(module: cst.Module, name: str, after: int | None) -> cst.Module:
    """Insert `import name` right after top-level statement `after` (the file's first torch import)
    when given, else after the docstring and `__future__` imports. Comments that open the file live in
    `Module.header` and stay first either way."""
    body = list(module.body)
    index = insertion_index(module) if after is None else after + 1
    body.insert(index, cst.parse_statement(f"import {name}\n"))
    return module.with_changes(body=body)
