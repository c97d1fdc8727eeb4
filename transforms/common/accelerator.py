"""How the portable target spells the accelerator in code (`apply --target portable`).

One place for the spellings, so every rule family writes the same code: the device type
(`getattr(torch.accelerator.current_accelerator(), "type", "cuda")`, which keeps "cuda" on a host without
accelerator, as the original had it), the device (`torch.accelerator.current_accelerator()`), and the
process-group backend for it. Each is written through the name the file imports torch as, and is None
where the file does not import torch itself or the chosen torch version lacks what it needs: the rule
then reports instead of rewriting.
"""

from __future__ import annotations

import libcst as cst

from npu_migrate.api import GUARDED_ACCELERATOR_TYPE, PortableApi
from npu_migrate.context import FileContext
from npu_migrate.transforms.common.qualnames import module_alias


def portable(ctx: FileContext) -> PortableApi | None:
    """The portable target's API when this run migrates to it, else None (the npu target)."""
    return ctx.api if isinstance(ctx.api, PortableApi) else None


def _spelled(ctx: FileContext, code: str | None) -> cst.BaseExpression | None:
    torch = module_alias(ctx, "torch")
    if code is None or torch is None:
        return None
    expression = cst.parse_expression(code)
    if torch == "torch":
        return expression
    # `import torch as th`: the same code through the file's own name for torch.
    return expression.visit(_RenameTorch(torch))


class _RenameTorch(cst.CSTTransformer):
    def __init__(self, name: str) -> None:
        self.name = name

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        return updated_node.with_changes(value=self.name) if updated_node.value == "torch" else updated_node


def accelerator_type(ctx: FileContext, *, guarded: bool = False) -> cst.BaseExpression | None:
    """The current accelerator's device type; `guarded`: the code runs only where one is available."""
    api = portable(ctx)
    if api is None or not api.has("torch.accelerator.current_accelerator"):
        return None
    return _spelled(ctx, GUARDED_ACCELERATOR_TYPE if guarded else api.accelerator_type)


def accelerator_device(ctx: FileContext) -> cst.BaseExpression | None:
    """The current accelerator as a `torch.device` (where `.cuda()` moved things)."""
    api = portable(ctx)
    if api is None or not api.has("torch.accelerator.current_accelerator"):
        return None
    return _spelled(ctx, "torch.accelerator.current_accelerator()")


def accelerator_backend(ctx: FileContext) -> cst.BaseExpression | None:
    """The process-group backend of the current accelerator (nccl on CUDA, hccl on the NPU), through the
    file's own name for torch.distributed where it has one (`dist.get_default_backend_for_device(...)`)."""
    api = portable(ctx)
    device = accelerator_device(ctx)
    if api is None or device is None or not api.has("torch.distributed.get_default_backend_for_device"):
        return None
    distributed = module_alias(ctx, "torch.distributed")
    func = (
        cst.parse_expression(f"{distributed}.get_default_backend_for_device")
        if distributed is not None
        else _spelled(ctx, "torch.distributed.get_default_backend_for_device")
    )
    return cst.Call(func=func, args=[cst.Arg(device)])
