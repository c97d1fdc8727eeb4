"""Module-level imports of a package an NPU host lacks, made conditional where the wrapped calls are all
that reads them.

`from flash_attn import flash_attn_func` at module level stops an Ascend host at import, before any
wrapped call could take the NPU path. When every name the statement binds is read only as the function of
a call an idiom wrapped (`_npu_flash_attn_func(flash_attn_func, ...)`, which calls it only off the NPU),
the statement becomes

    try:
        from flash_attn import flash_attn_func
    except ImportError:  # no flash_attn (an NPU host): the calls take the NPU path
        flash_attn_func = None

and a CUDA host imports exactly what it did. Otherwise the import stays and is reported with the use
that keeps it: on an NPU host that module does not import.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

import libcst as cst


@dataclass(frozen=True)
class Decision:
    statement: ast.ImportFrom
    message: str
    fix: object = None  # a libcst fix of the statement's line, when it is made conditional


def decide(tree: ast.Module, package: str, wrapped: list[ast.Call], one_line) -> Iterator[Decision]:
    """For each module-level `from <package>[.x] import ...` of a file whose calls `wrapped` were wrapped
    (with the original function as their first argument): made conditional, or why not. `one_line(stmt)`:
    whether the statement is alone on its line(s)."""
    funcs = {id(call.func) for call in wrapped}
    loads: dict[str, list[ast.Name]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            loads.setdefault(node.id, []).append(node)
    roots = {_root(call.func) for call in wrapped}
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            bound = {(alias.asname or alias.name).split(".")[0] for alias in stmt.names if _of(alias.name, package)}
            if bound & roots:
                yield Decision(
                    stmt,
                    f"`import {', '.join(alias.name for alias in stmt.names)}` left unconditional: the wrapped calls "
                    f"read their function from the module, which a fallback of None cannot serve; on an NPU host "
                    f"({package} does not install there) this module does not import: import the functions by name "
                    f"(`from {package} import ...`) and run again",
                )
            continue
        if not (
            isinstance(stmt, ast.ImportFrom)
            and stmt.level == 0
            and stmt.module is not None
            and _of(stmt.module, package)
        ):
            continue
        bound = [alias.asname or alias.name for alias in stmt.names]
        if "*" in bound:
            continue
        imported = f"`from {stmt.module} import {', '.join(alias.name for alias in stmt.names)}`"
        others = [node for name in bound for node in loads.get(name, ()) if id(node) not in funcs]
        if not any(id(node) in funcs for name in bound for node in loads.get(name, ())):
            continue  # the import is about other calls: the finding of the package itself covers it
        if others:
            use = others[0]
            yield Decision(
                stmt,
                f"{imported} left unconditional: line {use.lineno} uses `{use.id}` other than in a wrapped call; "
                f"on an NPU host ({package} does not install there) this module does not import: make the import "
                "conditional and give that use a fallback",
            )
        elif not one_line(stmt):
            yield Decision(stmt, f"{imported} left unconditional: it shares its line with other statements")
        else:
            yield Decision(
                stmt,
                f"{imported} made conditional: {package} does not install on an NPU host, where the wrapped calls "
                "take torch_npu's kernel",
                fix=_conditional(package, bound),
            )


def _of(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _conditional(package: str, names: list[str]):
    def fix(updated: cst.SimpleStatementLine) -> cst.Try:
        line = cst.Module([]).code_for_node(updated.with_changes(leading_lines=[]))
        code = (
            "try:\n"
            + "".join(f"    {text}\n" if text.strip() else "\n" for text in line.rstrip("\n").split("\n"))
            + f"except ImportError:  # no {package} (an NPU host): the calls take the NPU path\n"
            + f"    {' = '.join(names)} = None\n"
        )
        return cst.parse_statement(code).with_changes(leading_lines=updated.leading_lines)

    return fix
