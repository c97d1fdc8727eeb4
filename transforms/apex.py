"""NVIDIA apex on an NPU: what Ascend's apex build keeps, what it adds, and what it lacks.

Ascend publishes apex for the NPU as a patch of NVIDIA apex ("Apex-patch", gitee/GitCode Ascend/apex,
README "特性及接口介绍"; built for torch 1.11 to 2.4): `apex.amp.initialize` and `amp.scale_loss` keep working
(O1 / O2, static and dynamic loss scale), `initialize` gains `combine_grad` (gradient fusion for the
unscale, default None) and `combine_ddp`, and `apex.optimizers` gains the `NpuFused*` optimizers
(`NpuFusedSGD`, `NpuFusedAdam`, `NpuFusedAdamW`, `NpuFusedLamb`, ...), which torch_npu also ships as
`torch_npu.optim.NpuFused*` (NPU411). The README's constraints: the combined tensors take their size in
device memory again, and share memory with the original tensors, so re-allocating either one breaks
training ("可以引起精度异常"). NVIDIA's CUDA-only fused classes (`apex.optimizers.FusedAdam`, `FusedLAMB`,
`FusedSGD`, `apex.normalization.FusedLayerNorm`, `FusedRMSNorm`) need apex's CUDA extensions.

Nothing is rewritten: `combine_grad` needs the same care as the fused optimizers, and each fused class has
a counterpart the finding names.
"""

from __future__ import annotations

import libcst as cst

from npu_migrate.engine.astindex import name_sets, words_may_name
from npu_migrate.engine.checkers import Checker
from npu_migrate.engine.rule import Example, FixSafety, Rule
from npu_migrate.findings import Severity
from npu_migrate.transforms.common.arguments import keyword

COMBINE_GRAD = Rule(
    id="NPU421",
    name="apex-combine-grad",
    family="apex",
    summary="`apex.amp.initialize` without `combine_grad` is reported: Ascend's apex can fuse the gradients",
    what="""
    Reports `apex.amp.initialize(...)` calls that do not pass `combine_grad`. `amp.initialize` and
    `amp.scale_loss` themselves work on an NPU with Ascend's apex build and are left as they are.
    """,
    why="""
    Ascend's apex adds `combine_grad=True` to `amp.initialize`: the gradients are combined into one
    tensor, so the loss-scale unscale and overflow check run once instead of once per gradient, as
    Ascend's ModelZoo ports do. Its README's constraints are why it is not written for you: the combined
    tensor takes the gradients' size in device memory again, and a gradient or parameter re-allocated
    afterwards (`model.zero_grad()` setting gradients to None, `.cpu()`) silently breaks the sharing.
    """,
    example=Example(
        before="""
            import torch
            from apex import amp

            model = torch.nn.Linear(4, 2).npu()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
        """,
        reports="combine_grad=True",
    ),
    valid=(
        """
        from apex import amp

        model, optimizer = amp.initialize(model, optimizer, opt_level="O2", combine_grad=True)
        """,
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    tags=frozenset({"lever"}),
)

FUSED_CLASSES = Rule(
    id="NPU422",
    name="apex-cuda-fused-classes",
    family="apex",
    summary="apex's CUDA fused optimizers and norms are reported with their NPU counterparts",
    what="""
    Reports `apex.optimizers.FusedAdam`, `FusedLAMB`, `FusedSGD`, `FusedNovoGrad` and
    `apex.normalization.FusedLayerNorm`, `FusedRMSNorm` (calls, and imports of them), naming the NPU
    counterpart and the package that provides it.
    """,
    why="""
    They run on apex's CUDA extensions, which an NPU host does not have; Ascend's apex build provides the
    `NpuFused*` optimizers instead, torch_npu provides them as `torch_npu.optim.NpuFused*`, and torch's own
    `LayerNorm` / `RMSNorm` compute what the apex norms compute.
    """,
    example=Example(
        before="""
            from apex.optimizers import FusedAdam

            optimizer = FusedAdam(model.parameters(), lr=1e-3)
        """,
        reports="torch_npu.optim.NpuFusedAdamW",
    ),
    valid=(
        """
        from apex.optimizers import NpuFusedAdamW

        optimizer = NpuFusedAdamW(model.parameters(), lr=1e-3)
        """,
    ),
    fix_safety=FixSafety.REPORT_ONLY,
    severity=Severity.WARNING,
    tags=frozenset({"lever"}),
)

#: apex's CUDA fused class -> what to use on an NPU.
COUNTERPARTS = {
    "apex.optimizers.FusedAdam": (
        "`torch_npu.optim.NpuFusedAdamW` (or Ascend apex's `apex.optimizers.NpuFusedAdamW`); with "
        "`adam_w_mode=False`, `NpuFusedAdam`. apex's FusedAdam defaults to AdamW's decoupled decay"
    ),
    "apex.optimizers.FusedLAMB": "Ascend apex's `apex.optimizers.NpuFusedLamb` (torch_npu: `torch_npu.optim.NpuFusedLamb`)",
    "apex.optimizers.FusedSGD": "`torch_npu.optim.NpuFusedSGD` (or Ascend apex's `apex.optimizers.NpuFusedSGD`)",
    "apex.optimizers.FusedNovoGrad": "no NPU fused NovoGrad: keep a torch implementation of NovoGrad",
    "apex.normalization.FusedLayerNorm": "`torch.nn.LayerNorm` (same arguments and parameters: weight, bias)",
    "apex.normalization.FusedRMSNorm": "`torch.nn.RMSNorm` (torch 2.4 and newer), then NPU706's fused path",
}
_INITIALIZE = "apex.amp.initialize"
_NAMES = name_sets([_INITIALIZE, *COUNTERPARTS])


class ApexChecker(Checker):
    rules = (COMBINE_GRAD, FUSED_CLASSES)
    markers = ("apex",)

    @classmethod
    def wants_words(cls, words) -> bool:
        return words_may_name(words, _NAMES)

    @classmethod
    def wants(cls, index) -> bool:
        return index.may_name(_NAMES)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.module is None or isinstance(node.names, cst.ImportStar):
            return
        module = self.ctx.code(node.module)
        for alias in node.names:
            qualname = f"{module}.{self.ctx.code(alias.name)}"
            if qualname in COUNTERPARTS:
                self._fused(alias, qualname)

    def visit_Call(self, node: cst.Call) -> None:
        qualname = self.ctx.qualname(node.func)
        if qualname == _INITIALIZE and keyword(node, "combine_grad") is None:
            self.report(
                COMBINE_GRAD,
                node,
                "`amp.initialize` works with Ascend's apex build; it can also fuse the gradients for the unscale "
                "(`combine_grad=True`: one combined tensor, more device memory, and no gradient or parameter may be "
                "re-allocated afterwards)",
            )
        elif qualname in COUNTERPARTS and not isinstance(node.func, cst.Name):
            self._fused(node, qualname)  # through the module (`apex.optimizers.FusedAdam(...)`)

    def _fused(self, node: cst.CSTNode, qualname: str) -> None:
        self.report(
            FUSED_CLASSES,
            node,
            f"`{qualname}` needs apex's CUDA extensions, which an NPU host lacks: use {COUNTERPARTS[qualname]}",
            severity=Severity.WARNING,
            crashes=True,
        )
