"""Qualified names (`torch.cuda.amp.autocast`) and the expressions a file reaches them through."""

from __future__ import annotations

import libcst as cst

from npu_migrate.engine.context import FileContext


def is_under(qualname: str | None, module: str) -> bool:
    """Whether `qualname` is `module` or a name inside it: `torch.cudart` is not under `torch.cuda`."""
    return qualname is not None and (qualname == module or qualname.startswith(module + "."))


def with_tail(expr: cst.BaseExpression, tail: list[str]) -> cst.BaseExpression:
    """The root name of the chain `expr` followed by the names `tail` (`torch.cuda.x`, [amp, y] -> `torch.amp.y`)."""
    while isinstance(expr, cst.Attribute):
        expr = expr.value
    for name in tail:
        expr = cst.Attribute(value=expr, attr=cst.Name(name))
    return expr


def torch_npu_root(ctx: FileContext, enabled: frozenset[str]) -> str | None:
    """The name through which code in this file can reach `torch_npu`, or None when nothing binds it.

    Rule NPU001 adds `import torch_npu` to every changed file that imports torch and lacks it, so the plain
    name is safe when that rule runs; a file that imports torch_npu only as `from torch_npu import x`
    gets no such import and must be edited by hand.
    """
    alias = module_alias(ctx, "torch_npu")
    if alias is not None:
        return alias
    imports = ctx.imports
    if (
        "NPU001" in enabled
        and imports.uses_torch
        and not imports.imports_torch_npu
        and "torch_npu" not in imports.shadowed
    ):
        return "torch_npu"
    return None


def module_alias(ctx: FileContext, module: str) -> str | None:
    """The local name under which the file imports `module` itself (`import torch as th` -> "th")."""
    for local, binding in ctx.imports.bindings.items():
        if binding.qualname == module and not binding.is_from_import and "." not in local:
            return local
    return None
