"""How the portable target spells the accelerator in code (`apply --target portable`).

One place for the spellings, so every rule family writes the same code. A migrated file names the
accelerator once, after its imports (rule NPU001 writes it with the guarded `import torch_npu` it needs):

    ACCELERATOR = "npu" if getattr(torch.accelerator.current_accelerator(), "type", None) == "npu" else "cuda"

"npu" on an Ascend host, and "cuda" on every other host (an NVIDIA one, one without accelerator, one with
Apple MPS or Intel XPU), which is what the original said there: a default is never flipped, code that failed
there without a GPU still fails the same way, and the CPU fallback the original took on an MPS host is still
taken (the tests that decide it ask `ACCELERATOR_MODULE`, torch.cuda there, not torch.accelerator, which
would answer for MPS). Rewrites then read `.to(ACCELERATOR)`, `torch.autocast(ACCELERATOR, ...)`,
`ACCELERATOR if ACCELERATOR_MODULE.is_available() else "cpu"`. Where the file cannot hold the name (torch
imported only inside functions, the name taken, NPU001 not selected) the expression is written in place
instead, in parentheses where it is one side of a device choice; where the file does not import torch or the
torch version cannot say it (2.7+: 2.6's `current_accelerator()` raises on a host without accelerator), the
rule reports instead of rewriting.

What `torch.accelerator` lacks (`manual_seed_all`, `get_device_name`, `empty_cache` that does nothing without
an accelerator) is reached through the accelerator's torch module, named once beside it:

    ACCELERATOR_MODULE = torch.get_device_module(ACCELERATOR)

torch.cuda wherever ACCELERATOR is "cuda" (so `ACCELERATOR_MODULE.X` is the original's `torch.cuda.X` on every
host but an Ascend one), torch.npu on an Ascend host (the npu target's `torch.npu.X`). Where the file cannot
hold the names, `torch.get_device_module(<the type>)` is written in place.
"""

from __future__ import annotations

import libcst as cst

from npu_migrate.engine.context import FileContext
from npu_migrate.program.api import ACCELERATOR_TYPE, DEVICE_MODULE, LEGACY_ACCELERATOR_TYPES, PortableApi
from npu_migrate.program.imports import dotted_name
from npu_migrate.transforms.common.qualnames import module_alias
from npu_migrate.transforms.common.strings import string_value

#: The module-level name of the accelerator's device type in a migrated file.
ACCELERATOR_NAME = "ACCELERATOR"
#: The module-level name of its torch module (torch.cuda, torch.npu), for what torch.accelerator lacks.
MODULE_NAME = "ACCELERATOR_MODULE"
_DEFINITION_COMMENT = '# "npu" on an Ascend host, "cuda" on every other host, as the original said.'
#: The definition split as ruff and black split it, for files narrower than it.
_SPLIT_TYPE = ACCELERATOR_TYPE.replace(" if ", "\n    if ", 1).replace(" else ", "\n    else ", 1)
_MODULE_DEFINITION = f"{MODULE_NAME} = {DEVICE_MODULE}({ACCELERATOR_NAME})"
_MODULE_COMMENT = "# torch.npu or torch.cuda: for what torch.accelerator does not offer."


def portable(ctx: FileContext) -> PortableApi | None:
    """The portable target's API when this run migrates to it, else None (the npu target)."""
    return ctx.api if isinstance(ctx.api, PortableApi) else None


def accelerator_type(ctx: FileContext, enabled: frozenset[str]) -> cst.BaseExpression | None:
    """The current accelerator's device type, as a string: where `.cuda()` moves things and what "cuda"
    meant. None where the file or the torch version cannot say it (the rule reports instead)."""
    api = portable(ctx)
    torch = module_alias(ctx, "torch")
    if api is None or torch is None or api.accelerator_type is None:
        return None
    if can_name(ctx, enabled):
        return cst.Name(ACCELERATOR_NAME)
    return cst.parse_expression(api.accelerator_type.replace("torch.", f"{torch}.", 1))


def is_accelerator_type(node: cst.CSTNode) -> bool:
    """Whether `node` is the accelerator's type as this target writes it in place (`"npu" if getattr(...) ==
    "npu" else "cuda"`): its "cuda" is the original's own value, not a device string left to migrate."""
    return (
        isinstance(node, cst.IfExp)
        and string_value(node.body) == "npu"
        and string_value(node.orelse) == "cuda"
        and "current_accelerator()" in cst.Module(body=[]).code_for_node(node.test)
    )


def accelerator_module(ctx: FileContext, enabled: frozenset[str]) -> cst.BaseExpression | None:
    """The current accelerator's torch module (torch.cuda where the type is "cuda", torch.npu on an Ascend
    host). None where the file or the torch version cannot say it (the rule reports instead)."""
    api = portable(ctx)
    device = accelerator_type(ctx, enabled)
    if api is None or device is None or not api.has(DEVICE_MODULE):
        return None
    if isinstance(device, cst.Name) and (MODULE_NAME not in ctx.text or defines_accelerator_module(ctx.module)):
        return cst.Name(MODULE_NAME)
    torch = module_alias(ctx, "torch")
    return cst.Call(func=cst.parse_expression(f"{torch}.get_device_module"), args=[cst.Arg(device)])


def accelerator_backend(ctx: FileContext, enabled: frozenset[str]) -> cst.BaseExpression | None:
    """The process-group backend of the current accelerator (nccl on CUDA, hccl on the NPU), through the
    file's own name for torch.distributed where it has one (`dist.get_default_backend_for_device(...)`)."""
    api = portable(ctx)
    device = accelerator_type(ctx, enabled)
    if api is None or device is None or not api.has("torch.distributed.get_default_backend_for_device"):
        return None
    distributed = module_alias(ctx, "torch.distributed")
    prefix = distributed if distributed is not None else f"{module_alias(ctx, 'torch')}.distributed"
    return cst.Call(func=cst.parse_expression(f"{prefix}.get_default_backend_for_device"), args=[cst.Arg(device)])


def can_name(ctx: FileContext, enabled: frozenset[str]) -> bool:
    """Whether the file has, or can be given, the module-level `ACCELERATOR`: torch imported at module level
    as `torch`, NPU001 (which writes the name) selected, and the name not the program's own."""
    if "NPU001" not in enabled or top_level_torch(ctx.module) is None:
        return False
    return ACCELERATOR_NAME not in ctx.text or defines_accelerator(ctx.module)


def top_level_torch(module: cst.Module) -> int | None:
    """The index of the first module-level `import torch` (the statement that binds the name `torch`)."""
    for index, stmt in enumerate(module.body):
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Import) and any(
                    (dotted_name(a.name) or "").split(".")[0] == "torch" and a.asname is None for a in small.names
                ):
                    return index
    return None


def definition(width: int) -> cst.SimpleStatementLine:
    """`ACCELERATOR = ...` on one line where it fits in `width` columns, else split over five."""
    code = f"{ACCELERATOR_NAME} = {ACCELERATOR_TYPE}"
    if len(code) > width:
        code = f"{ACCELERATOR_NAME} = (\n    {_SPLIT_TYPE}\n)"
    line = cst.parse_statement(code + "\n")
    comment = cst.EmptyLine(comment=cst.Comment(_DEFINITION_COMMENT))
    blank = cst.EmptyLine()
    return line.with_changes(leading_lines=[blank, comment])


def module_definition() -> cst.SimpleStatementLine:
    line = cst.parse_statement(f"{_MODULE_DEFINITION}\n")
    return line.with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(_MODULE_COMMENT))])


def defines_accelerator(module: cst.Module) -> bool:
    return defined_at(module, ACCELERATOR_NAME) is not None


def defines_accelerator_module(module: cst.Module) -> bool:
    return defined_at(module, MODULE_NAME) is not None


def defined_at(module: cst.Module, name: str) -> int | None:
    """The index of the module-level statement that defines `name` (ACCELERATOR_NAME or MODULE_NAME) as this
    target writes it, if the module has one."""
    return _defined_at(module, _DEFINITIONS[name] + (_LEGACY if name == ACCELERATOR_NAME else ()))


def legacy_definition_at(module: cst.Module) -> int | None:
    """The index of an `ACCELERATOR` definition as an earlier npu-migrate wrote it (the accelerator's own type)."""
    return _defined_at(module, _LEGACY)


_DEFINITIONS = {ACCELERATOR_NAME: (f"{ACCELERATOR_NAME} = {ACCELERATOR_TYPE}",), MODULE_NAME: (_MODULE_DEFINITION,)}
_LEGACY = tuple(f"{ACCELERATOR_NAME} = {legacy}" for legacy in LEGACY_ACCELERATOR_TYPES)


def _defined_at(module: cst.Module, spellings: tuple[str, ...]) -> int | None:
    """The first module-level statement that is one of `spellings`, however it is laid out (one line or split
    in parentheses, as a formatter leaves it)."""
    wanted = {_squeezed(code) for code in spellings} | {
        _squeezed(code.replace(" = ", " = (", 1) + ")") for code in spellings
    }
    return next(
        (
            index
            for index, stmt in enumerate(module.body)
            if isinstance(stmt, cst.SimpleStatementLine)
            and _squeezed(module.code_for_node(stmt.with_changes(leading_lines=[]))) in wanted
        ),
        None,
    )


def _squeezed(code: str) -> str:
    return "".join(code.split())


def names_read(node: cst.CSTNode | None) -> set[str]:
    """Which of `ACCELERATOR` and `ACCELERATOR_MODULE` `node` (a fix's result) reads."""
    if node is None:
        return set()
    found: set[str] = set()

    class _Reads(cst.CSTVisitor):
        def visit_Name(self, name: cst.Name) -> None:
            if name.value in (ACCELERATOR_NAME, MODULE_NAME):
                found.add(name.value)

    node.visit(_Reads())
    return found
