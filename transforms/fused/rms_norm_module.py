"""NPU706: `nn.RMSNorm` modules get a `torch_npu.npu_rms_norm` path on NPU tensors.

An `nn.RMSNorm(...)` construction has no function of the user's to give a branch (NPU701's way): the
module's forward is torch's. So the construction is renamed to a subclass with the same constructor,
parameters and state-dict keys, whose forward has the branch:

    self.norm = nn.RMSNorm(dim, eps=1e-6)  ->  self.norm = _NpuRMSNorm(dim, eps=1e-6)

`_NpuRMSNorm` (templates/fused/rms_norm_module.py.j2) is an `nn.RMSNorm` (`isinstance` checks, weight
initialisation and checkpoints are unchanged) whose forward calls `F.rms_norm` as torch's does, unless the
input is on an NPU and the kernel computes the same: a weight in x's dtype (or none: a gamma of ones), an
explicit eps, 2 to 8 dims. It is scriptable (torch's own forward, written out: TorchScript has no `super()`).
"""

from __future__ import annotations

import libcst as cst

from npu_migrate.engine.rule import EVERY_TARGET, Example, FixSafety, Rule
from npu_migrate.transforms.fused.idiom import Idiom
from npu_migrate.transforms.fused.symbolic import Outcome

HELPER = "fused/rms_norm_module.py.j2"
CLASS = "_NpuRMSNorm"
RMS_NORM = ("torch.nn.RMSNorm", "torch.nn.modules.normalization.RMSNorm", "torch.nn.modules.RMSNorm")

RMS_NORM_MODULE = Rule(
    id="NPU706",
    name="fused-rms-norm-module",
    family="fused",
    summary="`nn.RMSNorm` modules get a guarded `torch_npu.npu_rms_norm` path (an `nn.RMSNorm` subclass)",
    what="""
    Renames every construction `torch.nn.RMSNorm(...)` (however imported) to `_NpuRMSNorm(...)`, a
    subclass of `nn.RMSNorm` with its constructor, parameters and state-dict keys, so `isinstance`
    checks, initialisation and checkpoints are unchanged. Its forward calls
    `torch.nn.functional.rms_norm` as `nn.RMSNorm`'s does, except on an NPU tensor when the kernel
    computes the same: a weight of x's dtype, or none (`elementwise_affine=False`: a gamma of ones, made
    once per shape, dtype and device), an explicit `eps` (the default None means the dtype's machine
    epsilon, left to torch), fp16, bf16 or fp32, 2 to 8 dims. There it returns
    `torch_npu.npu_rms_norm(x, weight, eps)[0]`, which normalises over the weight's dims, the module's
    `normalized_shape`. Subclasses of `nn.RMSNorm` and `isinstance` tests are left
    alone.
    """,
    why="""
    `torch_npu.npu_rms_norm` computes the normalisation and the scaling in one kernel; `nn.RMSNorm` runs
    several operators, each a kernel launch and a trip through device memory.
    """,
    example=Example(
        before="""
            import torch
            from torch import nn


            class Block(nn.Module):
                def __init__(self, dim):
                    super().__init__()
                    self.norm = nn.RMSNorm(dim, eps=1e-6)

                def forward(self, x):
                    return self.norm(x)
        """,
        after="""
            import torch
            from torch import nn


            # ... fused-op helpers npu-migrate adds here: import torch_npu (guarded), _is_npu, _npu_rms_norm, _NpuRMSNorm, _npu_rms_norm_unweighted


            class Block(nn.Module):
                def __init__(self, dim):
                    super().__init__()
                    self.norm = _NpuRMSNorm(dim, eps=1e-6)

                def forward(self, x):
                    return self.norm(x)
        """,
    ),
    fix_safety=FixSafety.NEEDS_REVIEW,
    review="""
    The fused kernel computes the same function, not the same bits (it rounds once, in fp32). Off an NPU
    nothing changes. The module's class is now `_NpuRMSNorm`: code that compares `type(m) is nn.RMSNorm`
    (rather than `isinstance`) sees the difference.
    """,
    tags=frozenset({"fused"}),
    needs_torch_npu=False,
    targets=EVERY_TARGET,
)


def match_call(name: str, api, names=None, call=None, guards=()) -> Outcome:
    if api is not None and "npu_rms_norm" not in api.fused_ops:
        return Outcome(
            RMS_NORM_MODULE,
            f"nn.RMSNorm not fused: torch_npu {api.version} has no npu_rms_norm",
            remedy="nothing in the code can: target a torch_npu that has it (--torch-npu-version)",
        )
    return Outcome(
        RMS_NORM_MODULE,
        f"nn.RMSNorm built as `{CLASS}`, an nn.RMSNorm whose forward runs torch_npu's npu_rms_norm on NPU tensors "
        "(with an explicit eps, and a weight of the input's dtype or none); elsewhere nn.RMSNorm's own forward",
        template=HELPER,
        helpers=(HELPER,),
    )


def wrap(call: cst.Call) -> cst.Call:
    """`nn.RMSNorm(args)` -> `_NpuRMSNorm(args)`: the subclass takes the same arguments."""
    return call.with_changes(func=cst.Name(CLASS))


IDIOM = Idiom(
    rule=RMS_NORM_MODULE,
    markers=("RMSNorm",),
    identifiers=("RMSNorm",),
    kernels=("npu_rms_norm",),
    match=lambda fn: None,  # constructions only
    helpers={HELPER: CLASS},
    calls=RMS_NORM,
    match_call=match_call,
    wrap_call=wrap,
)
