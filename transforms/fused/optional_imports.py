"""Imports of a package an NPU host lacks (flash_attn): made conditional where the wrapped calls are all that
reads them, reported wherever else an NPU host would run them.

`from flash_attn import flash_attn_func` stops an Ascend host at import (at module level), or at the call of
the function that holds it, before any wrapped call could take the NPU path. When every name the statement
binds is read, in the scope it binds them in, only as the function of a call an idiom wrapped
(`_npu_flash_attn_func(flash_attn_func, ...)`, which calls it only off the NPU) or by a test of whether it is
there (`if flash_attn_func is not None:`), the statement becomes

    try:
        from flash_attn import flash_attn_func
    except ImportError:
        import importlib.util

        if importlib.util.find_spec("torch_npu") is None:
            raise  # not an Ascend host: the original's error
        flash_attn_func = None  # the calls take torch_npu's kernel

and a CUDA host imports exactly what it did; a host with neither package fails as the original did (a
caller's `except ImportError:` fallback still runs there). `import flash_attn` read only by wrapped calls
through the module (and tests of it) is made conditional the same way, its calls passing `flash_attn and
flash_attn.<function>` (`Decision.modules`). Every other import of the package (any
submodule, `import flash_attn` read otherwise, inside a function or not) that an NPU host can run is reported, once per
statement, with what to do: the package table's advice for what it imports (`third_party.toml`). An
import an NPU host never runs is left alone: in the body of a `try` whose handler catches ImportError
without raising again (and its `else`, where the body imports the package), under `contextlib.suppress(ImportError)`, on the side of an `if` an NPU host does
not take (a test
of the package's presence: `is_flash_attn_2_available()`, `importlib.util.find_spec("flash_attn")`, a flag
a try-import or such a test sets, a name a try-import binds, `TYPE_CHECKING`, a test of CUDA; the `else`
of a test for torch_npu: `is_torch_npu_available()`), or after an `if` an NPU host takes that returns or
raises. The tests are read after the libcst rules ran: a test of CUDA still there is one the guard rules
kept (`torch.cuda.is_available()` is False on an NPU host, where torch is a CPU build), a migrated one
reads `torch.npu.is_available()`.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import libcst as cst

from npu_migrate.program.api import cuda_package, package_table
from npu_migrate.program.imports import IMPORT_ERRORS

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)
#: The exceptions a failed import raises, or a base of them: a handler of one of these survives it.
_EXITS = (ast.Return, ast.Raise, ast.Continue, ast.Break)


@dataclass(frozen=True)
class Decision:
    statement: ast.Import | ast.ImportFrom
    message: str
    fix: object = None  # a libcst fix of the statement's line, when it is made conditional
    #: Module names the conditional import binds None where the package is absent (`import flash_attn`):
    #: the wrapped calls that read their function from one must not, there (`flash_attn and flash_attn.f`).
    modules: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Site:
    """An import of the package an NPU host can run: the scope it binds its names in, and the tests of
    the enclosing `if`s that do not test the package's presence (a config switch, a CUDA test)."""

    statement: ast.Import | ast.ImportFrom
    scope: ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    conditions: tuple[ast.expr, ...]


def decide(
    tree: ast.Module,
    package: str,
    wrapped: list[ast.Call],
    one_line: Callable[[ast.stmt], bool],
    deferred: list[ast.expr] = (),
) -> Iterator[Decision]:
    """For each import of `package` (or a submodule) an NPU host can run, in a file whose calls `wrapped`
    were wrapped (with the original function as their first argument): made conditional, or why not and
    what to do. `one_line(stmt)`: whether the statement is alone on its line(s). `deferred`: parts of the
    wrapped calls' arguments the rewrite evaluates only where the original function runs (xformers'
    `xops.LowerTriangularMask`, behind a lambda): the names they read count as the wrapped calls' own."""
    funcs = {id(call.func) for call in wrapped}
    funcs |= {id(node) for part in deferred for node in ast.walk(part) if isinstance(node, ast.Name)}
    # The module names the wrapped calls read their function through (`flash_attn` in
    # `flash_attn.flash_attn_varlen_func(...)`), by node.
    modules = {id(root) for call in wrapped if (root := _root_name(call.func)) is not None and root is not call.func}
    for site in _sites(tree, package, _flags(tree, package)):
        yield _decision(site, package, funcs | modules, {_root(call.func) for call in wrapped}, one_line)


def _names(stmt: ast.Import | ast.ImportFrom) -> str:
    """The names as the statement spells them (`memory_efficient_attention as mea`): a finding quoting
    `import xformers.ops` and then naming `xops` would not read as the line it points at."""
    return ", ".join(f"{a.name} as {a.asname}" if a.asname else a.name for a in stmt.names)


def _decision(site: _Site, package: str, funcs: set[int], roots: set, one_line) -> Decision:
    stmt, scope = site.statement, site.scope
    if isinstance(stmt, ast.Import):
        imported = f"`import {_names(stmt)}`"
        bound = {(alias.asname or alias.name).split(".")[0] for alias in stmt.names if _of(alias.name, package)}
        if not bound & roots:
            return Decision(stmt, _reported(site, imported, [alias.name for alias in stmt.names], package))
        # `import flash_attn` read only by the wrapped calls (`flash_attn.flash_attn_varlen_func(...)`) and
        # tests of it: made conditional with a fallback of None, and the calls pass their function as
        # `flash_attn and flash_attn.flash_attn_varlen_func`, which is the function wherever the module
        # imported and None on an NPU host, where the wrapper does not call it.
        why = _why_kept(site, imported, bound, funcs, package, one_line)
        if why is not None or len(bound) != len(stmt.names):
            why = why or (
                f"{imported} left {_kept(site)}: it imports more than {package}; {_consequence(site, package)}: "
                "put the import of the package on a line of its own and run again"
            )
            return Decision(stmt, why)
        return Decision(
            stmt,
            f"{imported} made conditional: {package} does not install on an NPU host, where the wrapped calls take "
            "torch_npu's kernel (they read their function as `module and module.function`, None there)",
            fix=_conditional(package, sorted(bound)),
            modules=tuple(sorted(bound)),
        )
    imported = f"`from {stmt.module} import {_names(stmt)}`"
    bound = [alias.asname or alias.name for alias in stmt.names]
    loads = [node for node in ast.walk(scope) if isinstance(node, ast.Name) and node.id in bound]
    if "*" in bound or isinstance(scope, ast.ClassDef) or not any(id(node) in funcs for node in loads):
        # Not the wrapped calls' import (nor one a fallback could be given in): what it imports needs a port.
        return Decision(stmt, _reported(site, imported, [f"{stmt.module}.{a.name}" for a in stmt.names], package))
    why = _why_kept(site, imported, set(bound), funcs, package, one_line)
    if why is not None:
        return Decision(stmt, why)
    return Decision(
        stmt,
        f"{imported} made conditional: {package} does not install on an NPU host, where the wrapped calls take "
        "torch_npu's kernel",
        fix=_conditional(package, bound),
        # `from xformers.ops import fmha` read by `fmha.memory_efficient_attention(...)`: None there too.
        modules=tuple(sorted(set(bound) & roots)),
    )


def _why_kept(site: _Site, imported: str, bound: set[str], funcs: set[int], package: str, one_line) -> str | None:
    """Why an import the wrapped calls read cannot be made conditional (None where it can): a name it binds is
    read otherwise than by them or a test of it, bound by `global`, or the import shares its line."""
    stmt, scope = site.statement, site.scope
    if isinstance(scope, ast.ClassDef):
        return f"{imported} left {_kept(site)}: it binds class attributes; {_consequence(site, package)}"
    loads = [node for node in ast.walk(scope) if isinstance(node, ast.Name) and node.id in bound]
    if isinstance(scope, _DEFS) and any(
        name in bound for node in ast.walk(scope) if isinstance(node, (ast.Global, ast.Nonlocal)) for name in node.names
    ):
        return (
            f"{imported} left {_kept(site)}: a `global` or `nonlocal` statement binds its names outside "
            f"`{scope.name}()`; {_consequence(site, package)}: make the import conditional"
        )
    tested = {id(node) for node in _tested_names(scope)}
    others = [node for node in loads if id(node) not in funcs and id(node) not in tested]
    if others:
        use = others[0]
        return (
            f"{imported} left {_kept(site)}: line {use.lineno} uses `{use.id}` other than in a wrapped call or a test of it; "
            f"{_consequence(site, package)}: make the import conditional and give that use a fallback"
        )
    if not one_line(stmt):
        return (
            f"{imported} left {_kept(site)}: it shares its line with other statements; "
            f"{_consequence(site, package)}: put it on a line of its own and run again"
        )
    return None


def _kept(site: _Site) -> str:
    return "as is" if site.conditions else "unconditional"


def _consequence(site: _Site, package: str) -> str:
    """What the import does on an NPU host."""
    if site.conditions:
        test = ast.unparse(site.conditions[-1])
        what = f"it raises ImportError wherever it is reached (`{test}` does not test for it)"
    elif isinstance(site.scope, _DEFS):
        what = f"`{site.scope.name}()` raises ImportError"
    else:
        what = "this module does not import"
    return f"on an NPU host ({package} does not install there) {what}"


def _reported(site: _Site, imported: str, names: list[str], package: str) -> str:
    """An import no wrapped call reads: what to do, by the package table's advice for what it imports."""
    table = package_table()
    advice = dict.fromkeys(hit[1]["advice"] for name in names if (hit := cuda_package(name, table)) is not None)
    todo = " ".join(advice) or "make the import conditional (`try: ... except ImportError:`)"
    return f"{imported} left {_kept(site)}: {_consequence(site, package)}. {todo}"


# -- where an NPU host runs an import -----------------------------------------------------------------------


def _sites(tree: ast.Module, package: str, flags: dict[str, int]) -> Iterator[_Site]:
    """The imports of `package` an NPU host can run, with their scope."""

    def block(stmts: list[ast.stmt], scope, conditions: tuple[ast.expr, ...]) -> Iterator[_Site]:
        for stmt in stmts:
            if isinstance(stmt, ast.Import) and any(_of(alias.name, package) for alias in stmt.names):
                yield _Site(stmt, scope, conditions)
            elif isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module and _of(stmt.module, package):
                yield _Site(stmt, scope, conditions)
            elif isinstance(stmt, (*_DEFS, ast.ClassDef)):
                yield from block(stmt.body, stmt, conditions)
            elif isinstance(stmt, (ast.Try, ast.TryStar)):
                caught = any(_survives_import_error(handler) for handler in stmt.handlers)
                if not caught:
                    yield from block(stmt.body, scope, conditions)
                # The `else` runs where the body imported: never on an NPU host if that was the package.
                if not caught or not any(_imports(s, package) for s in stmt.body):
                    yield from block(stmt.orelse, scope, conditions)
                for handler in stmt.handlers:
                    yield from block(handler.body, scope, conditions)
                yield from block(stmt.finalbody, scope, conditions)
            elif isinstance(stmt, ast.If):
                value = _on_npu_host(stmt.test, flags, package)
                unknown = (*conditions, stmt.test) if value == 0 else conditions
                if value >= 0:
                    yield from block(stmt.body, scope, unknown)
                if value <= 0:
                    yield from block(stmt.orelse, scope, unknown)
                if value > 0 and stmt.body and isinstance(stmt.body[-1], _EXITS) and not stmt.orelse:
                    return  # an NPU host leaves the block there
            elif isinstance(stmt, (ast.With, ast.AsyncWith)) and any(_suppresses(item) for item in stmt.items):
                continue
            else:
                nested = [getattr(stmt, name, None) for name in ("body", "orelse")]
                nested += [case.body for case in getattr(stmt, "cases", ())]
                for body in nested:
                    if isinstance(body, list):
                        yield from block(body, scope, conditions)

    yield from block(tree.body, tree, ())


def _survives_import_error(handler: ast.ExceptHandler) -> bool:
    """Whether the handler catches a failed import and goes on (it does not end by raising)."""
    if handler.body and isinstance(handler.body[-1], ast.Raise):
        return False
    if handler.type is None:
        return True
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(_last_name(t) in IMPORT_ERRORS for t in types)


def _suppresses(item: ast.withitem) -> bool:
    """`with contextlib.suppress(ImportError):`."""
    call = item.context_expr
    return (
        isinstance(call, ast.Call)
        and _last_name(call.func) == "suppress"
        and any(_last_name(arg) in IMPORT_ERRORS for arg in call.args)
    )


def _on_npu_host(test: ast.expr, flags: dict[str, int], package: str) -> int:
    """-1 where `test` is False on an NPU host (it tests the package's presence), 1 where it is True there (it
    tests for torch_npu: `is_torch_npu_available()`), 0 where it tells nothing about it."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return -_on_npu_host(test.operand, flags, package)
    if isinstance(test, ast.BoolOp):
        found = [_on_npu_host(value, flags, package) for value in test.values]
        # One False operand makes `and` False, one True operand makes `or` True; otherwise all must agree.
        decisive = -1 if isinstance(test.op, ast.And) else 1
        return decisive if decisive in found else -decisive if all(value == -decisive for value in found) else 0
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, right = test.left, test.comparators[0]
        if isinstance(left, ast.Attribute) and left.attr == "type" and _is_constant(right, "cuda"):  # x.device.type
            return -1 if isinstance(test.ops[0], ast.Eq) else 1 if isinstance(test.ops[0], ast.NotEq) else 0
        other = right if _is_constant(left, None) else left if _is_constant(right, None) else None
        if other is None:
            return 0
        if isinstance(test.ops[0], (ast.IsNot, ast.NotEq)):
            return _on_npu_host(other, flags, package)
        return -_on_npu_host(other, flags, package) if isinstance(test.ops[0], (ast.Is, ast.Eq)) else 0
    if isinstance(test, ast.Call):
        callee = ast.unparse(test.func).lower()
        name = (_last_name(test.func) or "").lower()
        if "available" in name and ("npu" in callee or "accelerator" in callee):
            return 1
        if "available" in name and "cuda" in callee:
            return -1  # torch is a CPU build on an NPU host
        named = name.startswith(("is_", "_is_", "has_", "_has_")) and package.split("_")[0] in name
        return -1 if named or _names_package(test, package) else 0
    if _last_name(test) in ("TYPE_CHECKING", "is_cuda"):
        return -1
    return flags.get(test.id, 0) if isinstance(test, ast.Name) else 0


def _names_package(call: ast.Call, package: str) -> bool:
    return any(
        isinstance(arg, ast.Constant) and isinstance(arg.value, str) and _of(arg.value.replace("-", "_"), package)
        for arg in [*call.args, *(keyword.value for keyword in call.keywords)]
    )


def _flags(tree: ast.Module, package: str) -> dict[str, int]:
    """Names whose value on an NPU host is known (`_on_npu_host`): bound in the body or the handlers of a
    `try` that imports the package (`HAS_FLASH = True` / `False`, `flash_attn_func = None`: False there), or
    assigned from a test of the package's presence or of torch_npu's, and never bound otherwise."""
    known: dict[int, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Try, ast.TryStar)) and any(_imports(s, package) for s in node.body):
            for part in [*node.body, *(s for handler in node.handlers for s in handler.body)]:
                known.update((id(target), -1) for target in ast.walk(part) if isinstance(target, ast.Name))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            value = _on_npu_host(node.value, {}, package)
            if value:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                known.update((id(target), value) for target in targets)
    names: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            value = known.get(id(node), 0)
            names[node.id] = value if names.get(node.id, value) == value else 0
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                name = (alias.asname or alias.name).split(".")[0]
                value = -1 if _imports_in_try(node, tree, package) else 0
                names[name] = value if names.get(name, value) == value else 0
    return {name: value for name, value in names.items() if value}


def _imports(stmt: ast.stmt, package: str) -> bool:
    if isinstance(stmt, ast.Import):
        return any(_of(alias.name, package) for alias in stmt.names)
    return isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and bool(stmt.module) and _of(stmt.module, package)


def _imports_in_try(node: ast.stmt, tree: ast.Module, package: str) -> bool:
    """Whether `node` imports the package in the body of a `try` that catches a failed import."""
    if not _imports(node, package):
        return False
    return any(
        isinstance(parent, (ast.Try, ast.TryStar))
        and any(_survives_import_error(handler) for handler in parent.handlers)
        and any(child is node for stmt in parent.body for child in ast.walk(stmt))
        for parent in ast.walk(tree)
    )


def _tested_names(scope: ast.AST) -> Iterator[ast.Name]:
    """The names read only to test them: `if f:`, `f is not None`, `not f`, in a test or a boolean operation."""

    def tested(test: ast.expr) -> Iterator[ast.Name]:
        if isinstance(test, ast.Name):
            yield test
        elif isinstance(test, ast.BoolOp):
            for value in test.values:
                yield from tested(value)
        elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            yield from tested(test.operand)
        elif isinstance(test, ast.Compare) and len(test.ops) == 1:
            if isinstance(test.ops[0], (ast.Is, ast.IsNot, ast.Eq, ast.NotEq)):
                if _is_constant(test.comparators[0], None):
                    yield from tested(test.left)
                elif _is_constant(test.left, None):
                    yield from tested(test.comparators[0])

    for node in ast.walk(scope):
        if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            yield from tested(node.test)
        elif isinstance(node, ast.comprehension):
            for condition in node.ifs:
                yield from tested(condition)


def _is_constant(node: ast.expr, value) -> bool:
    return isinstance(node, ast.Constant) and node.value == value and type(node.value) is type(value)


def _last_name(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else None


def _of(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _root_name(node: ast.expr) -> ast.Name | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node if isinstance(node, ast.Name) else None


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _fallback(names: list[str]) -> str:
    """`a = b = None` with why, the comment on its own line where the line would pass PEP 8's width."""
    assignment, why = f"{' = '.join(names)} = None", "# the calls take torch_npu's kernel"
    if len(f"    {assignment}  {why}") > 79:
        return f"    {why}\n    {assignment}\n"
    return f"    {assignment}  {why}\n"


def _conditional(package: str, names: list[str]):
    def fix(updated: cst.SimpleStatementLine) -> cst.Try:
        line = cst.Module([]).code_for_node(updated.with_changes(leading_lines=[]))
        code = (
            "try:\n"
            + "".join(f"    {text}\n" if text.strip() else "\n" for text in line.rstrip("\n").split("\n"))
            + "except ImportError:\n"
            + "    import importlib.util\n\n"
            + '    if importlib.util.find_spec("torch_npu") is None:\n'
            + "        raise  # not an Ascend host: the original's error\n"
            + _fallback(names)
        )
        return cst.parse_statement(code).with_changes(leading_lines=updated.leading_lines)

    return fix
